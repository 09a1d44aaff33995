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
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
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
	// Buf is the packet, BTH through ICRC; the ICRC bytes are left for the
	// transport. With Payload set it is only the header (BTH through the
	// opcode's extension headers, Info.HdrLen bytes) and the trailer (pad
	// and ICRC).
	Buf []byte
	// Payload, when not nil, is the packet's payload where it lies in
	// registered memory (only from an Output that is a ScatterOutput):
	// the packet is Buf's header, Payload, then Buf's trailer. The engine
	// keeps the memory's owner from reusing it until the packet is sent:
	// an RC work request completes only on its acknowledgement. As with
	// Buf, its capacity may reach over the next packet's payload (the
	// rest of the SGE or of the READ burst), so that an Output finds runs;
	// an Output must never write to it or append to it.
	Payload []byte
	Dest    netip.AddrPort
	TOS     uint8
	// QPN is the local QP the packet belongs to (the requester's for a
	// request, the responder's for an ACK or READ response, the QP that
	// saw the CE mark for a CNP): SendFailed finds it without parsing.
	QPN uint32
	// DestQPN is the destination QP in the packet's BTH: the device
	// routes by it (source GID) without parsing.
	DestQPN uint32
}

// Output sends packets. The engine reuses each Buf once Emit returns.
//
// The engine builds a batch's packets back to back in one slab, and each
// Buf's capacity reaches to the end of that slab: an Output may find runs
// of packets adjacent in memory (&a[:len(a)+1][len(a)] == &b[0]) and send
// each run as one buffer (UDP GSO) without copying. An Output must never
// append to a Buf.
type Output interface {
	Emit(pkts []OutPacket)
}

// ScatterOutput is an Output that takes packets whose payload stays in
// registered memory (OutPacket.Payload) and sends it from there (as
// transport.Scatterer Conns do with scatter-gather I/O), which saves the
// engine copying it into the slab. The engine asks Scatters once, when
// it is made.
type ScatterOutput interface {
	Output
	// Scatters reports whether Emit takes packets with Payload set.
	Scatters() bool
}

// ZeroCopyMinPayload is the shortest payload the engine leaves in
// registered memory for a ScatterOutput. Below it copying is cheaper:
// a scattered packet costs two more iovecs for the kernel to walk (and a
// page lookup for each) and a CRC that restarts across three pieces,
// about what a copy of a few hundred bytes costs, while a copy of a full
// 1 KiB or 4 KiB payload is several times that. Inline data, atomics and
// every packet of UC and UD (their work requests complete when sent, so
// the memory must not be read later) are always copied.
const ZeroCopyMinPayload = 512

// AppendPacket appends the whole packet p (header, payload, trailer for a
// scattered one) to dst and returns the extended slice: for Outputs that
// need it in one piece.
func (p *OutPacket) AppendPacket(dst []byte) []byte {
	if p.Payload == nil {
		return append(dst, p.Buf...)
	}
	h := bth.BTH(p.Buf).Opcode().Info().HdrLen
	return append(append(append(dst, p.Buf[:h]...), p.Payload...), p.Buf[h:]...)
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
	// InitialWindow, when above 0, is the congestion window a QP starts
	// with: slow start opens it to Window as ACKs come, instead of a new
	// QP sending a whole Window at a peer it has not heard from (see
	// window.go). 0 starts open.
	InitialWindow int
	// DataTOS is the IP TOS of data packets (DSCP<<2 | ECN).
	DataTOS uint8
	// MaxMTU is the largest path MTU the link carries, the port's
	// active_mtu (see ActiveMTU); Modify refuses a larger path_mtu and UD
	// QPs use it. 0 means MTU4096.
	MaxMTU MTU
	// AckEvery makes the requester set AckReq at least every this many
	// packets inside long messages, as rxe does every 64 (0: that default).
	AckEvery int
	// Congestion configures DCQCN; nil means on, with NVIDIA's defaults.
	Congestion *CongestionConfig
	// ReadChunk is the most bytes one READ request asks for: a longer
	// READ work request goes out as several requests (0:
	// DefaultReadChunk). See readsplit.go.
	ReadChunk int
	// ReadBudget bounds the bytes of READ responses the engine has asked
	// for and not yet received, so that they fit the socket receive
	// buffer; one chunk may always be asked for (0: no bound).
	ReadBudget int
	// RNRTick is the grain the RNR wait is rounded up to, as rxe rounds
	// it to jiffies (0: DefaultRNRTick; negative: the IBTA time exactly).
	RNRTick time.Duration
	// StallTime is how long retransmissions without progress may go on
	// when retry_cnt is 7, before the oldest WQE fails with RETRY_EXC_ERR
	// (stall.go): 0 means DefaultStallTime; negative means never, rxe's
	// rule (retry for ever).
	StallTime time.Duration
	// Destroyed, if set, is called with each QP as it is destroyed
	// (QP.Destroy, Close), with the engine lock held, so that the owner
	// of the engine can forget what it keeps about the QP. It must not
	// call into the engine.
	Destroyed func(*QP)
}

// DefaultWindow is the default number of unacknowledged PSNs per QP.
const DefaultWindow = 256

// MaxPacket is the largest RoCE packet the engine builds: a 4096-byte
// payload plus the longest header set and the ICRC.
const MaxPacket = 4096 + 64

// outBatch is the most packets queued before they are handed to the
// Output; slabSize is the bytes they may take. A 64 KiB message at MTU
// 1024 is 64 packets, so a batch holds several such messages and the
// Output sees long runs. The slab fills at about the same count of full
// MTU 1024 packets (504), so a long stream is cut into batches (one
// sendmmsg each, and a short GSO datagram where a run is cut) every 512
// KiB at either MTU; with 256 the queue cut it every 256 KiB at MTU 1024.
const (
	outBatch = 512
	slabSize = 512 << 10
)

// Engine runs the transport for a set of QPs. See the package comment.
type Engine struct {
	mu  sync.Mutex
	cfg Config

	qps     qpTable
	nextQPN uint32

	outq     []OutPacket
	slab     []byte       // packets of outq, back to back
	slabOff  int          // first free byte of slab
	scatters bool         // cfg.Out is a ScatterOutput that Scatters
	batching atomic.Int32 // Batch calls running: PostSend leaves its packets queued
	posted   atomic.Bool  // a post of a batch left its QP's turn to RunBatch
	woke     bool         // a completion of this Input woke a goroutine waiting on a CQ
	pushed   bool         // this Input made a completion
	held     atomic.Bool  // ACKs are pending after InputPolled
	closed   bool         // Close was called

	// The batch being taken in (input): its packets arrived between
	// batchFrom and batchAt, and batchPos is the one in hand, of batchLen
	// (see arrival). lastInput is when the previous batch was taken in.
	batchFrom, batchAt, lastInput time.Duration
	batchPos, batchLen            int
	// inputs counts the batches taken in: a saved READ notes the one
	// that brought it (resource.batch).
	inputs uint64

	cc       CongestionConfig
	timers   timerHeap
	ackList  []*QP
	wakeFunc func(at time.Duration)

	// closedQPs holds the QP numbers destroyed within closedQPHold, with
	// the time (quarantine.go).
	closedQPs   map[uint32]time.Duration
	closedOrder []closedQP // the Destroys closedQPs holds, oldest first

	// ready lists the QPs waiting for a turn to send, nextRound is the
	// spare array for the round after; turnsHeld defers kicks to the end
	// of a received batch or a timer pass, and turning is set while turns
	// run (turns.go).
	ready, nextRound []*QP
	turnsHeld        int
	turning          bool

	readOut  int   // bytes of READ responses asked for and not received (readsplit.go)
	readWait []*QP // QPs waiting for room in the READ budget

	// Stats are the engine's counters, readable at any time.
	Stats Counters
}

// ErrClosed is returned by operations on a destroyed QP, a closed CQ or
// a closed engine, and by a second Destroy or Close. It is mr.ErrClosed,
// so that one error means "already closed" for every verbs object.
var ErrClosed = mr.ErrClosed

// Close shuts the engine down: every QP moves to ERR, so its outstanding
// work requests complete with WR_FLUSH_ERR (as after ibv_modify_qp to
// ERR), and is then destroyed, letting go of its CQs; later calls to
// create QPs or SRQs, and every call on the QPs, fail with ErrClosed.
// ACKs the engine holds go out first, so that the peer learns what
// arrived. Close is idempotent.
func (e *Engine) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	e.closed = true
	e.releaseAcks()
	e.qps.all(func(q *QP) bool {
		if q.state != Err {
			q.enterError()
		}
		q.destroy()
		return true
	})
	e.flush()
}

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
	if cfg.ReadChunk <= 0 {
		cfg.ReadChunk = DefaultReadChunk
	}
	if cfg.AckEvery <= 0 {
		cfg.AckEvery = 64
	}
	switch {
	case cfg.MaxMTU == 0:
		cfg.MaxMTU = MTU4096
	case cfg.MaxMTU.Bytes() == 0:
		return nil, fmt.Errorf("qp: MaxMTU %d is not 1..5 (256..4096 bytes)", cfg.MaxMTU)
	}
	if cfg.RNRTick == 0 {
		cfg.RNRTick = DefaultRNRTick
	}
	cc, err := cfg.Congestion.withDefaults()
	if err != nil {
		return nil, err
	}
	if !cc.Off && cfg.DataTOS&3 == 0 {
		cfg.DataTOS |= ECT0 // DCQCN needs switches to mark, so data is ECN-capable
	}
	so, ok := cfg.Out.(ScatterOutput)
	return &Engine{cfg: cfg, cc: cc, nextQPN: 17, scatters: ok && so.Scatters()}, nil
}

// MaxMTU returns the largest path MTU the engine accepts, the port's
// active_mtu (Config.MaxMTU).
func (e *Engine) MaxMTU() MTU { return e.cfg.MaxMTU }

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

// Batch runs fn, which posts work requests, and builds and sends the
// packets of those posts when fn returns, instead of in each PostSend:
// the posted QPs then take their turns together (runTurns), and posts to
// many QPs (one work request each, say) leave in a few system calls and
// GSO runs rather than one per post. Packets the engine makes meanwhile
// for other reasons (ACKs, timers) go as usual, and a received batch
// runs the turns of QPs posted to before it. Posts other goroutines make
// while fn runs are held too, until it returns.
func (e *Engine) Batch(fn func()) {
	e.BeginBatch()
	defer func() {
		e.EndBatch()
		e.RunBatch()
	}()
	fn()
}

// BeginBatch and EndBatch are Batch in halves, for a caller that posts to
// several engines in one batch and then lets each engine send on a
// goroutine of its own (internal/device): posts made between them leave
// their packets to RunBatch, which EndBatch says whether to call.
func (e *Engine) BeginBatch() { e.batching.Add(1) }

// EndBatch ends a BeginBatch and reports whether a post made meanwhile
// left work for RunBatch. A post reads the batch count after marking its
// work, and EndBatch looks after lowering the count, so a post either sees
// the batch over and sends itself or is seen here.
func (e *Engine) EndBatch() bool {
	e.batching.Add(-1)
	return e.posted.Swap(false)
}

// RunBatch builds and sends what the posts of a batch left: the ACKs
// they held back, ahead of the requests as PostSend sends them, then the
// turns of their QPs, then every queued packet.
func (e *Engine) RunBatch() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.releaseAcks()
	if e.turnsHeld == 0 {
		e.runTurns()
	}
	e.flush()
}

// Input processes a batch of received packets.
//
// When the batch completed work a goroutine was waiting for, Input lets
// that goroutine run before it sends the batch's ACKs: an application
// answering a message at once (a ping-pong, a request and its response)
// then posts its reply, and PostSend sends the ACKs and the reply in one
// system call, which the peer takes in with one wake-up instead of two.
// The ACKs wait one yield of the processor at most.
func (e *Engine) Input(pkts []InPacket) { e.InputWoke(pkts) }

// InputWoke is Input that reports whether the batch woke a goroutine
// waiting on a CQ.
func (e *Engine) InputWoke(pkts []InPacket) (woke bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.input(pkts)
	woke = e.woke
	if e.woke && len(e.ackList) > 0 {
		e.woke = false
		e.mu.Unlock()
		runtime.Gosched()
		e.mu.Lock()
	}
	e.flushAll()
	return woke
}

func (e *Engine) input(pkts []InPacket) {
	now := e.cfg.Clock.Now()
	e.woke, e.pushed = false, false
	e.batchFrom, e.batchAt, e.batchLen = max(e.lastInput, now-maxBatchSpan), now, len(pkts)
	e.lastInput = now
	e.inputs++
	e.holdTurns()
	for i := range pkts {
		e.batchPos = i
		e.receive(&pkts[i], now)
	}
	e.batchLen = 0
	e.releaseTurns() // the QPs the batch's ACKs let send, each in turn
}

// maxBatchSpan bounds how far back arrival places a packet: a batch
// holds what queued while the engine was busy, not since it last ran
// after an idle second.
const maxBatchSpan = time.Millisecond

// arrival estimates when the packet in hand arrived: the engine takes a
// batch at one time, now, but its packets queued one after another since
// the previous batch, so the k-th of n is placed k/n of the way from
// then to now (the last at now; a packet taken in alone, at now). A
// reaction point needs it: CNPs that arrived 50 µs apart are each a cut,
// while the same CNPs stamped with one time fall in one rate-reduce
// monitor period and count as one (TestCNPsOfABatchEachCut).
func (e *Engine) arrival(now time.Duration) time.Duration {
	if e.batchLen <= 1 || now != e.batchAt {
		return now
	}
	return e.batchFrom + (now-e.batchFrom)*time.Duration(e.batchPos+1)/time.Duration(e.batchLen)
}

// InputPolled is Input for a goroutine that polls a CQ and takes in
// packets itself (busy polling). When the batch made completions, the
// poller is about to see them and, likely, answer: the ACKs then wait for
// its next PostSend, which sends them in the same system call as the
// answer, or for FlushAcks, which the poller calls when it finds nothing
// new (and the device's receive loop calls before it sleeps), so they
// usually wait no longer than the poller takes to look again, and never
// longer than ackHold. It reports whether the batch woke a goroutine
// waiting on a CQ.
func (e *Engine) InputPolled(pkts []InPacket) (woke bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.input(pkts)
	woke = e.woke
	if e.pushed && len(e.ackList) > 0 {
		e.held.Store(true)
		// Should the poller stop polling, the timer sends them.
		now := e.cfg.Clock.Now()
		for _, q := range e.ackList {
			if q.timer[timerAck].deadline == 0 {
				e.schedule(q, timerAck, now+ackHold)
			}
		}
	} else {
		e.flushAcks()
	}
	e.flush()
	return woke
}

// ackHold bounds how long InputPolled's ACKs wait for the poller.
const ackHold = time.Millisecond

// releaseAcks sends every pending ACK, those InputPolled held back for
// the poller's answer included.
func (e *Engine) releaseAcks() {
	e.flushAcks()
	if e.held.Load() { // a store is a locked exchange; most calls find it clear
		e.held.Store(false)
	}
}

// flushAll sends every pending ACK (releaseAcks), then every packet queued.
func (e *Engine) flushAll() {
	e.releaseAcks()
	e.flush()
}

// FlushAcks sends the ACKs InputPolled left pending, if any.
func (e *Engine) FlushAcks() {
	if !e.held.Load() {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.flushAll()
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
	e.skim()
	if e.timers.Len() == 0 {
		return 0, false
	}
	return e.timers[0].at, true
}

// QP returns the QP with number n, if the engine has it.
func (e *Engine) QP(n uint32) (*QP, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	q := e.qps.get(n)
	return q, q != nil
}

// QPs returns the engine's QPs, by number.
func (e *Engine) QPs() []*QP {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*QP, 0, e.qps.len())
	e.qps.all(func(q *QP) bool {
		out = append(out, q)
		return true
	})
	return out
}

// SendFailed tells the engine that the Output could not send pkt, the
// first packet of a message it was given, and that sending it again cannot
// succeed either: the kernel refused it as longer than the interface's MTU
// (EMSGSIZE). Retransmitting
// would fail the same way for ever, so the engine completes the send work
// request that packet belongs to with WCLocQPOpErr and moves its QP to ERR,
// as rxe's requester does when a transmit fails. An Output calls it from
// within Emit (the engine lock is held); the engine acts at its next timer
// pass, between packets, not inside Emit. Responses (ACKs, READ responses)
// are only counted: the peer's requester times out on them.
func (e *Engine) SendFailed(pkt *OutPacket) {
	if len(pkt.Buf) < bth.Len {
		return
	}
	h := bth.BTH(pkt.Buf)
	if in, ok := bth.Lookup(h.Opcode()); !ok || !in.Has(bth.Request) {
		return
	}
	q := e.qps.get(pkt.QPN)
	if q == nil || q.destroyed || q.sendFailed {
		return
	}
	q.sendFailed, q.sendFailPSN = true, h.PSN()
	e.schedule(q, timerSendErr, e.cfg.Clock.Now())
}

// sendError completes the work request whose packet SendFailed reported
// with WCLocQPOpErr and moves the QP to ERR (failWQE). A work request
// already completed (UC and UD complete once sent) leaves nothing to fail
// but the QP itself.
func (e *Engine) sendError(q *QP) {
	if !q.sendFailed {
		return
	}
	q.sendFailed = false
	if q.state != RTS && q.state != SQD && q.state != SQE {
		return
	}
	psn := q.sendFailPSN
	for i := q.sqHead; i != q.sqTail; i++ {
		w := q.wqe(i)
		if w.started && !w.done && !psn.Before(w.firstPSN) && !psn.After(w.lastPSN) {
			e.failWQE(q, w, WCLocQPOpErr)
			return
		}
	}
	q.enterError()
}

// Real-time driving.
