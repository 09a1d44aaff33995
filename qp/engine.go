// Package qp is rxego's transport engine: queue pairs and their state
// machine, and the requester, responder and completer that run the
// InfiniBand RC, UC and UD transports over packets, modelled on Linux
// rdma_rxe's split.
//
// # Concurrency model
//
// An Engine owns every QP it serves. All protocol state is guarded by one
// engine lock, taken by whichever goroutine drives the engine: the receive
// loop handing in a batch of packets, an application goroutine posting work
// requests (the requester then runs inline, as rxe runs its requester task
// inline), or the timer goroutine. There are no per-QP locks on the data
// path, and no goroutine hand-off between a post and its packets leaving,
// which is what keeps latency near the UDP floor. Receive queues, SRQs and
// CQs have their own small locks because applications touch them directly.
//
// The engine reads time from a Clock and emits packets through an Output,
// so tests drive the very same code on virtual time with an in-memory
// network and no sleeps.
//
// # Memory visibility
//
// Remote peers write into registered memory from the engine's goroutines.
// An application that reads such memory after learning, by some means the
// Go memory model cannot see (a peer's message over the network), that the
// write happened should call Engine.Sync first; completions polled from a
// CQ already carry the needed ordering.
package qp

import (
	"container/heap"
	"errors"
	"net/netip"
	"sync"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
)

// Clock tells the engine the time, as a duration since any fixed origin.
type Clock interface {
	Now() time.Duration
}

// OutPacket is a packet the engine wants sent.
type OutPacket struct {
	Buf  []byte // BTH through ICRC; the ICRC bytes are left for the transport
	Dest netip.AddrPort
	TOS  uint8
}

// Output sends packets. The engine reuses each Buf once Emit returns.
type Output interface {
	Emit(pkts []OutPacket)
}

// InPacket is a received packet handed to the engine.
type InPacket struct {
	Pkt  bth.Packet
	Src  netip.AddrPort
	TOS  uint8
	Dest netip.Addr // the local address it was sent to (for UD GRH)
}

// Config configures an Engine.
type Config struct {
	Local netip.Addr // this device's GID, as an IP address
	Port  uint16     // UDP port peers reach this device on (4791)
	Clock Clock
	Out   Output
	MRs   *mr.Table
	// Window is the most PSNs a QP keeps unacknowledged (rxe: 128).
	Window int
	// DataTOS is the IP TOS of data packets (DSCP<<2 | ECN).
	DataTOS uint8
	// AckEvery makes the requester set AckReq at least every this many
	// packets inside long messages, as rxe does every 64 (0: that default).
	AckEvery int
	// Congestion configures DCQCN; nil means on, with NVIDIA's defaults.
	Congestion *CongestionConfig
}

// DefaultWindow is the default number of unacknowledged PSNs per QP.
const DefaultWindow = 256

// MaxPacket is the largest RoCE packet the engine builds: a 4096-byte
// payload plus the longest header set and the ICRC.
const MaxPacket = 4096 + 64

const outBatch = 64

// Engine runs the transport for a set of QPs. See the package comment.
type Engine struct {
	mu  sync.Mutex
	cfg Config

	qps     map[uint32]*QP
	nextQPN uint32

	outq []OutPacket
	free [][]byte

	cc       CongestionConfig
	timers   timerHeap
	ackList  []*QP
	wakeFunc func(at time.Duration)

	// Stats are the engine's counters, readable at any time.
	Stats Counters
}

// ErrClosed is returned by operations on a destroyed QP or a closed engine.
var ErrClosed = errors.New("qp: closed")

// NewEngine makes an engine. Its timers run only when the owner calls
// Tick; see Run for the real-time driver.
func NewEngine(cfg Config) (*Engine, error) {
	if cfg.Clock == nil || cfg.Out == nil || cfg.MRs == nil {
		return nil, errors.New("qp: engine needs a clock, an output and an MR table")
	}
	if !cfg.Local.IsValid() {
		return nil, errors.New("qp: engine needs a local address")
	}
	if cfg.Port == 0 {
		cfg.Port = 4791
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Window > 1<<22 {
		return nil, errors.New("qp: window must be below 2^22 PSNs")
	}
	if cfg.AckEvery <= 0 {
		cfg.AckEvery = 64
	}
	cc, err := cfg.Congestion.withDefaults()
	if err != nil {
		return nil, err
	}
	if !cc.Off && cfg.DataTOS&3 == 0 {
		cfg.DataTOS |= ECT0 // DCQCN needs switches to mark, so data is ECN-capable
	}
	return &Engine{cfg: cfg, cc: cc, qps: map[uint32]*QP{}, nextQPN: 17}, nil
}

// Local returns the engine's local address.
func (e *Engine) Local() netip.Addr { return e.cfg.Local }

// SetWake registers f to be called, with the engine lock held, whenever
// the earliest timer deadline may have become earlier. Drivers use it to
// re-arm their real timer.
func (e *Engine) SetWake(f func(at time.Duration)) {
	e.mu.Lock()
	e.wakeFunc = f
	e.mu.Unlock()
}

// Sync waits until the engine has finished whatever it was doing. It
// orders registered memory between the caller and the engine in both
// directions: after it returns, everything peers wrote through this engine
// is visible to the caller, and everything the caller wrote before it is
// what the engine will read for peers.
func (e *Engine) Sync() {
	e.mu.Lock()
	//lint:ignore SA2001 the empty critical section is the point
	e.mu.Unlock()
}

// Input processes a batch of received packets.
func (e *Engine) Input(pkts []InPacket) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.cfg.Clock.Now()
	for i := range pkts {
		e.receive(&pkts[i], now)
	}
	e.flushAcks()
	e.flush()
}

// Tick runs every timer due at the clock's current time.
func (e *Engine) Tick() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.runTimers(e.cfg.Clock.Now())
	e.flush()
}

// NextDeadline returns the earliest pending timer, if any.
func (e *Engine) NextDeadline() (time.Duration, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.timers.Len() > 0 {
		t := e.timers[0]
		if t.qp.deadline[t.kind] == t.at && !t.qp.destroyed {
			return t.at, true
		}
		heap.Pop(&e.timers)
	}
	return 0, false
}

// QP returns the QP with number n, if the engine has it.
func (e *Engine) QP(n uint32) (*QP, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	q, ok := e.qps[n]
	return q, ok
}

// QPs returns the engine's QPs, in no particular order.
func (e *Engine) QPs() []*QP {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*QP, 0, len(e.qps))
	for _, q := range e.qps {
		out = append(out, q)
	}
	return out
}

// emit queues a packet built in buf[:n] for sending.
func (e *Engine) emit(buf []byte, dest netip.AddrPort, tos uint8) {
	e.outq = append(e.outq, OutPacket{Buf: buf, Dest: dest, TOS: tos})
	e.Stats.SentPkts.Add(1)
	if len(e.outq) >= outBatch {
		e.flush()
	}
}

// flush hands queued packets to the output and recycles their buffers.
func (e *Engine) flush() {
	if len(e.outq) == 0 {
		return
	}
	e.cfg.Out.Emit(e.outq)
	for i := range e.outq {
		e.free = append(e.free, e.outq[i].Buf[:cap(e.outq[i].Buf)])
		e.outq[i] = OutPacket{}
	}
	e.outq = e.outq[:0]
}

// buf returns a packet buffer of n bytes.
func (e *Engine) buf(n int) []byte {
	if k := len(e.free); k > 0 {
		b := e.free[k-1]
		e.free = e.free[:k-1]
		return b[:n]
	}
	return make([]byte, n, MaxPacket)
}

// Timers.

type timerKind uint8

const (
	timerRetransmit timerKind = iota
	timerRNR
	timerPace // the pacer allows the next packet
	timerCC   // the congestion controller's rate-increase and alpha timers
	numTimers
)

type timerEntry struct {
	at   time.Duration
	qp   *QP
	kind timerKind
}

type timerHeap []timerEntry

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timerEntry)) }
func (h *timerHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// schedule arms timer kind of q at time at (replacing an earlier arming).
func (e *Engine) schedule(q *QP, kind timerKind, at time.Duration) {
	if at == 0 {
		at = 1 // 0 means disarmed
	}
	q.deadline[kind] = at
	heap.Push(&e.timers, timerEntry{at, q, kind})
	if e.wakeFunc != nil && e.timers[0].at == at {
		e.wakeFunc(at)
	}
}

func (e *Engine) cancel(q *QP, kind timerKind) { q.deadline[kind] = 0 }

func (e *Engine) runTimers(now time.Duration) {
	for e.timers.Len() > 0 && e.timers[0].at <= now {
		t := heap.Pop(&e.timers).(timerEntry)
		q := t.qp
		if q.destroyed || q.deadline[t.kind] != t.at {
			continue // stale
		}
		q.deadline[t.kind] = 0
		switch t.kind {
		case timerRetransmit:
			e.retransmitTimeout(q, now)
		case timerRNR:
			e.rnrTimerExpired(q, now)
		case timerPace:
			e.kick(q)
		case timerCC:
			e.ccTimer(q, now)
		}
	}
}

// Real-time driving.

// MonoClock is a Clock reading the monotonic clock since its creation.
type MonoClock struct{ start time.Time }

// NewMonoClock returns a clock starting now.
func NewMonoClock() *MonoClock { return &MonoClock{start: time.Now()} }

// Now returns the time since the clock was made.
func (c *MonoClock) Now() time.Duration { return time.Since(c.start) }

// RunTimers drives the engine's timers on real time until stop is closed.
// The engine's clock must be a MonoClock (or another clock tracking real
// time).
func (e *Engine) RunTimers(stop <-chan struct{}) {
	wake := make(chan struct{}, 1)
	e.SetWake(func(time.Duration) {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		d := time.Hour
		if at, ok := e.NextDeadline(); ok {
			d = at - e.cfg.Clock.Now()
			if d < 0 {
				d = 0
			}
		}
		t.Reset(d)
		select {
		case <-stop:
			return
		case <-wake:
		case <-t.C:
			e.Tick()
		}
	}
}
