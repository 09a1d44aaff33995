package qp

import (
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/reth"
	"github.com/rxego/rxego/transport"
)

// sentPkt is what turnRecorder keeps of one packet the engine emitted.
type sentPkt struct {
	qpn  uint32
	size int
	// adjacent: the packet's bytes start where the previous packet's in
	// the same Emit end (the Output can send both in one GSO run).
	adjacent bool
}

// turnRecorder is an Output that records the shape of every batch: its
// packets and what transport.Coalesce makes of them.
type turnRecorder struct {
	pkts      []sentPkt
	emits     int
	datagrams []int // GSO segments of each datagram Coalesce made
}

func (r *turnRecorder) Emit(pkts []OutPacket) {
	r.emits++
	msgs := make([]transport.Message, len(pkts))
	for i, p := range pkts {
		adj := i > 0 && unsafe.SliceData(pkts[i-1].Buf[len(pkts[i-1].Buf):cap(pkts[i-1].Buf)]) == unsafe.SliceData(p.Buf)
		r.pkts = append(r.pkts, sentPkt{qpn: p.QPN, size: len(p.Buf), adjacent: adj})
		msgs[i] = transport.Message{Buf: p.Buf, Peer: p.Dest, TOS: p.TOS}
	}
	// Every QP leaves from a source port of its own, as a device's QPs
	// spread over its source ports off loopback (with one port, Coalesce
	// also runs packets of different QPs to one peer together).
	for _, m := range transport.Coalesce(msgs, transport.MaxSourcePorts) {
		segs := 1
		if m.Seg > 0 {
			segs = (len(m.Buf) + m.Seg - 1) / m.Seg
		}
		r.datagrams = append(r.datagrams, segs)
	}
}

func (r *turnRecorder) reset() { *r = turnRecorder{} }

// run is a stretch of one QP's packets, each adjacent to the one before.
type run struct {
	qpn         uint32
	pkts, bytes int
}

// runs splits the recorded packets into runs. A run the engine cut only
// because its slab filled (the next Emit goes on with the same QP) counts
// as one.
func (r *turnRecorder) runs() []run {
	var out []run
	for _, p := range r.pkts {
		if n := len(out); n > 0 && out[n-1].qpn == p.qpn {
			out[n-1].pkts++
			out[n-1].bytes += p.size
			continue
		}
		out = append(out, run{qpn: p.qpn, pkts: 1, bytes: p.size})
	}
	return out
}

// turnsSetup connects nqp RC QPs of node A to node B with the given
// window, congestion control off, and returns them with A's recorder.
// Nothing A sends is delivered: the tests answer with ACKs they make.
func turnsSetup(t *testing.T, nqp, window int) (*fabric, []*endpoint, *turnRecorder) {
	t.Helper()
	f := newFabric(t)
	rec := &turnRecorder{}
	aAddr := netip.MustParseAddr("198.18.0.1")
	f.engineCfg = func(c *Config) {
		c.Window = window
		c.Congestion = &CongestionConfig{Off: true}
		if c.Local == aAddr {
			c.Out = rec
		}
	}
	na, nb := f.node(aAddr.String()), f.node("198.18.0.2")
	eps := make([]*endpoint, nqp)
	for i := range eps {
		eps[i] = na.newQP(t, RC, 64)
		connect(t, eps[i], nb.newQP(t, RC, 64), defaultConn())
	}
	return f, eps, rec
}

// ackFor makes the ACK of PSN psn that A's QP q would get from its peer.
func ackFor(q *endpoint, peer netip.AddrPort, psn bth.PSN) InPacket {
	pkt := make([]byte, bth.Len+reth.AETHLen+bth.ICRCLen)
	h := bth.BTH(pkt)
	h.SetOpcode(bth.RCAck)
	h.SetPKey(bth.DefaultPKey)
	h.SetDestQP(q.qp.Num())
	h.SetPSN(psn)
	reth.AETH(pkt[bth.Len:]).Set(reth.ACKSyndrome(reth.CreditsInvalid), 0)
	p, err := bth.Parse(pkt)
	if err != nil {
		panic(err)
	}
	return InPacket{Pkt: p, Src: peer, Dest: q.n.addr.Addr()}
}

// TestTurnsKeepEachQPsPacketsAdjacent: a received batch with two ACKs
// for each of eight window-limited QPs, interleaved (as when the receive
// loop reads several of the peer's ACK batches at once), lets each QP
// send one run of adjacent packets, which Coalesce sends as one GSO
// datagram per QP; kicking each QP as its ACK came made two runs of half
// the length per QP.
func TestTurnsKeepEachQPsPacketsAdjacent(t *testing.T) {
	const nqp, window, size = 8, 16, 64 << 10
	_, eps, rec := turnsSetup(t, nqp, window)
	src, _ := eps[0].n.reg(t, size, allAccess)
	for _, ep := range eps {
		ep.post(t, SendWR{Opcode: WRWrite, Flags: SendSignaled, SGL: sge(src, 0, size), RemoteAddr: 1 << 20, RKey: 0x100})
	}
	if got := len(rec.pkts); got != nqp*window {
		t.Fatalf("the posts sent %d packets, want a window of %d for each of %d QPs", got, window, nqp)
	}
	rec.reset()
	first := bth.PSN(defaultConn().apsn)
	peer := netip.AddrPortFrom(netip.MustParseAddr("198.18.0.2"), 4791)
	var batch []InPacket
	for _, upTo := range []int{window/2 - 1, window - 1} {
		for _, ep := range eps {
			batch = append(batch, ackFor(ep, peer, first.Add(upTo)))
		}
	}
	eps[0].n.e.Input(batch)

	if rec.emits != 1 {
		t.Errorf("%d Emits for one received batch, want 1", rec.emits)
	}
	runs := rec.runs()
	if len(runs) != nqp {
		t.Fatalf("the batch has %d runs of one QP's packets, want %d (one per QP): %v", len(runs), nqp, runs)
	}
	seen := map[uint32]bool{}
	for _, r := range runs {
		if r.pkts != window || seen[r.qpn] {
			t.Fatalf("runs %v: want one run of %d packets per QP", runs, window)
		}
		seen[r.qpn] = true
	}
	for i, p := range rec.pkts {
		if i%window != 0 && !p.adjacent {
			t.Fatalf("packet %d of QP %d is not adjacent to the one before it in the slab", i, p.qpn)
		}
	}
	if len(rec.datagrams) != nqp {
		t.Fatalf("Coalesce made %d datagrams %v, want %d of %d segments", len(rec.datagrams), rec.datagrams, nqp, window)
	}
	for _, segs := range rec.datagrams {
		if segs != window {
			t.Fatalf("Coalesce made datagrams of %v segments, want %d each", rec.datagrams, window)
		}
	}
}

// TestTurnsAreFair: when one received batch opens a large window for
// each of four QPs, they take turns of turnPackets in round-robin order:
// none sends a second turn before every other QP with work had its first,
// every turn but a QP's last is full, and each full turn is turnDatagrams
// GSO datagrams (but where the slab filled and cut one).
func TestTurnsAreFair(t *testing.T) {
	const nqp, window, mtu = 4, 1024, 1024
	const size = 2 * window * mtu // two windows: the posts send the first
	_, eps, rec := turnsSetup(t, nqp, window)
	src, _ := eps[0].n.reg(t, size, allAccess)
	for _, ep := range eps {
		ep.post(t, SendWR{Opcode: WRWrite, Flags: SendSignaled, SGL: sge(src, 0, size), RemoteAddr: 1 << 30, RKey: 0x100})
	}
	if got := len(rec.pkts); got != nqp*window {
		t.Fatalf("the posts sent %d packets, want a window of %d for each of %d QPs", got, window, nqp)
	}
	rec.reset()
	first := bth.PSN(defaultConn().apsn)
	peer := netip.AddrPortFrom(netip.MustParseAddr("198.18.0.2"), 4791)
	var batch []InPacket
	for _, ep := range eps {
		batch = append(batch, ackFor(ep, peer, first.Add(window-1)))
	}
	eps[0].n.e.Input(batch)

	runs := rec.runs()
	turn := turnPackets(mtu)
	perDatagram := turn / turnDatagrams
	sent := map[uint32]int{}
	datagrams := rec.emits - 1 // each Emit but the last may cut a run
	for i, r := range runs {
		sent[r.qpn] += r.pkts
		if want := eps[i%nqp].qp.Num(); r.qpn != want {
			t.Fatalf("run %d is QP %d's, want QP %d's (round robin): %v", i, r.qpn, want, runs)
		}
		last := i+nqp >= len(runs)
		if r.pkts > turn || !last && r.pkts != turn {
			t.Fatalf("run %d: %d packets, want turns of %d (less only for a QP's last): %v", i, r.pkts, turn, runs)
		}
		datagrams += (r.pkts + perDatagram - 1) / perDatagram
	}
	for _, ep := range eps {
		if got := sent[ep.qp.Num()]; got != window {
			t.Errorf("QP %d sent %d packets after the ACK, want %d", ep.qp.Num(), got, window)
		}
	}
	if len(runs) < 2*nqp {
		t.Fatalf("only %d runs: the test wants several turns per QP", len(runs))
	}
	if len(rec.datagrams) > datagrams {
		t.Errorf("Coalesce made %d datagrams of the turns, want at most %d (%d per full turn)", len(rec.datagrams), datagrams, turnDatagrams)
	}
}

// forwardRecorder records the batches an engine emits and passes them on.
type forwardRecorder struct {
	turnRecorder
	next Output
}

func (r *forwardRecorder) Emit(pkts []OutPacket) {
	r.turnRecorder.Emit(pkts)
	r.next.Emit(pkts)
}

// TestAcksOfManyQPsLeaveInOneEmit: the ACKs a received batch calls for,
// one per QP for eight QPs, reach the Output in one Emit (one sendmmsg
// on a device), not one each.
func TestAcksOfManyQPsLeaveInOneEmit(t *testing.T) {
	const nqp, size = 8, 512
	f := newFabric(t)
	f.batch = true
	rec := &forwardRecorder{}
	bAddr := netip.MustParseAddr("198.18.0.2")
	f.engineCfg = func(c *Config) {
		if c.Local == bAddr {
			rec.next, c.Out = c.Out, rec
		}
	}
	na, nb := f.node("198.18.0.1"), f.node(bAddr.String())
	eps := make([]*endpoint, nqp)
	for i := range eps {
		eps[i] = na.newQP(t, RC, 8)
		connect(t, eps[i], nb.newQP(t, RC, 8), defaultConn())
	}
	src, _ := na.reg(t, size, allAccess)
	dst, _ := nb.reg(t, size, allAccess)
	rec.reset()
	for _, ep := range eps {
		ep.post(t, SendWR{ID: 1, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(src, 0, size), RemoteAddr: dst.IOVA(), RKey: dst.RKey()})
	}
	f.step(f.clock.now) // B takes in the eight WRITEs in one Input
	if rec.emits != 1 || len(rec.pkts) != nqp {
		t.Fatalf("B answered one batch of %d WRITEs with %d Emits of %d packets in all, want 1 Emit of %d ACKs", nqp, rec.emits, len(rec.pkts), nqp)
	}
	f.run(time.Second)
	for _, ep := range eps {
		check(t, "WRITE", pollAll(ep.scq), want{1, WCSuccess, WCWrite})
	}
}
