// Package device is everything between a device's sockets and its
// engines: the shards (an engine, its send path and its Conns each), the
// receive scheduler that reads the sockets (sched.go), the demultiplexer
// that hands a packet the kernel could not steer to its QP's shard
// (shard.go), routing by source GID (route.go) and multicast input
// (mcast.go). Open composes them from a Config.
//
// It imports neither the root package nor its Device: the root package
// (rxego) keeps the verbs, opens a Device here and calls it. The engines
// (package qp) and the transport (package transport) are below it.
package device

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// Config is what Open composes a Device from. The root package fills it
// from its Options.
type Config struct {
	// GIDs is the GID table, Open's address first. With Conn it holds
	// one entry, which Open replaces by the Conn's address.
	GIDs []netip.AddrPort
	// Shards is how many shards to make (at least 1).
	Shards int
	// Transport are the sockets' options.
	Transport transport.Options
	// Conn, when set, is used instead of opening sockets: every shard
	// sends and receives through it.
	Conn transport.Conn
	// SourcePorts is rxego.Options.SourcePorts: 0 means
	// DefaultSourcePorts except on loopback, negative one port.
	SourcePorts int
	// Window, StallTime, DataTOS and Congestion configure the engines
	// (qp.Config).
	Window     int
	StallTime  time.Duration
	DataTOS    uint8
	Congestion *qp.CongestionConfig
	// BusyPoll is rxego.Options.BusyPoll.
	BusyPoll time.Duration
	// ZeroCopy is rxego.Options.ZeroCopy.
	ZeroCopy bool
	// Tap, when set, sees every packet from the start.
	Tap transport.Tap
	// MRs is the device-wide MR table the engines check keys against.
	MRs *mr.Table
	// Destroyed, when set, is called as each QP is destroyed (after the
	// device dropped the routes it set), under its engine's lock.
	Destroyed func(*qp.QP)
}

// DefaultSourcePorts is how many source ports a shard sends from by
// default (rxego.DefaultSourcePorts).
const DefaultSourcePorts = 8

// Device is the machinery of one rxego device: its shards, receive
// loops, routes and multicast groups.
type Device struct {
	shards []*shard
	rcvs   []*Receiver // one per Conn: per shard, or one for a given Conn
	demux  []*demux    // the Receivers' inputs on a sharded device
	conns  []transport.Conn
	local  netip.AddrPort
	gids   []netip.AddrPort // the GID table: local first (route.go)
	xrcvs  []*Receiver      // the Receivers of the GIDs after the first
	routes routeTable
	topts  transport.Options // the sockets' options; given set: a given Conn (no multicast)
	given  bool

	mcMu  sync.Mutex                 // guards mcast
	mcast map[netip.Addr]*mcastGroup // joined groups (mcast.go)
	// mcastLeft sums the counters of the group sockets closed when their
	// groups were left, so that the device's totals never go back.
	mcastLeft transport.Stats
	tap       transport.Tap // SetTap's, for the groups joined later

	stop   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool
	// parallel: Batch sends each shard's posts on the shard's sender
	// (parallelSend).
	parallel bool

	qpnMu sync.Mutex
	// qpnNext holds, per shard, the QP number CreateQP tries next there;
	// qpnShard is the shard of the next QP (they take turns).
	qpnNext  []uint32
	qpnShard int
}

// allLoopback reports whether every GID is a loopback address.
func allLoopback(gids []netip.AddrPort) bool {
	for _, g := range gids {
		if !g.Addr().IsLoopback() {
			return false
		}
	}
	return true
}

// readBudget sizes a shard's READ budget and READ request size
// (qp.Config.ReadBudget, ReadChunk; see qp/readsplit.go) from the receive
// buffer the kernel gave the socket its READ responses arrive on, shared
// by sharing shards: a quarter of it each, since the kernel counts every
// datagram at its buffer's true size, about twice a packet's payload,
// and the socket holds other traffic too; and no more than maxReadBudget,
// since what is in flight when a response is lost is sent twice. Requests
// are at most half the budget, so two can be in flight. A Conn that
// cannot tell leaves both to the engine (no budget).
func readBudget(c transport.Conn, sharing int) (budget, chunk int) {
	rb, ok := c.(transport.RecvBufferer)
	if !ok || rb.RecvBuffer() <= 0 {
		return 0, 0
	}
	budget = min(rb.RecvBuffer()/4/max(sharing, 1), maxReadBudget)
	return budget, min(qp.DefaultReadChunk, max(budget/2, 4096))
}

// maxReadBudget bounds a shard's READ responses in flight. The socket
// (a quarter of its buffer) is the bound that matters; this one only
// keeps a device with a huge buffer from asking for more than a fast
// path needs: 1 MiB keeps a READ at 40 Gbit/s over a round trip of
// 200 us (a loaded host's loopback). 256 KiB, the first choice, held a
// quiet 2-CPU machine's READ to 0.54-0.73x of what it did without a
// budget (bench/RESULTS.md, issue 29's sitting): requests waited for
// room half a million times a second. What a lost response costs is
// bounded by the congestion window, which the READ requests follow
// (qp/readsplit.go), not by this budget.
const maxReadBudget = 1 << 20

// initialWindow is the congestion window a device's QPs start with
// (qp.Config.InitialWindow), in PSNs: slow start opens it to
// Options.Window within a few round trips. Eight QPs starting at once
// with 64 each (rxe keeps up to 64 packets per QP in flight,
// RXE_INFLIGHT_SKBS_PER_QP_HIGH) overran an emulated rxe guest's NIC on a
// loaded host; 16, TCP's order of magnitude (RFC 6928: 10), did not.
const initialWindow = 16

// Open makes the device's sockets (or takes the given Conn), its engines
// and receive loops, and starts the loops and timers.
func Open(c Config) (*Device, error) {
	n := c.Shards
	gids := append([]netip.AddrPort(nil), c.GIDs...)
	local := gids[0]
	conns := []transport.Conn{c.Conn}
	var xconns [][]transport.Conn // per further GID, one Conn per shard
	if c.Conn == nil {
		topts := c.Transport
		switch {
		case topts.SourcePorts != 0: // set in the transport options themselves
		case c.SourcePorts == 0 && allLoopback(gids):
			// Loopback has no fabric to spread over and no RSS: the
			// ports would only cut GSO runs and split sendmmsg batches.
		case c.SourcePorts == 0:
			topts.SourcePorts = DefaultSourcePorts
		case c.SourcePorts > 0:
			topts.SourcePorts = c.SourcePorts
		}
		var err error
		if conns, xconns, err = listenGIDs(gids, topts, n); err != nil {
			return nil, err
		}
	} else {
		local = netip.AddrPortFrom(c.Conn.LocalAddr().Addr().Unmap(), c.Conn.LocalAddr().Port())
		gids[0] = local
	}
	all := conns
	for _, g := range xconns {
		all = append(all[:len(all):len(all)], g...)
	}
	maxMTU, err := gidsMTU(gids, c.Conn == nil)
	if err != nil {
		for _, c := range all {
			c.Close()
		}
		return nil, err
	}
	d := &Device{conns: all, local: local, gids: gids, stop: make(chan struct{}),
		topts: c.Transport, given: c.Conn != nil}
	if c.Tap != nil {
		d.SetTap(c.Tap)
	}
	var sendMu sync.Mutex // for a shared Conn: one sender at a time
	for i := range n {
		s := &shard{d: d, idx: i, conn: conns[min(i, len(conns)-1)], sendMu: &sendMu, zeroCopy: c.ZeroCopy}
		s.conns = []transport.Conn{s.conn}
		for _, g := range xconns {
			s.conns = append(s.conns, g[i])
		}
		if sp, ok := s.conn.(transport.SourcePorter); ok {
			s.ports = len(sp.SourcePorts())
		}
		if len(conns) > 1 {
			s.sendMu = new(sync.Mutex)
		}
		budget, chunk := readBudget(s.conn, n/len(conns))
		s.eng, err = qp.NewEngine(qp.Config{
			Local: local.Addr(), Port: local.Port(), Clock: qp.NewMonoClock(), Out: (*shardOut)(s), MRs: c.MRs,
			Window: c.Window, StallTime: c.StallTime, DataTOS: c.DataTOS, Congestion: c.Congestion, MaxMTU: maxMTU,
			ReadBudget: budget, ReadChunk: chunk, InitialWindow: initialWindow,
			Destroyed: func(q *qp.QP) {
				d.ForgetQP(q)
				if c.Destroyed != nil {
					c.Destroyed(q)
				}
			},
		})
		if err != nil {
			for _, c := range all {
				c.Close()
			}
			return nil, err
		}
		d.shards = append(d.shards, s)
	}
	d.qpnNext = make([]uint32, n)
	for s := range d.qpnNext {
		d.qpnNext[s] = d.firstQPNOf(s)
	}
	d.qpnShard = d.ShardOf(firstQPN)
	for i, cn := range conns {
		in := Input(d.shards[i].eng)
		if n > 1 {
			x := newDemux(d, i)
			d.demux = append(d.demux, x)
			in = x
		}
		d.rcvs = append(d.rcvs, NewReceiver(ReceiverConfig{Conn: cn, In: in, Local: local.Addr(), BusyPoll: c.BusyPoll, Stop: d.stop}))
	}
	// A further GID's sockets are read by their own goroutines only: CQs
	// attach to the first GID's Receivers (AttachCQ), and the completions
	// these take in wake a CQ's waiters as another shard's would.
	for g, cs := range xconns {
		for i, cn := range cs {
			in := Input(d.shards[i].eng)
			if n > 1 {
				in = newDemux(d, i)
			}
			d.xrcvs = append(d.xrcvs, NewReceiver(ReceiverConfig{Conn: cn, In: in, Local: gids[g+1].Addr(), Stop: d.stop}))
		}
	}
	for _, r := range append(d.rcvs[:len(d.rcvs):len(d.rcvs)], d.xrcvs...) {
		d.wg.Add(1)
		go func() { defer d.wg.Done(); r.Run() }()
	}
	for _, s := range d.shards {
		d.wg.Add(1)
		go func() { defer d.wg.Done(); s.eng.RunTimers(d.stop) }()
	}
	if d.parallel = parallelSend(n, len(conns)); d.parallel {
		for _, s := range d.shards {
			s.work, s.sent = make(chan struct{}), make(chan struct{}, 1)
			d.wg.Add(1)
			go func() { defer d.wg.Done(); s.runSender() }()
		}
	}
	return d, nil
}

// parallelProcs is the least GOMAXPROCS at which a device sends a batch's
// shards in parallel (Device.Batch). Below it the peer, the receive loops
// and the application already keep the CPUs busy, and a hand-off would
// add wake-ups and no CPU.
const parallelProcs = 4

// parallelSend reports whether a device of shards shards over sockets
// sockets sends a batch's shards in parallel: only where each shard has a
// socket of its own (a shared Conn sends one batch at a time anyway) and
// there are CPUs to do it on.
func parallelSend(shards, sockets int) bool {
	return shards > 1 && sockets == shards && runtime.GOMAXPROCS(0) >= parallelProcs
}

// firstQPN is the first QP number CreateQP hands out: 0 and 1 are the
// special QPs, and rxe starts its own at 17.
const firstQPN = 17

// activeMTU is the port's active MTU: the largest path MTU whose packets
// fit the MTU of the interface holding the device's address, as rxe takes
// it from its netdev (1500 gives 1024, loopback's 65536 gives 4096). A
// device on the unspecified address, or on a Conn it was given, has no one
// interface: 0, which the engine reads as 4096.
func activeMTU(local netip.AddrPort, own bool) (qp.MTU, error) {
	if !own || local.Addr().IsUnspecified() {
		return 0, nil
	}
	n, err := transport.InterfaceMTU(local.Addr())
	if err != nil {
		return 0, fmt.Errorf("rxego: open %v: %w", local, err)
	}
	m := qp.ActiveMTU(n)
	if m == 0 {
		return 0, fmt.Errorf("rxego: open %v: interface MTU %d is below the smallest RoCE MTU (256 + 80 bytes)", local, n)
	}
	return m, nil
}

// Stop stops the device: every engine sends the ACKs it holds and
// flushes and destroys its QPs, the loops are told to end, the sockets
// close and the multicast groups are left. It returns the first error of
// closing a socket. Wait waits for the goroutines.
func (d *Device) Stop() error {
	d.closed.Store(true)
	// Each engine sends the ACKs it still holds (for a reply that will
	// not come now: the peer would otherwise retransmit to a closed
	// port and, with retry_cnt 7, wait forever), then flushes and
	// destroys every QP, which leaves the CQs unused.
	for _, s := range d.shards {
		s.eng.Close()
	}
	close(d.stop)
	var err error
	for _, c := range d.conns {
		if e := c.Close(); err == nil {
			err = e
		}
	}
	d.leaveAll()
	return err
}

// Wait waits, after Stop, for the receive loops and timers to end and
// releases what the Receivers hold.
func (d *Device) Wait() {
	d.wg.Wait()
	for _, r := range append(d.rcvs, d.xrcvs...) {
		r.Close()
	}
}

// Local returns the address of GID 0 (a given Conn's address).
func (d *Device) Local() netip.AddrPort { return d.local }

// GIDs returns the GID table; the caller must not change it.
func (d *Device) GIDs() []netip.AddrPort { return d.gids }

// Shards returns how many shards the device has.
func (d *Device) Shards() int { return len(d.shards) }

// ShardOf returns the index of the shard QP number n lives on: its
// block's (transport.GroupMember), where the socket group steers it.
func (d *Device) ShardOf(n uint32) int { return transport.GroupMember(n, len(d.shards)) }

// MaxMTU returns the port's active MTU (qp.Engine.MaxMTU).
func (d *Device) MaxMTU() qp.MTU { return d.shards[0].eng.MaxMTU() }

// CreateQP creates a QP on its number's shard: the number asked for
// (a.QPN), or else the next free one of the next shard in turn. A shard's
// QPs take the numbers of its blocks (transport.QPNBlock) in order, so a
// sender may put packets of several of them in one GSO datagram
// (transport.Coalesce) and the kernel still steers it to this shard.
func (d *Device) CreateQP(a qp.InitAttr) (*qp.QP, error) {
	if a.QPN != 0 {
		return d.shards[d.ShardOf(a.QPN)].eng.Create(a)
	}
	d.qpnMu.Lock()
	defer d.qpnMu.Unlock()
	s := d.qpnShard
	d.qpnShard = (s + 1) % len(d.shards)
	for range 1 << 10 { // numbers in use are skipped; a full space gives up
		a.QPN = d.qpnNext[s]
		d.qpnNext[s] = d.nextQPNOf(a.QPN, s)
		q, err := d.shards[s].eng.Create(a)
		if err == nil || !errors.Is(err, qp.ErrQPNTaken) {
			return q, err
		}
	}
	return nil, errors.New("rxego: no free QP number")
}

// firstQPNOf is shard s's first QP number from firstQPN on.
func (d *Device) firstQPNOf(s int) uint32 {
	for b := uint32(0); ; b++ {
		if d.ShardOf(b<<transport.QPNBlockShift) != s {
			continue
		}
		if q := max(b<<transport.QPNBlockShift, firstQPN); q < (b+1)<<transport.QPNBlockShift {
			return q
		}
	}
}

// nextQPNOf is the QP number of shard s after q: the next in q's block,
// or the first of the shard's next block (every Shards-th), wrapping past
// the largest QP number.
func (d *Device) nextQPNOf(q uint32, s int) uint32 {
	q++
	if q%transport.QPNBlock == 0 {
		q += uint32(len(d.shards)-1) << transport.QPNBlockShift
	}
	if q > 0xffffff {
		return d.firstQPNOf(s)
	}
	return q
}

// NewSRQ makes a shared receive queue; it serves QPs of every shard.
func (d *Device) NewSRQ(pd *mr.PD, depth, maxSGE int) (*qp.SRQ, error) {
	return d.shards[0].eng.NewSRQ(pd, depth, maxSGE)
}

// AttachCQ gives cq the device's scheduling, with shard s (that of the
// first QP created with it) as its home: a goroutine waiting on the CQ
// reads that shard's socket itself. Call the function it returns with
// the shard of every QP created with cq (Attach).
func (d *Device) AttachCQ(cq *qp.CQ, s int) (use func(shard int)) {
	home := 0
	if len(d.rcvs) > 1 {
		home = s
	}
	mark := Attach(cq, d.rcvs, home)
	return func(shard int) {
		if len(d.rcvs) > 1 {
			mark(shard)
		}
	}
}

// Counters returns the sum of the shards' engine counters, read now.
func (d *Device) Counters() *qp.Counters {
	c := new(qp.Counters)
	for _, s := range d.shards {
		c.Add(&s.eng.Stats)
	}
	return c
}

// ShardCounters returns shard i's engine counters, live.
func (d *Device) ShardCounters(i int) *qp.Counters { return &d.shards[i].eng.Stats }

// HandedOn returns how many packets shard i's receive loop handed to
// another shard's engine (0 where the kernel steered every packet).
func (d *Device) HandedOn(i int) uint64 {
	if i >= len(d.demux) {
		return 0
	}
	return d.demux[i].handedOn.Load()
}

// SenderRuns returns how many batches shard i's sender built and sent
// for Batch (0 on a device that does not send in parallel).
func (d *Device) SenderRuns(i int) uint64 { return d.shards[i].senderRuns.Load() }

// QPs returns the device's QPs, in no particular order.
func (d *Device) QPs() []*qp.QP {
	var out []*qp.QP
	for _, s := range d.shards {
		out = append(out, s.eng.QPs()...)
	}
	return out
}

// Batch runs fn and sends the packets the posts inside it make together
// when it returns (qp.Engine.Batch), on every shard.
//
// On a device that sends in parallel (parallelSend), each shard a post
// went to builds and sends its packets on its own sender goroutine, the
// last one on the caller's, and Batch returns when all have sent: one
// goroutine posting to QPs of many shards then uses a CPU per shard, as
// an RNIC's send engines work in parallel behind one doorbell, where it
// built every shard's packets (copy, ICRC, sendmmsg) itself.
func (d *Device) Batch(fn func()) {
	if !d.parallel {
		d.batch(0, fn)
		return
	}
	for _, s := range d.shards {
		s.eng.BeginBatch()
	}
	defer d.endBatch()
	fn()
}

// batch runs fn inside the batches of shards i and on (qp.Engine.Batch),
// each sending its packets on the caller's goroutine.
func (d *Device) batch(i int, fn func()) {
	if i == len(d.shards) {
		fn()
		return
	}
	d.shards[i].eng.Batch(func() { d.batch(i+1, fn) })
}

// endBatch ends every shard's batch and runs those with work: each on its
// sender but the last, which the caller runs, then waits for the senders.
func (d *Device) endBatch() {
	var last *shard
	var handed uint64 // shards on their senders, by index (MaxGroup is 64)
	for _, s := range d.shards {
		if !s.eng.EndBatch() {
			continue
		}
		if last != nil && last.handOff() {
			handed |= 1 << last.idx
		}
		last = s
	}
	if last != nil {
		last.eng.RunBatch()
	}
	for handed != 0 {
		i := bits.TrailingZeros64(handed)
		handed &^= 1 << i
		d.shards[i].waitSent()
	}
}

// Sync waits until the engines have finished what they were doing
// (qp.Engine.Sync), ordering registered memory.
func (d *Device) Sync() {
	for _, s := range d.shards {
		s.eng.Sync()
	}
}

// SetTap installs t on every socket of the device, those of multicast
// groups joined later included.
func (d *Device) SetTap(t transport.Tap) {
	for _, c := range d.conns {
		c.SetTap(t)
	}
	d.mcMu.Lock()
	defer d.mcMu.Unlock()
	d.tap = t
	for _, g := range d.mcast {
		g.conn.SetTap(t)
	}
}

// TransportStats returns the sum of the counters of the device's Conns,
// the sockets of the multicast groups it has joined (and left) included.
func (d *Device) TransportStats() transport.Stats {
	var st transport.Stats
	for i, c := range d.conns {
		if i == 0 {
			st = c.Stats()
		} else {
			st.Add(c.Stats())
		}
	}
	d.mcMu.Lock()
	for _, g := range d.mcast {
		st.Add(g.conn.Stats()) // the joined groups' sockets
	}
	st.Add(d.mcastLeft) // and those of the groups left
	d.mcMu.Unlock()
	return st
}
