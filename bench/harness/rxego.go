package harness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"syscall"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/transport"
)

func init() {
	runners[RxegoBW] = rxegoBW
	runners[RxegoLat] = rxegoLat
	runners[RxegoRate] = rxegoRate
	runners[RxegoScale] = rxegoScale
}

// harnessTimeout is the QPs' ACK timeout exponent: 4.096 us * 2^16 = 268
// ms. perftest's 14 (67 ms) is shorter than the stalls a loaded two-CPU
// machine inflicts on a process; a timeout then resends the whole window,
// which measures the scheduler rather than the stack.
const harnessTimeout = 16

// busyPoll is how long a busy-polling device's receive loop spins after
// its last packet before it blocks.
const busyPoll = 200 * time.Microsecond

// benchWindow is the devices' window of unacknowledged PSNs per QP: 1,024
// where the default is 256. At MTU 1024 the default keeps only 256 KiB in
// flight, and the sender stops for every ACK; 1,024 PSNs are 1 MiB, what
// the default already allows at MTU 4096 (as perftest's -t sets a
// deeper send queue for a bandwidth run). The default stays low for slow
// peers such as rxe in an emulated guest.
const benchWindow = 1024

// openDevice opens p's rxego device (its shards and ZeroCopy as the case's
// Sched says) on a random loopback address (port 4791 must be free on
// it), retrying when the address is taken.
func openDevice(busy bool, p *peer) (*rxego.Device, error) {
	o := rxego.Options{Window: benchWindow, Shards: p.shards(), ZeroCopy: p.c.Sched.ZeroCopy}
	if busy {
		o.BusyPoll = busyPoll
	}
	var last error
	for range 50 {
		a := netip.AddrFrom4([4]byte{127, byte(100 + rand.IntN(100)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
		d, err := rxego.Open(a.String(), &o)
		if err == nil {
			return d, nil
		}
		last = err
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, last
}

// rxHello is what each side tells the other: where its device and QPs
// are, and (server) which memory the client may access.
type rxHello struct {
	Addr netip.AddrPort
	QPNs []uint32
	PSN  uint32
	VA   uint64
	RKey uint32
}

// rxSide is one side's device, memory and QPs.
type rxSide struct {
	// heapBefore is the live heap just before the QPs were made, when
	// rxSetup was asked to measure it.
	heapBefore uint64
	dev        *rxego.Device
	pd         *rxego.PD
	mr         *rxego.MR
	cq         *rxego.CQ
	qps        []*rxego.QP
}

func (s *rxSide) close() {
	if s.dev != nil {
		s.dev.Close()
	}
}

// rxSetup opens a device with nqp RC QPs and an MR of memSize bytes and
// connects them to the other side's. The client speaks first, so the
// server's QPs are at RTS before the client sends anything.
func rxSetup(p *peer, nqp, memSize, sendWR, recvWR, cqDepth int, measureHeap bool) (*rxSide, rxHello, error) {
	s := &rxSide{}
	var err error
	if s.dev, err = openDevice(p.c.Busy, p); err != nil {
		return s, rxHello{}, err
	}
	s.pd, _ = s.dev.AllocPD()
	s.mr, err = s.pd.RegMR(make([]byte, memSize), rxego.AccessLocalWrite|rxego.AccessRemoteWrite|rxego.AccessRemoteRead|rxego.AccessRemoteAtomic)
	if err != nil {
		return s, rxHello{}, err
	}
	if s.cq, err = s.dev.CreateCQ(cqDepth); err != nil {
		return s, rxHello{}, err
	}
	me := rxHello{Addr: s.dev.Addr(), PSN: rand.Uint32() & 0xffffff, VA: s.mr.IOVA(), RKey: s.mr.RKey(),
		QPNs: make([]uint32, 0, nqp)}
	s.qps = make([]*rxego.QP, 0, nqp)
	if measureHeap {
		s.heapBefore = heapInUse()
	}
	for range nqp {
		q, err := s.pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: s.cq, RecvCQ: s.cq,
			Caps: rxego.Caps{MaxSendWR: sendWR, MaxRecvWR: recvWR, MaxInlineData: 64}})
		if err != nil {
			return s, rxHello{}, err
		}
		if err := q.Init(0); err != nil {
			return s, rxHello{}, err
		}
		s.qps = append(s.qps, q)
		me.QPNs = append(me.QPNs, q.Num())
	}
	var them rxHello
	connect := func() error {
		if len(them.QPNs) != nqp {
			return fmt.Errorf("peer has %d QPs, want %d", len(them.QPNs), nqp)
		}
		for i, q := range s.qps {
			err := q.Connect(rxego.RemoteQP{Addr: them.Addr, QPN: them.QPNs[i], PSN: them.PSN},
				&rxego.ConnectOptions{MTU: mtuOf(p.c.MTU), LocalPSN: me.PSN, MaxRdAtomic: 16, Timeout: harnessTimeout, MinRNRTimer: 1})

			if err != nil {
				return err
			}
		}
		return nil
	}
	if p.server {
		if err := p.ctl.recv(&them); err != nil {
			return s, them, err
		}
		if err := connect(); err != nil {
			return s, them, err
		}
		return s, them, p.ctl.send(me)
	}
	if err := p.ctl.send(me); err != nil {
		return s, them, err
	}
	if err := p.ctl.recv(&them); err != nil {
		return s, them, err
	}
	return s, them, connect()
}

func mtuOf(n int) rxego.MTU {
	switch n {
	case 256:
		return rxego.MTU256
	case 512:
		return rxego.MTU512
	case 2048:
		return rxego.MTU2048
	case 4096:
		return rxego.MTU4096
	}
	return rxego.MTU1024
}

// waitCQ waits for completions: spinning on Poll when busy, else blocking.
func waitCQ(ctx context.Context, cq *rxego.CQ, wcs []rxego.WC, busy bool) (int, error) {
	if !busy {
		return cq.PollWait(ctx, wcs)
	}
	for i := 0; ; i++ {
		if n, err := cq.Poll(wcs); n > 0 || err != nil {
			return n, err
		}
		if i&63 == 63 {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			// A yield now and then, not at every poll: the UDP
			// yardstick's busy loop spins on read without one.
			runtime.Gosched()
		}
	}
}

// checkWCs fails on the first unsuccessful completion.
func checkWCs(wcs []rxego.WC) error {
	for _, wc := range wcs {
		if wc.Status != rxego.WCSuccess {
			return fmt.Errorf("completion of wr %d: %v", wc.ID, wc.Status)
		}
	}
	return nil
}

// caseTimeout bounds one side's work on a case.
func caseTimeout(c Case) time.Duration { return c.Warmup + c.Duration + 60*time.Second }

// allocMeter counts heap allocations between two points.
type allocMeter struct{ mallocs uint64 }

func (a *allocMeter) start() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	a.mallocs = ms.Mallocs
}

func (a *allocMeter) stop() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs - a.mallocs
}

// counters collects the engine and transport figures worth reporting.
func counters(d *rxego.Device) map[string]uint64 {
	e := d.Stats()
	t := d.Transport().Stats()
	var drops uint64
	for i := range e.Drops {
		drops += e.Drops[i]
	}
	return map[string]uint64{
		"sent_pkts": e.SentPkts, "rcvd_pkts": e.RcvdPkts, "retransmits": e.Retransmits,
		"rcvd_seq_err": e.RcvdSeqErr, "rnr_naks_sent": e.SendRNRErr, "engine_drops": drops,
		"window_cuts": e.WindowCuts, "read_budget_waits": e.ReadBudgetWaits,
		"gso_sends": t.GSOSends, "gso_segments": t.GSOSegments, "gro_batches": t.GROBatches,
		"send_calls": t.SendCalls, "recv_calls": t.RecvCalls, "overflow_drops": t.Drops[transport.DropOverflow],
		"parked_kicks": t.ParkedKicks, "quiets": t.Quiets, "rejoins": t.Rejoins,
	}
}

// packets is the engine's packet count in both directions.
func packets(d *rxego.Device) uint64 {
	return d.Stats().SentPkts + d.Stats().RcvdPkts
}

func opcodeOf(op string) (rxego.SendWR, error) {
	switch op {
	case "write":
		return rxego.SendWR{Opcode: rxego.WRWrite}, nil
	case "read":
		return rxego.SendWR{Opcode: rxego.WRRead}, nil
	case "send":
		return rxego.SendWR{Opcode: rxego.WRSend}, nil
	case "atomic":
		return rxego.SendWR{Opcode: rxego.WRFetchAdd, CompareAdd: 1}, nil
	}
	return rxego.SendWR{}, fmt.Errorf("unknown operation %q", op)
}

// rxegoBW: the client keeps Depth messages of Size bytes in flight on one
// QP for the measured interval, refilling the free slots with one post
// list each time completions come back; a SEND server keeps many more
// receives posted (recvDepth), so it rarely runs out while it reposts (an
// RNR NAK makes the client wait and resend).

// recvDepth is the receives a SEND server keeps posted for depth messages
// of size bytes in flight: like perftest's 512, fewer when that would take
// more than 64 MiB.
func recvDepth(depth, size int) int { return max(2*depth, min(512, (64<<20)/size)) }

// With QPs > 1 every QP keeps Depth messages in flight, each QP on its
// own Size bytes of both sides' memory (QPs of different shards never
// write the same bytes), all completing on one CQ; a SEND server keeps
// recvDepth receives posted per QP, as perftest keeps its rx_depth per
// QP, over recvDepth/QPs buffers per QP (receives share buffers, as
// perftest's do, so memory stays within recvDepth's bound). The engine
// acknowledges a SEND when it places it, not when the server reposts,
// so the client runs ahead of the server's reposting by up to what is
// posted: with recvDepth/QPs receives per QP, 16 QPs of SENDs at MTU
// 1024 took about 20,000 RNR NAKs and go-back-N resends a second.
func rxegoBW(p *peer) (Result, error) {
	c := p.c
	depth, nqp := c.Depth, max(1, c.QPs)
	recvs := recvDepth(depth, c.Size)
	slots := max(2*depth, recvs/nqp)
	mem := c.Size * nqp
	if p.server && c.Op == "send" {
		mem = c.Size * slots * nqp
	}
	s, them, err := rxSetup(p, nqp, mem, depth, recvs, (recvs+depth)*nqp+16, false)
	defer s.close()
	if err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout(c))
	defer cancel()
	if p.server {
		if c.Op == "send" {
			return serveRecvs(ctx, p, s, c.Size, recvs, slots)
		}
		return idleServer(p, s)
	}
	wr, err := opcodeOf(c.Op)
	if err != nil {
		return Result{}, err
	}
	lists := make([][]rxego.SendWR, nqp)
	for i := range s.qps {
		off := uint64(i * c.Size)
		wr.SGL = []rxego.SGE{{Addr: s.mr.IOVA() + off, Length: uint32(c.Size), LKey: s.mr.LKey()}}
		wr.RemoteAddr, wr.RKey, wr.Flags = them.VA+off, them.RKey, rxego.SendSignaled
		lists[i] = make([]rxego.SendWR, depth)
		for k := range lists[i] {
			lists[i][k] = wr
		}
	}
	// Each refill is one PostSend for all of a QP's free slots (a post
	// list); every WR is signaled.
	return s.keepInFlight(ctx, p, inFlight{lists: lists, depth: depth, perWC: 1, size: c.Size, poll: 64})
}

// inFlight is what a client keeps outstanding on its QPs: lists[i] holds
// QP i's work requests, of which one PostSend takes as many as fit in
// depth in whole multiples of perWC, the WRs each completion stands for
// (every perWC-th is signaled); size is each WR's payload; poll is how
// many completions one wait takes at most.
type inFlight struct {
	lists        [][]rxego.SendWR
	depth, perWC int
	size, poll   int
}

// keepInFlight is the client loop of the bandwidth and rate cases: it
// refills every QP's free slots, waits for completions, times the
// measured window (counting the messages completed in it, its packets
// and allocations), then lets the last messages complete, so the server
// sees no loss, and tells the server it is done.
func (s *rxSide) keepInFlight(ctx context.Context, p *peer, f inFlight) (Result, error) {
	qidx := make(map[uint32]int, len(s.qps))
	for i, q := range s.qps {
		qidx[q.Num()] = i
	}
	wcs := make([]rxego.WC, f.poll)
	var res Result
	var am allocMeter
	var pkts0 uint64
	w := p.newWindow()
	inflight := make([]int, len(s.qps))
	total := 0
	for {
		// Refill each QP with post lists for its free slots. With several
		// QPs, all QPs' posts go in one Device.Batch: their packets leave
		// together, in a few sendmmsg calls, instead of a call per QP
		// (with many QPs a poll returns few completions per QP, and a
		// call per post list made the system calls per byte grow with
		// the QP count). One QP's post lists go one by one: held in a
		// batch, its whole depth left at once and came back as one ACK,
		// a stop-and-wait that halved the blocking 64 B rate (a quiet
		// sitting: 1.5 against 3.0 M/s).
		var perr error
		refill := func() {
			for i, q := range s.qps {
				for {
					k := min(f.depth-inflight[i], len(f.lists[i])) / f.perWC * f.perWC
					if k <= 0 {
						break
					}
					if perr = q.PostSend(f.lists[i][:k]...); perr != nil {
						return
					}
					inflight[i] += k
					total += k
				}
			}
		}
		if len(s.qps) > 1 {
			s.dev.Batch(refill)
		} else {
			refill()
		}
		if perr != nil {
			return res, perr
		}
		done, err := s.complete(ctx, wcs, p.c.Busy)
		if err != nil {
			return res, err
		}
		for _, wc := range done {
			inflight[qidx[wc.QPN]] -= f.perWC
		}
		total -= len(done) * f.perWC
		res.Rounds += len(done) * f.perWC // every message done, warm-up's too (bench/roundtrips.sh)
		now := time.Now()
		was := w.on
		measuring, over := w.tick(now)
		if measuring && !was {
			am.start()
			pkts0 = packets(s.dev)
			continue // completions before the start do not count
		}
		if measuring {
			res.Msgs += uint64(len(done) * f.perWC)
		}
		if over {
			res.Elapsed = w.elapsed(now)
			res.CPU = p.cpu()
			res.Packets = packets(s.dev) - pkts0
			res.AllocsPerPkt = float64(am.stop()) / float64(max(res.Packets, 1))
			break
		}
	}
	res.Bytes = res.Msgs * uint64(f.size)
	for total > 0 {
		n, err := waitCQ(ctx, s.cq, wcs, p.c.Busy)
		if err != nil {
			return res, err
		}
		total -= n * f.perWC
	}
	return s.done(p, res)
}

// complete waits for completions on the side's CQ and fails on the
// first unsuccessful one.
func (s *rxSide) complete(ctx context.Context, wcs []rxego.WC, busy bool) ([]rxego.WC, error) {
	n, err := waitCQ(ctx, s.cq, wcs, busy)
	if err != nil {
		return nil, err
	}
	return wcs[:n], checkWCs(wcs[:n])
}

// done adds the side's counters to the client's result and tells the
// server the measurement is over.
func (s *rxSide) done(p *peer, res Result) (Result, error) {
	res.Counters = counters(s.dev)
	return res, p.ctl.send(signal{"done"})
}

// idleServer waits while the client works on the server's memory, then
// reports its counters and its CPU time over the client's measurement. A
// busy-polling server spins on its CQ meanwhile, which takes in and
// answers the client's packets on this goroutine, as a busy-polling
// perftest server does.
func idleServer(p *peer, s *rxSide) (Result, error) {
	w := p.ctl.watch()
	if p.c.Busy {
		wcs := make([]rxego.WC, 16)
		for i := 0; !w.stop.Load(); i++ {
			s.cq.Poll(wcs)
			if i&63 == 63 {
				runtime.Gosched() // as waitCQ
			}
		}
	}
	err := w.wait()
	return Result{Counters: counters(s.dev), CPU: w.cpu()}, err
}

// serveRecvs keeps depth receives of size bytes posted on each QP, over
// slots buffers per QP, until the client says it is done.
func serveRecvs(ctx context.Context, p *peer, s *rxSide, size, depth, slots int) (Result, error) {
	post := func(i int) error {
		q := i / depth
		buf := s.mr.IOVA() + uint64((q*slots+i%depth%slots)*size)
		return s.qps[q].PostRecv(rxego.RecvWR{ID: uint64(i), SGL: []rxego.SGE{{Addr: buf, Length: uint32(size), LKey: s.mr.LKey()}}})
	}
	for i := range depth * len(s.qps) {
		if err := post(i); err != nil {
			return Result{}, err
		}
	}
	stop := p.ctl.watch()
	ctx, cancel := stop.context(ctx)
	defer cancel()
	wcs := make([]rxego.WC, 64)
	for {
		done, err := s.complete(ctx, wcs, p.c.Busy)
		if err != nil {
			if stop.stop.Load() {
				<-stop.ended
				return Result{Counters: counters(s.dev), CPU: stop.cpu()}, nil
			}
			return Result{}, err
		}
		for _, wc := range done {
			if err := post(int(wc.ID)); err != nil {
				return Result{}, err
			}
		}
	}
}

// rxegoLat measures round trips of 64-byte operations, one at a time:
// SEND is a ping-pong (the server sends each message back); WRITE, READ
// and atomic fetch-and-add time a post to its completion.
func rxegoLat(p *peer) (Result, error) {
	c := p.c
	const size = 64
	s, them, err := rxSetup(p, 1, 4096, 16, 16, 64, false)
	defer s.close()
	if err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout(c))
	defer cancel()
	q := s.qps[0]
	wcs := make([]rxego.WC, 4)
	recv := rxego.RecvWR{SGL: []rxego.SGE{{Addr: s.mr.IOVA() + 2048, Length: size, LKey: s.mr.LKey()}}}
	send := rxego.SendWR{Opcode: rxego.WRSend, Flags: rxego.SendInline, Inline: make([]byte, size)}
	if c.Op == "send" {
		for range 8 {
			if err := q.PostRecv(recv); err != nil {
				return Result{}, err
			}
		}
	}
	if p.server {
		if c.Op != "send" {
			return idleServer(p, s)
		}
		stop := p.ctl.watch()
		sctx, scancel := stop.context(ctx)
		defer scancel()
		for {
			// Echo each message until the client says it is done.
			done, err := s.complete(sctx, wcs, c.Busy)
			if err != nil {
				if stop.stop.Load() {
					break
				}
				return Result{}, err
			}
			for range done {
				if err := q.PostRecv(recv); err != nil {
					return Result{}, err
				}
				if err := q.PostSend(send); err != nil {
					return Result{}, err
				}
			}
		}
		<-stop.ended
		return Result{Counters: counters(s.dev), CPU: stop.cpu()}, nil
	}
	wr, err := opcodeOf(c.Op)
	if err != nil {
		return Result{}, err
	}
	switch c.Op {
	case "send":
		wr = send
	case "atomic":
		wr.SGL = []rxego.SGE{{Addr: s.mr.IOVA(), Length: 8, LKey: s.mr.LKey()}}
		wr.RemoteAddr, wr.RKey, wr.Flags = them.VA, them.RKey, rxego.SendSignaled
	default:
		wr.SGL = []rxego.SGE{{Addr: s.mr.IOVA(), Length: size, LKey: s.mr.LKey()}}
		wr.RemoteAddr, wr.RKey, wr.Flags = them.VA+1024, them.RKey, rxego.SendSignaled
	}
	res, err := p.roundTrips(func() error {
		if err := q.PostSend(wr); err != nil {
			return err
		}
		if _, err := s.complete(ctx, wcs[:1], c.Busy); err != nil {
			return err
		}
		if c.Op == "send" {
			if err := q.PostRecv(recv); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	return s.done(p, res)
}

// rxegoRate keeps Depth 64-byte inline WRITEs in flight.
func rxegoRate(p *peer) (Result, error) {
	c := p.c
	const size = 64
	rateBatch := c.rateBatch()
	depth, nqp := max(c.Depth/rateBatch*rateBatch, rateBatch), max(1, c.QPs)
	s, them, err := rxSetup(p, nqp, 4096*nqp, depth, 16, 64*nqp, false)
	defer s.close()
	if err != nil {
		return Result{}, err
	}
	if p.server {
		return idleServer(p, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout(c))
	defer cancel()
	// Each QP writes its own 64 bytes of the server's memory, Depth WRITEs
	// in flight per QP, in post lists of rateBatch, the last of each
	// signaled.
	lists := make([][]rxego.SendWR, nqp)
	payload := make([]byte, size)
	for i := range s.qps {
		lists[i] = make([]rxego.SendWR, rateBatch)
		for k := range lists[i] {
			lists[i][k] = rxego.SendWR{Opcode: rxego.WRWrite, Flags: rxego.SendInline, Inline: payload,
				RemoteAddr: them.VA + uint64(i*4096), RKey: them.RKey}
		}
		lists[i][rateBatch-1].Flags |= rxego.SendSignaled
	}
	return s.keepInFlight(ctx, p, inFlight{lists: lists, depth: depth, perWC: rateBatch, size: size, poll: 16})
}
