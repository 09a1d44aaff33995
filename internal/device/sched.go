// The receive scheduler: who reads a shard's socket, when, and on which
// goroutine. A Receiver takes in packets from one transport.Conn and hands
// them to one Input (an engine, or the shard demultiplexer in front of
// several), on its own goroutine or on an application goroutine that
// polls or waits on a CQ (busy polling; blocking waits that read the
// socket themselves). Attach gives a CQ these hooks; applications never
// see them.

package device

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// Input is what a Receiver hands packets to: a qp.Engine, or a shard
// demultiplexer in front of several.
type Input interface {
	// InputWoke processes a batch and reports whether it woke a goroutine
	// waiting on a CQ (qp.Engine.InputWoke).
	InputWoke(pkts []qp.InPacket) bool
	// InputPolled processes a batch for a goroutine that polls or waits
	// itself: ACKs may wait for its answer (qp.Engine.InputPolled).
	InputPolled(pkts []qp.InPacket) bool
	// FlushAcks sends the ACKs InputPolled held back.
	FlushAcks()
}

// ReceiverConfig configures a Receiver.
type ReceiverConfig struct {
	Conn  transport.Conn
	In    Input
	Local netip.Addr // the address packets arrive at (InPacket.Dest)
	// BusyPoll, when positive and Conn is a transport.Poller, makes
	// polling a CQ take in packets on the polling goroutine (see
	// Options.BusyPoll in the root package).
	BusyPoll time.Duration
	// Stop is closed when the device closes.
	Stop <-chan struct{}
}

// batch is the most packets the receive loop hands the engine at once: a
// few GRO datagrams' worth. The engine answers each batch with at most
// one coalesced ACK per QP, so larger batches mean fewer ACKs.
const batch = 256

// Receiver takes in one Conn's packets. See the package comment.
type Receiver struct {
	conn  transport.Conn
	in    Input
	local netip.Addr
	stop  <-chan struct{}

	poller   transport.Poller  // the Conn's non-blocking receive, if busy polling
	quieter  transport.Quieter // the Conn's, if busy polling: see standBack
	tryer    transport.Poller  // the Conn's non-blocking receive, if it has one (Settle)
	mu       sync.Mutex        // held while packets from msgs are in the engine
	msgs     []transport.Message
	pkts     []qp.InPacket
	busy     time.Duration // BusyPoll, with a Poller
	start    time.Time     // origin of lastPoll
	lastPoll atomic.Int64  // time since start of the last application poll (busy mode)

	// Blocking mode over a transport.Waker: see readLoop and cqWaiter.
	waker   transport.Waker
	wantRd  atomic.Int32    // goroutines in PollWait waiting for the socket while another reads
	reading atomic.Bool     // the receive goroutine holds mu
	down    atomic.Bool     // the Conn is closed: PollWait waits on the CQ alone
	handoff chan struct{}   // a token: the socket is free for a goroutine counted in wantRd
	rdEpoch atomic.Uint64   // counts application goroutines taking the socket
	ctxDone <-chan struct{} // see watchCtx (under mu)
	ctxStop func() bool
}

// NewReceiver makes a Receiver; Run starts it.
func NewReceiver(c ReceiverConfig) *Receiver {
	r := &Receiver{conn: c.Conn, in: c.In, local: c.Local, stop: c.Stop, start: time.Now(),
		msgs: make([]transport.Message, batch), pkts: make([]qp.InPacket, 0, batch)}
	r.tryer, _ = c.Conn.(transport.Poller)
	if p, ok := c.Conn.(transport.Poller); ok && c.BusyPoll > 0 {
		r.poller, r.busy = p, c.BusyPoll
		r.quieter, _ = c.Conn.(transport.Quieter)
	} else if w, ok := c.Conn.(transport.Waker); ok {
		r.waker = w
		r.handoff = make(chan struct{}, 1)
	}
	return r
}

// Run takes in packets until the Conn closes.
//
// In busy-poll mode the loop waits for the socket to become readable and
// then takes its packets in without blocking, under mu, so that an
// application polling a CQ can take them in too (pollOnce); views into
// the transport's buffers are only ever in use under mu. Over a Waker it
// shares the socket with goroutines waiting on CQs (readLoop). Otherwise
// it reads with blocking Recv, which makes one system call per wake-up
// fewer: a recvmmsg that finds nothing parks the goroutine, and the next
// one after the wake-up reads.
func (r *Receiver) Run() {
	if r.busy > 0 {
		r.pollLoop()
		return
	}
	if r.waker != nil {
		r.readLoop()
		return
	}
	for {
		n, err := r.conn.Recv(r.msgs)
		if err != nil {
			if r.closing(err) {
				return
			}
			continue
		}
		r.input(n)
	}
}

// Close releases what the Receiver holds once Run has returned.
func (r *Receiver) Close() {
	if r.waker != nil {
		r.mu.Lock()
		if r.ctxStop != nil {
			r.ctxStop()
		}
		r.mu.Unlock()
	}
}

// closing reports whether a receive error means the device is closing.
func (r *Receiver) closing(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return true
	}
	select {
	case <-r.stop:
		return true
	default:
		return false
	}
}

// input hands the n packets in msgs to the engine.
func (r *Receiver) input(n int) { r.inputWith(n, r.in.InputWoke) }

// inputWith hands the n packets in msgs, parsed by the transport, to the
// engine through input and returns what input does.
func (r *Receiver) inputWith(n int, input func([]qp.InPacket) bool) bool {
	in := r.pkts[:0]
	for i := range r.msgs[:n] {
		m := &r.msgs[i]
		in = append(in, qp.InPacket{Pkt: m.Pkt, Src: m.Peer, TOS: m.TOS, Dest: r.local})
	}
	res := input(in)
	clear(in) // no references into the transport's buffers
	clear(r.msgs[:n])
	return res
}

// receiveOnce takes in what the socket holds, without blocking.
func (r *Receiver) receiveOnce() (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, err := r.poller.TryRecv(r.msgs)
	if n > 0 {
		r.input(n)
	}
	return n, err
}

// Settle takes in what the Receiver's socket holds before it returns, on
// the caller's goroutine when no other goroutine reads the socket;
// otherwise it asks the reader to hand the socket over (as a goroutine
// waiting on a CQ does) and waits for it at most limit. A device calls it
// for its other shards before it acts on a connection manager's message:
// a peer's last ACKs, sent before its disconnect request, may sit on
// another shard's socket, and must complete their work before the
// disconnect moves the QP to the error state and flushes what is left.
// It only ever tries locks, so Receivers settling each other cannot
// deadlock.
func (r *Receiver) Settle(limit time.Duration) {
	if r.tryer == nil {
		return // one blocking reader: nothing to overtake
	}
	r.wantRd.Add(1)
	end := time.Now().Add(limit)
	for !r.mu.TryLock() {
		if r.reading.Load() && r.waker != nil {
			r.waker.Wake() // the receive goroutine: it hands over (serve)
		}
		if time.Now().After(end) {
			r.wantRd.Add(-1)
			return
		}
		time.Sleep(10 * time.Microsecond)
	}
	for {
		n, _ := r.tryer.TryRecv(r.msgs)
		if n == 0 {
			break
		}
		r.input(n)
	}
	r.wantRd.Add(-1)
	if r.handoff != nil {
		r.release()
	} else {
		r.mu.Unlock()
	}
}

// now is the time since the Receiver was made.
func (r *Receiver) now() time.Duration { return time.Since(r.start) }

// pollLoop is the receive loop over a transport.Poller.
func (r *Receiver) pollLoop() {
	for {
		if !r.standBack() {
			return
		}
		n, err := r.receiveOnce()
		if err != nil && r.closing(err) {
			return
		}
		if n > 0 || err != nil {
			continue
		}
		r.in.FlushAcks() // held for a poller that has stopped polling
		if err := r.poller.WaitReadable(); err != nil && r.closing(err) {
			return
		}
	}
}

// standBack sleeps while an application polls the socket (pollOnce),
// reading nothing meanwhile (also when WaitReadable returns because a
// packet came for the poller): the poller takes in every packet the socket
// holds, whichever QP it is for, so a read here would only take the
// socket's lock from under it and hand a packet over between goroutines
// (a wake-up and a switch on the poller's round trip). It wakes when the
// last poll is BusyPoll old, to take the socket back; it reports false
// when the device closes. Meanwhile nobody waits on the socket, so it
// leaves the kernel's wait queues (transport.Quieter), where each
// datagram it is given or frees would run an entry of every wait
// instance on the sender's CPU (docs/performance.md, "Busy-polled
// sockets out of the wait queues"). The receive goroutine's next wait
// puts it back.
func (r *Receiver) standBack() bool {
	for {
		last := r.lastPoll.Load()
		idle := r.now() - time.Duration(last)
		if last == 0 || idle >= r.busy { // 0: no application has polled yet
			return true
		}
		if r.quieter != nil {
			r.quieter.Quiet() // cheap once out; retried if a send held the socket
		}
		time.Sleep(r.busy - idle)
		select {
		case <-r.stop:
			return false
		default:
		}
	}
}

// pollOnce is a busy-polling CQ's poller: it takes in what the socket
// holds on the polling goroutine, unless another goroutine is at it.
func (r *Receiver) pollOnce() {
	if !r.mu.TryLock() {
		return
	}
	defer r.mu.Unlock()
	r.lastPoll.Store(max(int64(r.now()), 1)) // 0 is never
	if n, _ := r.poller.TryRecv(r.msgs); n > 0 {
		r.inputWith(n, r.in.InputPolled)
	} else {
		r.in.FlushAcks() // the poller did not answer what it took in last time
	}
}

// Attach gives cq the scheduling of the Receivers in rs, which serve the
// QPs that may complete work on it: in busy-poll mode, polling the empty
// CQ takes in the packets of home's Receiver and of those of the shards
// the returned function has marked as holding one of the CQ's QPs (home
// is marked); in blocking mode, a goroutine waiting on it reads home's
// socket itself while the other Receivers' goroutines serve theirs (their
// completions wake it). Call it before cq is used, and the function for
// each QP created with cq, with its shard (an index into rs).
func Attach(cq *qp.CQ, rs []*Receiver, home int) (use func(shard int)) {
	h := rs[home]
	switch {
	case h.busy > 0 && len(rs) == 1:
		cq.SetPoller(h.pollOnce, h.busy)
	case h.busy > 0:
		p := &shardPoller{rs: rs, home: home, used: make([]atomic.Bool, len(rs))}
		cq.SetPoller(p.poll, h.busy)
		return p.use
	case h.waker != nil:
		cq.SetWaiter((*cqWaiter)(h))
	}
	return func(int) {}
}

// shardPoller is the poller of a busy-polling CQ on a device with several
// shards: it polls the sockets of the shards that hold the CQ's QPs, and
// no other, so that polling a CQ of one shard's QPs costs one
// non-blocking recvmmsg, not one per shard. A packet for one of its QPs
// that arrives on another shard's socket (where the kernel could not
// steer it) is taken in by that shard's receive goroutine.
type shardPoller struct {
	rs   []*Receiver
	home int
	used []atomic.Bool // a QP of the CQ lives on the shard (never unset)
}

func (p *shardPoller) use(shard int) { p.used[shard].Store(true) }

func (p *shardPoller) poll() {
	p.rs[p.home].pollOnce()
	for i := 1; i < len(p.rs); i++ {
		if s := (p.home + i) % len(p.rs); p.used[s].Load() {
			p.rs[s].pollOnce()
		}
	}
}

// The receive goroutine looks whether application goroutines have
// stopped reading the socket checkMin after it handed the socket over,
// then at intervals doubling up to checkMax: a socket an application
// stopped reading waits at most about twice that. The check runs on the
// receive goroutine's own timer: resetting a timer at every PollWait
// would wake the runtime's network poller each time, the very cost that
// reading on the application's goroutine saves.
const (
	checkMin = time.Millisecond
	checkMax = 4 * time.Millisecond
)

// readLoop is the receive loop of a blocking-mode device over a
// transport.Waker.
//
// Whoever holds mu reads the socket: this goroutine, or an application
// goroutine blocked in PollWait on one of the device's CQs (cqWaiter).
// When the application reads, the packet that completes its work wakes
// the goroutine that wants it straight from its wait (in a round trip, a
// blocking epoll_pwait2 of its own: transport's directWait): no hand-off
// between goroutines, which on a two-CPU machine cost two
// futex calls and a goroutine switch per message. Packets for other QPs
// and CQs go into the engine all the same.
//
// The receive goroutine reads only while no application goroutine waits:
// one that comes to PollWait while it reads wakes it, and it hands the
// socket over (release). An application goroutine that stops reading
// hands it to another waiting one, if any; otherwise the receive
// goroutine takes it back once it finds it unread, and not taken by an
// application goroutine, for a whole check period.
func (r *Receiver) readLoop() {
	t := time.NewTimer(checkMin)
	defer t.Stop()
	period, seen := checkMin/2, r.rdEpoch.Load()
	for {
		period = min(2*period, checkMax)
		if r.wantRd.Load() == 0 && r.mu.TryLock() {
			if r.rdEpoch.Load() != seen {
				r.release() // taken and left again lately: likely back soon (a goroutine that came meanwhile gets the socket)
			} else {
				// Unread for a whole period: take it back.
				r.reading.Store(true)
				r.in.FlushAcks() // held for an answer that did not come
				err := r.serve()
				r.reading.Store(false)
				r.release()
				if err != nil {
					return
				}
				period = checkMin
			}
		}
		seen = r.rdEpoch.Load()
		t.Reset(period)
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
	}
}

// serve reads for the receive goroutine, with mu held, until an
// application goroutine wants the socket (nil) or the device closes.
func (r *Receiver) serve() error {
	for {
		seq := r.waker.WakeSeq()
		if r.wantRd.Load() > 0 {
			return nil
		}
		n, err := r.waker.RecvWait(r.msgs, seq, time.Time{})
		if err != nil {
			if r.closing(err) {
				r.down.Store(true)
				return err
			}
			continue
		}
		if n > 0 {
			r.input(n)
		}
	}
}

// release gives up the socket (mu), to an application goroutine that
// waits for it if there is one.
func (r *Receiver) release() {
	r.mu.Unlock()
	if r.wantRd.Load() > 0 {
		select {
		case r.handoff <- struct{}{}:
		default:
		}
	}
}

// cqWaiter is the qp.Waiter of a blocking-mode device's CQs: PollWait on
// an empty CQ reads the socket on the caller's goroutine (readLoop).
type cqWaiter Receiver

// WaitCQ implements qp.Waiter.
func (w *cqWaiter) WaitCQ(ctx context.Context, cq *qp.CQ) error {
	r := (*Receiver)(w)
	if r.down.Load() {
		return cq.Wait(ctx)
	}
	if !r.mu.TryLock() {
		// Another goroutine reads. Say so, then look again: either this
		// goroutine then finds the socket free or whoever releases it
		// sees wantRd and hands it over.
		r.wantRd.Add(1)
		if !r.mu.TryLock() {
			if r.reading.Load() {
				r.waker.Wake() // the receive goroutine: it hands over
			}
			err := cq.WaitOr(ctx, r.handoff)
			r.wantRd.Add(-1)
			return err
		}
		r.wantRd.Add(-1)
	}
	r.rdEpoch.Add(1)
	defer r.release()
	return r.readFor(ctx, cq)
}

// Wake implements qp.Waiter.
func (w *cqWaiter) Wake() { w.waker.Wake() }

// readFor reads the socket, with mu held, until cq may hold completions
// or ctx is done. The ACKs for what it takes in wait for the caller's
// answer, as in busy polling (qp.Engine.InputPolled): a ping-pong's reply
// and ACK then leave in one datagram (one system call per hop; 57-66 to
// 36-38 us p50 on an idle 2-core VM). They go out before the reader
// blocks again, at the caller's next PostSend or Modify, or after the
// engine's ACK hold (1 ms) at the latest.
func (r *Receiver) readFor(ctx context.Context, cq *qp.CQ) error {
	r.watchCtx(ctx)
	for {
		seq := r.waker.WakeSeq()
		if !cq.Watch() {
			return nil
		}
		r.in.FlushAcks() // nothing to answer yet: the held ACKs go now
		if err := ctx.Err(); err != nil {
			cq.Unwatch()
			return err
		}
		n, err := r.waker.RecvWait(r.msgs, seq, time.Time{})
		cq.Unwatch()
		if n > 0 {
			r.inputWith(n, r.in.InputPolled)
		} else if err != nil && r.closing(err) {
			r.down.Store(true)
			return nil // PollWait waits on the CQ from now on
		}
	}
}

// watchCtx makes ctx's end wake the socket's reader. The registration
// (context.AfterFunc, which allocates) is kept for the next wait and
// made again only for a context with another Done channel: a loop
// calling PollWait with one context registers once. mu is held.
func (r *Receiver) watchCtx(ctx context.Context) {
	done := ctx.Done()
	if done == nil || done == r.ctxDone {
		return
	}
	if r.ctxStop != nil {
		r.ctxStop()
	}
	r.ctxDone, r.ctxStop = done, context.AfterFunc(ctx, r.waker.Wake)
}
