package qp

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/congestion"
	"github.com/rxego/rxego/mr"
)

// TestCNPLoop marks every packet CE on the way to the responder: the
// responder's notification point answers with CNPs (at most one per
// min_time_between_cnps), the requester's reaction point cuts its rate,
// the pacer spaces packets out, and the data still arrives intact; afterwards the rate recovers.
func TestCNPLoop(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	f.mark = func(p wirePkt) bool { return p.dst.Addr() == b.n.addr.Addr() }
	const size = 256 << 10
	smr, sbuf := a.n.reg(t, size, allAccess)
	rmr, rbuf := b.n.reg(t, size, allAccess)
	fill(sbuf, 3)
	start := f.clock.now
	for i := 0; i < 4; i++ {
		if err := a.qp.PostSend(SendWR{ID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGL: sge(smr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	f.run(10 * time.Second)
	wcs := pollAllCheck(t, a.scq)
	if len(wcs) != 4 {
		t.Fatalf("%d completions", len(wcs))
	}
	b.n.e.Sync()
	if string(rbuf) != string(sbuf) {
		t.Fatal("data differs")
	}
	st, ok := a.qp.CongestionStats()
	bs, _ := b.qp.CongestionStats()
	if !ok || st.CNPsRcvd == 0 || bs.CNPsSent != st.CNPsRcvd || bs.CEMarked == 0 || st.RateCuts == 0 {
		t.Fatalf("requester %+v, responder %+v", st, bs)
	}
	// Paced: 1 MiB cannot have gone faster than the rate allowed.
	el := f.clock.now - start
	// Idle, the requester lets its rate timer lapse: no timer is left...
	if st.Rate == DefaultLineRate {
		t.Fatalf("rate back at line rate while still congested: %+v", st)
	}
	if at, ok := a.n.e.NextDeadline(); ok {
		t.Fatalf("an idle requester still has a timer at %v", at)
	}
	// ...yet time raises its rate back to line rate all the same.
	f.runFor(10 * time.Second)
	if st, _ = a.qp.CongestionStats(); st.Rate != DefaultLineRate {
		t.Fatalf("rate %d did not recover to line rate after marking stopped", st.Rate)
	}
	// At line rate the payload alone takes lineTime; the cut rates must
	// have made it take several times that.
	lineTime := time.Duration(4 * size * 8 * uint64(time.Second) / DefaultLineRate)
	if el < 4*lineTime {
		t.Fatalf("1 MiB took %v of virtual time (%v at line rate): not paced", el, lineTime)
	}
	if a.n.e.Stats.CNPsReceived.Load() != bs.CNPsSent {
		t.Fatalf("engine counted %d CNPs, QP %d", a.n.e.Stats.CNPsReceived.Load(), bs.CNPsSent)
	}
	t.Logf("virtual time %v, requester %+v, responder sent %d CNPs for %d marks", el, st, bs.CNPsSent, bs.CEMarked)
}

// ccPair is pair(t, RC, defaultConn()) with the requester's reaction point
// configured by rp.
func ccPair(t *testing.T, rp congestion.Params) (*fabric, *endpoint, *endpoint) {
	t.Helper()
	f := newFabric(t)
	na, nb := f.node("198.18.0.1"), f.node("198.18.0.2")
	e, err := NewEngine(Config{Local: na.addr.Addr(), Clock: f.clock, Out: nodeOut{na}, MRs: na.mrs, Congestion: &CongestionConfig{RP: rp}})
	if err != nil {
		t.Fatal(err)
	}
	na.e = e
	a, b := na.newQP(t, RC, 64), nb.newQP(t, RC, 64)
	connect(t, a, b, defaultConn())
	return f, a, b
}

// TestPacedReleasesBatches checks that a paced QP releases its packets
// several at a time: the pace timer waits until half a burst may leave
// rather than waking for every packet (which in real time would mean a
// system call per packet). Packets that reach the wire at the same virtual
// instant left in one Emit.
func TestPacedReleasesBatches(t *testing.T) {
	// The requester's rate must stay cut while the test watches: the
	// timer is off, so only bytes sent raise it (by 5 Mb/s per MB).
	rp := congestion.PaperParams(DefaultLineRate)
	rp.TimeReset = 0
	f, a, b := ccPair(t, rp)
	f.mark = func(p wirePkt) bool { return p.dst.Addr() == b.n.addr.Addr() }
	const size = 256 << 10
	smr, _ := a.n.reg(t, size, allAccess)
	rmr, _ := b.n.reg(t, size, allAccess)
	write := func() {
		t.Helper()
		if err := a.qp.PostSend(SendWR{Opcode: WRWrite, Flags: SendSignaled, SGL: sge(smr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
			t.Fatal(err)
		}
		f.run(10 * time.Second)
		if wcs := pollAllCheck(t, a.scq); len(wcs) != 1 {
			t.Fatalf("%d completions", len(wcs))
		}
	}
	// The marks cut the rate a little more with each message.
	var st CCStats
	for i := 0; i < 50; i++ {
		write()
		if st, _ = a.qp.CongestionStats(); st.Rate < DefaultLineRate/100 {
			break
		}
	}
	if st.Rate >= DefaultLineRate/100 {
		t.Fatalf("rate not cut: %+v", st)
	}
	instants := map[time.Duration]int{}
	pkts := 0
	f.tap = func(p wirePkt, pkt bth.Packet) {
		if p.dst.Addr() == b.n.addr.Addr() && pkt.Info.Class == bth.RC {
			instants[f.clock.now]++
			pkts++
		}
	}
	write() // paced from the start
	if pkts < size/1024 || pkts < 4*len(instants) {
		t.Fatalf("%d packets left at %d instants: paced packets are not batched", pkts, len(instants))
	}
	t.Logf("%d packets at %d instants (rate %d b/s)", pkts, len(instants), st.Rate)
}

// TestCNPGoesToRoCEPort feeds the responder a CE-marked packet from a
// source port other than 4791, as rxe and NICs send from (0xC000 | a flow
// hash): the CNP must go to the requester's RoCE port, where something
// listens, not back to that source port.
func TestCNPGoesToRoCEPort(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	var data []byte
	f.tap = func(p wirePkt, _ bth.Packet) {
		if data == nil && p.dst == b.n.addr {
			data = append([]byte(nil), p.data...)
		}
	}
	smr, _ := a.n.reg(t, 64, allAccess)
	rmr, _ := b.n.reg(t, 64, allAccess)
	if err := a.qp.PostSend(SendWR{Opcode: WRWrite, Flags: SendSignaled, SGL: sge(smr, 0, 64), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	f.run(time.Second)
	if data == nil {
		t.Fatal("no packet reached the responder")
	}
	pkt, err := bth.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	src := netip.AddrPortFrom(a.n.addr.Addr(), 0xC123)
	b.n.e.Input([]InPacket{{Pkt: pkt, Src: src, TOS: 3, Dest: b.n.addr.Addr()}})
	cnps := 0
	for _, w := range f.queue {
		p, err := bth.Parse(w.data)
		if err != nil || p.Info.Class != bth.CNP {
			continue
		}
		cnps++
		if w.dst != a.n.addr {
			t.Errorf("CNP sent to %v, want the requester's RoCE address %v", w.dst, a.n.addr)
		}
		if h := p.BTH(); h.DestQP() != a.qp.Num() || !h.BECN() {
			t.Errorf("CNP to QP %d BECN %v, want QP %d with BECN", h.DestQP(), h.BECN(), a.qp.Num())
		}
	}
	if cnps != 1 {
		t.Fatalf("%d CNPs for one marked packet", cnps)
	}
}

// TestPacingWhileTheRateChanges paces a QP whose rate changes every 50 us
// (a rate-increase event each timer period): each change may bring the
// next batch forward but must not put it off, or the QP would wait for a
// batch that never comes. The transfer must run at about the paced rate.
func TestPacingWhileTheRateChanges(t *testing.T) {
	rp := congestion.PaperParams(DefaultLineRate)
	rp.TimeReset, rp.ByteReset = 50*time.Microsecond, 0
	rp.AIRate, rp.Threshold = 1000, 1 // +1 kb/s per event: the rate creeps
	rp.AlphaPeriod = time.Hour        // alpha stays 1: every CNP halves
	f, a, b := ccPair(t, rp)
	const size = 256 << 10
	smr, _ := a.n.reg(t, size, allAccess)
	rmr, _ := b.n.reg(t, size, allAccess)
	write := func() time.Duration { t.Helper(); return pacedWrite(t, f, a, smr, rmr, size) }
	// Marks cut the rate to a few hundred Mb/s.
	f.mark = func(p wirePkt) bool { return p.dst.Addr() == b.n.addr.Addr() }
	for i := 0; i < 50; i++ {
		write()
		if st, _ := a.qp.CongestionStats(); st.Rate < 500*congestion.Mbps {
			break
		}
	}
	f.mark = nil
	st, _ := a.qp.CongestionStats()
	if st.Rate >= 500*congestion.Mbps {
		t.Fatalf("rate not cut: %+v", st)
	}
	el := write()
	after, _ := a.qp.CongestionStats()
	// The payload at the slower of the two rates, plus headers (1024-byte
	// MTU: under 10 %).
	want := time.Duration(float64(size*8) / float64(st.Rate) * float64(time.Second) * 1.1)
	t.Logf("256 KiB in %v at %d..%d b/s (%v at the start rate)", el, st.Rate, after.Rate, want)
	if el > want {
		t.Fatalf("256 KiB took %v at %d b/s or more: the pacer fell behind its rate", el, st.Rate)
	}
}

// TestCNPsOfABatchEachCut takes in, as one batch, 20 CNPs that queued
// over the millisecond since the engine last took any in (a train 50 µs
// apart, as `rxego probe`'s cnp-rate sends): each is a rate cut, as at a
// reaction point that takes each CNP when it arrives. Stamped with the
// batch's one time, they fell in one rate-reduce monitor period and
// counted as one cut (two with the one that period defers).
func TestCNPsOfABatchEachCut(t *testing.T) {
	f, a, b := ccPair(t, congestion.NVIDIAParams(DefaultLineRate))
	a.n.e.Input(nil) // the previous batch
	f.clock.now += time.Millisecond
	const cnps = 20
	batch := make([]InPacket, cnps)
	for i := range batch {
		batch[i] = cnpFor(t, a, b)
	}
	a.n.e.Input(batch)
	st, ok := a.qp.CongestionStats()
	if !ok || st.CNPsRcvd != cnps {
		t.Fatalf("reaction point %+v, want %d CNPs", st, cnps)
	}
	if st.RateCuts != cnps {
		t.Errorf("%d rate cuts for %d CNPs that arrived 50 µs apart, want one each (%+v)", st.RateCuts, cnps, st)
	}
	if st.Rate >= DefaultLineRate/2 {
		t.Errorf("rate %d after %d cuts, want well under half the line rate %d", st.Rate, cnps, DefaultLineRate)
	}
}

// pacedWrite WRITEs size bytes of smr to rmr from a's QP, signaled, and
// returns the virtual time until its completion. run stops when nothing is
// left to do; a rate timer keeps ticking while paced data waits, so the
// run is bounded by the completion instead.
func pacedWrite(t *testing.T, f *fabric, a *endpoint, smr, rmr *mr.MR, size int) time.Duration {
	t.Helper()
	start := f.clock.now
	if err := a.qp.PostSend(SendWR{Opcode: WRWrite, Flags: SendSignaled, SGL: sge(smr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000 && a.scq.Len() == 0; i++ {
		f.run(time.Millisecond)
		f.runFor(0)
	}
	if wcs := pollAllCheck(t, a.scq); len(wcs) != 1 {
		t.Fatalf("%d completions", len(wcs))
	}
	return f.clock.now - start
}

// cnpFor returns a CNP for to's QP as from's peer sends it: from a flow's
// source port, not 4791.
func cnpFor(t *testing.T, to, from *endpoint) InPacket {
	t.Helper()
	buf := make([]byte, 64)
	h := bth.Header{Opcode: bth.CNPOpcode, PKey: bth.DefaultPKey, DestQP: to.qp.Num(), BECN: true}
	n, err := h.Encode(buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	pkt, err := bth.Parse(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	return InPacket{Pkt: pkt, Src: netip.AddrPortFrom(from.n.addr.Addr(), 0xC000), Dest: to.n.addr.Addr()}
}

// TestQuietReactionPoint: a QP at line rate with nothing pending leaves
// its reaction point alone for each packet (ccQuiet); a CNP wakes it and
// the next message is paced at the cut rate; once time has raised the
// rate back to line rate, the next message finds it quiet again.
func TestQuietReactionPoint(t *testing.T) {
	f, a, b := ccPair(t, congestion.NVIDIAParams(DefaultLineRate))
	const size = 256 << 10
	smr, sbuf := a.n.reg(t, size, allAccess)
	rmr, rbuf := b.n.reg(t, size, allAccess)
	write := func(seed uint64) time.Duration {
		t.Helper()
		fill(sbuf, seed)
		el := pacedWrite(t, f, a, smr, rmr, size)
		b.n.e.Sync()
		if !bytes.Equal(rbuf, sbuf) {
			t.Fatal("data differs")
		}
		return el
	}
	write(1)
	if !a.qp.ccQuiet {
		t.Fatal("a QP at line rate is not quiet")
	}
	a.n.e.Input([]InPacket{cnpFor(t, a, b)})
	if a.qp.ccQuiet {
		t.Fatal("still quiet after a CNP")
	}
	st, _ := a.qp.CongestionStats()
	if st.Rate >= DefaultLineRate || st.RateCuts != 1 {
		t.Fatalf("after a CNP: %+v", st)
	}
	el := write(2)
	if lineTime := time.Duration(size * 8 * uint64(time.Second) / DefaultLineRate); el < 3*lineTime/2 {
		t.Fatalf("256 KiB took %v after a cut to %d b/s (%v at line rate): not paced", el, st.Rate, lineTime)
	}
	f.runFor(10 * time.Second)
	if st, _ = a.qp.CongestionStats(); st.Rate != DefaultLineRate {
		t.Fatalf("rate %d did not recover", st.Rate)
	}
	write(3)
	if !a.qp.ccQuiet {
		t.Fatal("not quiet again at line rate")
	}
}
