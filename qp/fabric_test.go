package qp

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
)

// vclock is a virtual clock the fabric advances.
type vclock struct{ now time.Duration }

func (c *vclock) Now() time.Duration { return c.now }

type wirePkt struct {
	data []byte
	src  netip.AddrPort
	dst  netip.AddrPort
	tos  uint8
	// served: a slow receiver already queued and processed it.
	served bool
	// ticked: the engine sent it from its timers (Tick), not from an
	// input batch or a post.
	ticked bool
}

// fabric is an in-memory network of engines on virtual time.
type fabric struct {
	t     *testing.T
	clock *vclock
	nodes map[netip.Addr]*node
	queue []wirePkt
	rng   *rand.Rand
	// drop decides whether a packet is lost (nil: none).
	drop func(p wirePkt) bool
	dup  float64 // duplication probability
	// mark decides whether a packet arrives marked Congestion Experienced.
	mark func(p wirePkt) bool
	// reorder swaps adjacent packets with this probability.
	reorder   float64
	delivered int
	dropped   int
	trace     bool
	// tap, if set, sees every packet the fabric delivers (duplicates
	// included), just before the destination engine does.
	tap func(p wirePkt, pkt bth.Packet)
	// ticking: the engines' timers run (wirePkt.ticked)
	ticking bool
	// dupIf, if set, picks packets to deliver twice.
	dupIf func(p wirePkt) bool
	// batch hands each engine everything that reaches it in one round in
	// a single Input call, as a receive loop reading batches does;
	// otherwise every packet is its own Input.
	batch    bool
	batched  map[*node][]InPacket
	batchOrd []*node
	// delay, if set, gives each packet (each copy of a duplicated one) a
	// flight time: it arrives that much virtual time after it was sent,
	// so delays, jitter and hold-backs reorder packets as a network does.
	delay func(p wirePkt) time.Duration
	// engineCfg, if set, adjusts the configuration of engines node makes.
	engineCfg func(*Config)
	held      timedQueue[wirePkt] // packets in flight
	// events are application actions due at a virtual time (see after).
	events timedQueue[func()]
	seq    uint64 // orders held packets and events with equal times
	// slow makes receivers slow (see slowRx), by address.
	slow map[netip.Addr]*slowRx
}

// slowRx is a slow receiver: a host that takes in one packet every
// service time and holds at most queue packets waiting, dropping what
// arrives beyond them, as an overloaded VM behind a short NIC ring does.
type slowRx struct {
	service   time.Duration
	queue     int
	busyUntil time.Duration // when the packets queued now are all taken in
	dropped   int
}

// admit queues a packet arriving at now; it returns when the receiver
// takes it in, or false when the queue is full.
func (s *slowRx) admit(now time.Duration) (time.Duration, bool) {
	start := max(s.busyUntil, now)
	if int((start-now)/s.service) >= s.queue {
		s.dropped++
		return 0, false
	}
	s.busyUntil = start + s.service
	return s.busyUntil, true
}

// timed is an item due at a virtual time; seq orders equal times in the
// order they were queued.
type timed[T any] struct {
	at  time.Duration
	seq uint64
	v   T
}

// timedQueue is a min-heap of timed items (container/heap).
type timedQueue[T any] []timed[T]

func (h timedQueue[T]) Len() int { return len(h) }
func (h timedQueue[T]) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].seq < h[j].seq
}
func (h timedQueue[T]) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timedQueue[T]) Push(x any)   { *h = append(*h, x.(timed[T])) }
func (h *timedQueue[T]) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// after runs fn d of virtual time from now, between deliveries.
func (f *fabric) after(d time.Duration, fn func()) {
	f.seq++
	heap.Push(&f.events, timed[func()]{f.clock.now + d, f.seq, fn})
}

type node struct {
	f    *fabric
	addr netip.AddrPort
	e    *Engine
	mrs  *mr.Table
	pd   *mr.PD
}

func newFabric(t *testing.T) *fabric {
	return &fabric{t: t, clock: &vclock{}, nodes: map[netip.Addr]*node{}, rng: rand.New(rand.NewPCG(1, 2))}
}

// Emit implements Output for one node.
type nodeOut struct{ n *node }

func (o nodeOut) Emit(pkts []OutPacket) {
	for _, p := range pkts {
		o.n.f.queue = append(o.n.f.queue, wirePkt{data: p.AppendPacket(nil), src: o.n.addr, dst: p.Dest, tos: p.TOS, ticked: o.n.f.ticking})
	}
}

func (f *fabric) node(addr string) *node {
	a := netip.MustParseAddr(addr)
	n := &node{f: f, addr: netip.AddrPortFrom(a, 4791), mrs: mr.NewTable()}
	cfg := Config{Local: a, Clock: f.clock, Out: nodeOut{n}, MRs: n.mrs}
	if f.engineCfg != nil {
		f.engineCfg(&cfg)
	}
	e, err := NewEngine(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	n.e = e
	n.pd = n.mrs.AllocPD()
	f.nodes[a] = n
	return n
}

// run delivers packets and fires timers until nothing is left to do or the
// virtual time limit passes. It returns the virtual time used.
func (f *fabric) run(limit time.Duration) {
	end := f.clock.now + limit
	for steps := 0; steps < 10_000_000; steps++ {
		if !f.step(end) {
			return
		}
	}
	f.t.Fatal("fabric: step limit reached")
}

// step does one round of work: it delivers the packets sent since the
// last round or, when there are none, moves the clock to the next timer,
// packet arrival or application event, if that is not after end, and
// runs what is due then. It reports whether it did anything.
func (f *fabric) step(end time.Duration) bool {
	if len(f.queue) > 0 {
		q := f.queue
		f.queue = nil
		if f.reorder > 0 {
			for i := 0; i+1 < len(q); i++ {
				if f.rng.Float64() < f.reorder {
					q[i], q[i+1] = q[i+1], q[i]
				}
			}
		}
		for _, p := range q {
			if f.drop != nil && f.drop(p) {
				f.dropped++
				continue
			}
			f.send(p)
			if f.dup > 0 && f.rng.Float64() < f.dup || f.dupIf != nil && f.dupIf(p) {
				f.send(p)
			}
		}
		f.flushBatches()
		return true
	}
	// Nothing sent: jump to the next timer, arrival or event.
	next := time.Duration(-1)
	for _, n := range f.nodes {
		if at, ok := n.e.NextDeadline(); ok && (next < 0 || at < next) {
			next = at
		}
	}
	if len(f.held) > 0 && (next < 0 || f.held[0].at < next) {
		next = f.held[0].at
	}
	if len(f.events) > 0 && (next < 0 || f.events[0].at < next) {
		next = f.events[0].at
	}
	if next < 0 || next > end {
		return false
	}
	if next > f.clock.now {
		f.clock.now = next
	}
	for len(f.held) > 0 && f.held[0].at <= f.clock.now {
		f.deliver(heap.Pop(&f.held).(timed[wirePkt]).v)
	}
	f.flushBatches()
	for len(f.events) > 0 && f.events[0].at <= f.clock.now {
		heap.Pop(&f.events).(timed[func()]).v()
	}
	f.ticking = true
	for _, n := range f.nodes {
		n.e.Tick()
	}
	f.ticking = false
	return true
}

// send puts p on the wire: delivered now, or held for its flight time.
func (f *fabric) send(p wirePkt) {
	if f.delay != nil {
		if d := f.delay(p); d > 0 {
			f.seq++
			heap.Push(&f.held, timed[wirePkt]{f.clock.now + d, f.seq, p})
			return
		}
	}
	f.deliver(p)
}

func (f *fabric) deliver(p wirePkt) {
	if f.mark != nil && f.mark(p) {
		p.tos |= 3
	}
	n, ok := f.nodes[p.dst.Addr()]
	if !ok {
		return
	}
	if s := f.slow[p.dst.Addr()]; s != nil && !p.served {
		at, ok := s.admit(f.clock.now)
		if !ok {
			f.dropped++
			return
		}
		p.served = true
		f.seq++
		heap.Push(&f.held, timed[wirePkt]{at, f.seq, p})
		return
	}
	pkt, err := bth.Parse(append([]byte(nil), p.data...))
	if err != nil {
		f.t.Fatalf("engine emitted an unparsable packet: %v", err)
	}
	if f.trace {
		fmt.Printf("%v %v -> %v %v psn=%d\n", f.clock.now, p.src, p.dst, pkt.Info.Name, pkt.BTH().PSN())
	}
	f.delivered++
	if f.tap != nil {
		f.tap(p, pkt)
	}
	in := InPacket{Pkt: pkt, Src: p.src, TOS: p.tos, Dest: p.dst.Addr()}
	if f.batch {
		if f.batched == nil {
			f.batched = map[*node][]InPacket{}
		}
		if len(f.batched[n]) == 0 {
			f.batchOrd = append(f.batchOrd, n)
		}
		f.batched[n] = append(f.batched[n], in)
		return
	}
	n.e.Input([]InPacket{in})
}

// flushBatches gives each engine the packets batch mode held for it.
func (f *fabric) flushBatches() {
	for _, n := range f.batchOrd {
		n.e.Input(f.batched[n])
		f.batched[n] = nil
	}
	f.batchOrd = f.batchOrd[:0]
}

// endpoint bundles a QP and its CQs for tests.
type endpoint struct {
	n    *node
	qp   *QP
	scq  *CQ
	rcq  *CQ
	attr InitAttr
}

func (n *node) newQP(t *testing.T, typ Type, depth int) *endpoint {
	t.Helper()
	scq, _ := NewCQ(depth * 4)
	rcq, _ := NewCQ(depth * 4)
	a := InitAttr{Type: typ, PD: n.pd, SendCQ: scq, RecvCQ: rcq, Caps: Caps{MaxSendWR: depth, MaxRecvWR: depth, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 256}}
	q, err := n.e.Create(a)
	if err != nil {
		t.Fatal(err)
	}
	return &endpoint{n: n, qp: q, scq: scq, rcq: rcq, attr: a}
}

type connOpts struct {
	mtu                        MTU
	apsn, bpsn                 uint32
	timeout, retry, rnr, minRN uint8
	rdAtomic                   uint8
	// noAccess are remote access flags the QPs' responders do not allow.
	noAccess mr.Access
}

func defaultConn() connOpts {
	return connOpts{mtu: MTU1024, apsn: 100, bpsn: 5000, timeout: 14, retry: 7, rnr: 7, minRN: 1, rdAtomic: 16}
}

const allAccess = mr.LocalWrite | mr.RemoteWrite | mr.RemoteRead | mr.RemoteAtomic

// connect brings two RC or UC endpoints to RTS facing each other.
func connect(t *testing.T, a, b *endpoint, o connOpts) {
	t.Helper()
	bring := func(x, y *endpoint, sq, rq uint32) {
		typ := x.qp.Type()
		if err := x.qp.Modify(&Attr{State: Init, AccessFlags: allAccess &^ o.noAccess, Port: 1}, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags); err != nil {
			t.Fatal(err)
		}
		rtr := &Attr{State: RTR, PathMTU: o.mtu, DestQPN: y.qp.Num(), RQPSN: rq, Dest: y.n.addr, MaxDestRdAtomic: o.rdAtomic, MinRNRTimer: o.minRN}
		mask := AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN
		if typ == RC {
			mask |= AttrMaxDestRdAtomic | AttrMinRNRTimer
		}
		if err := x.qp.Modify(rtr, mask); err != nil {
			t.Fatal(err)
		}
		rts := &Attr{State: RTS, SQPSN: sq, Timeout: o.timeout, RetryCnt: o.retry, RNRRetry: o.rnr, MaxRdAtomic: o.rdAtomic}
		mask = AttrState | AttrSQPSN
		if typ == RC {
			mask |= AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic
		}
		if err := x.qp.Modify(rts, mask); err != nil {
			t.Fatal(err)
		}
	}
	bring(a, b, o.apsn, o.bpsn)
	bring(b, a, o.bpsn, o.apsn)
}

func (n *node) reg(t *testing.T, size int, acc mr.Access) (*mr.MR, []byte) {
	t.Helper()
	buf := make([]byte, size)
	m, err := n.pd.Register(buf, acc)
	if err != nil {
		t.Fatal(err)
	}
	return m, buf
}

func sge(m *mr.MR, off, n int) []SGE {
	return []SGE{{Addr: m.IOVA() + uint64(off), Length: uint32(n), LKey: m.LKey()}}
}

func pollAll(cq *CQ) []WC {
	var out []WC
	buf := make([]WC, 64)
	for {
		n := cq.Poll(buf)
		if n == 0 {
			return out
		}
		out = append(out, buf[:n]...)
	}
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// parse decodes a packet on the fabric; the engine only emits parsable ones.
func parse(t *testing.T, p wirePkt) bth.Packet {
	t.Helper()
	pkt, err := bth.Parse(append([]byte(nil), p.data...))
	if err != nil {
		t.Fatalf("unparsable packet on the fabric: %v", err)
	}
	return pkt
}

// runFor runs the fabric for exactly d of virtual time: unlike run, it
// moves the clock to the end even when the network is idle before then.
func (f *fabric) runFor(d time.Duration) {
	end := f.clock.now + d
	f.run(d)
	if f.clock.now < end {
		f.clock.now = end
		for _, n := range f.nodes {
			n.e.Tick()
		}
		f.run(0)
	}
}
