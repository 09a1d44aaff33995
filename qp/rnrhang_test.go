package qp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/reth"
)

// roundsRig is issue 16's workload: A runs rounds of WRITE 4 KiB, READ
// 4 KiB back, SEND 1 KiB and FETCH_ADD against B, each round verified;
// B keeps one receive posted and reposts it 300 us after each
// completion, so RNR NAKs come often (B's minimum RNR timer is 10 us).
type roundsRig struct {
	t      *testing.T
	f      *fabric
	a, b   *endpoint
	round  int
	posted bool
	// A's buffers: 4 KiB to write, 4 KiB to read into, 1 KiB to send, 8
	// bytes for the atomic result. B's: the WRITE target, the READ
	// source, the receive buffer and the counter.
	aw, ar, as, aa []byte
	bw, br, brx    []byte
	bc             []byte
	lmr, rmr       [2]uint32 // lkey/rkey pairs, see setup
	aIOVA, bIOVA   uint64
	got            []WC
}

const (
	rwSize    = 4096
	rSendSize = 1024
)

func newRoundsRig(t *testing.T, seed uint64) *roundsRig {
	o := defaultConn()
	o.apsn, o.bpsn = 0xFFFFFF-40, 7
	f, a, b := pair(t, RC, o)
	f.rng = rand.New(rand.NewPCG(seed, seed+1))
	g := &roundsRig{t: t, f: f, a: a, b: b}
	am, abuf := a.n.reg(t, 3*rwSize, allAccess)
	bm, bbuf := b.n.reg(t, 3*rwSize+16, allAccess)
	g.aw, g.ar, g.as, g.aa = abuf[:rwSize], abuf[rwSize:2*rwSize], abuf[2*rwSize:2*rwSize+rSendSize], abuf[2*rwSize+rSendSize:2*rwSize+rSendSize+8]
	co := aligned8(bm, 3*rwSize)
	g.bw, g.br, g.brx, g.bc = bbuf[:rwSize], bbuf[rwSize:2*rwSize], bbuf[2*rwSize:2*rwSize+rSendSize], bbuf[co:co+8]
	g.lmr = [2]uint32{am.LKey(), am.RKey()}
	g.rmr = [2]uint32{bm.LKey(), bm.RKey()}
	g.aIOVA, g.bIOVA = am.IOVA(), bm.IOVA()
	g.repost()
	return g
}

func (g *roundsRig) aSGE(buf []byte) []SGE {
	return []SGE{{Addr: g.aIOVA + uint64(addrOf(buf)-addrOf(g.aw)), Length: uint32(len(buf)), LKey: g.lmr[0]}}
}

func (g *roundsRig) bAddr(buf []byte) uint64 { return g.bIOVA + uint64(addrOf(buf)-addrOf(g.bw)) }

func (g *roundsRig) repost() {
	if err := g.b.qp.PostRecv(RecvWR{ID: 1, SGL: []SGE{{Addr: g.bAddr(g.brx), Length: rSendSize, LKey: g.rmr[0]}}}); err != nil {
		g.t.Fatal(err)
	}
}

// post starts round g.round.
func (g *roundsRig) post() {
	r := uint64(g.round)
	fastFill(g.aw, 2*r)
	fastFill(g.br, 2*r+1)
	fastFill(g.as, ^r)
	clear(g.ar)
	id := 4 * r
	err := g.a.qp.PostSend(
		SendWR{ID: id, Opcode: WRWrite, Flags: SendSignaled, SGL: g.aSGE(g.aw), RemoteAddr: g.bAddr(g.bw), RKey: g.rmr[1]},
		SendWR{ID: id + 1, Opcode: WRRead, Flags: SendSignaled, SGL: g.aSGE(g.ar), RemoteAddr: g.bAddr(g.br), RKey: g.rmr[1]},
		SendWR{ID: id + 2, Opcode: WRSend, Flags: SendSignaled, SGL: g.aSGE(g.as)},
		SendWR{ID: id + 3, Opcode: WRFetchAdd, Flags: SendSignaled, SGL: g.aSGE(g.aa), RemoteAddr: g.bAddr(g.bc), RKey: g.rmr[1], CompareAdd: 1},
	)
	if err != nil {
		g.t.Fatal(err)
	}
	g.posted = true
}

// poll takes completions: B's receive (reposted 300 us later, after its
// bytes were checked) and A's four, which end the round once all came.
func (g *roundsRig) poll() error {
	for _, wc := range pollAll(g.b.rcq) {
		if wc.Status != WCSuccess {
			return fmt.Errorf("round %d: receive completed %v", g.round, wc.Status)
		}
		var want [rSendSize]byte
		fastFill(want[:], ^uint64(g.round))
		if !bytes.Equal(g.brx, want[:]) {
			return fmt.Errorf("round %d: SEND bytes differ", g.round)
		}
		clear(g.brx)
		g.f.after(300*time.Microsecond, g.repost)
	}
	g.got = append(g.got, pollAll(g.a.scq)...)
	if len(g.got) < 4 {
		return nil
	}
	r := uint64(g.round)
	for i, wc := range g.got {
		if wc.Status != WCSuccess || wc.ID != 4*r+uint64(i) {
			return fmt.Errorf("round %d: completions %s", g.round, fmtWCs(g.got))
		}
	}
	if !bytes.Equal(g.bw, g.aw) {
		return fmt.Errorf("round %d: WRITE bytes differ", g.round)
	}
	if !bytes.Equal(g.ar, g.br) {
		return fmt.Errorf("round %d: READ bytes differ", g.round)
	}
	if v := binary.NativeEndian.Uint64(g.aa); v != r {
		return fmt.Errorf("round %d: FETCH_ADD returned %d", g.round, v)
	}
	g.got, g.posted = g.got[:0], false
	g.round++
	return nil
}

// run plays rounds until n are done, and fails on a wrong result or when
// 200 ms of virtual time pass without a round finishing (the QP's
// timeout is 67 ms: a live requester retries well within that).
func (g *roundsRig) run(n int) {
	g.t.Helper()
	last, lastRound := g.f.clock.now, 0
	for g.round < n {
		if !g.posted {
			g.post()
		}
		if g.round != lastRound {
			last, lastRound = g.f.clock.now, g.round
		}
		if g.f.clock.now-last > time.Second || !g.f.step(last+time.Second) {
			g.t.Fatalf("hang in round %d at %v:\nA %s\nB %s", g.round, g.f.clock.now, dumpQP(g.a.qp), dumpQP(g.b.qp))
		}
		if err := g.poll(); err != nil {
			g.t.Fatalf("%v\nA %s", err, dumpQP(g.a.qp))
		}
	}
}

// toA reports whether p goes to A (A's receive path, where the issue's
// reporter put the impairment).
func (g *roundsRig) toA(p wirePkt) bool { return p.dst == g.a.n.addr }

// TestRNROvertakenJitter is issue 16's first report: with 200 us of
// jitter on A's receive path, responses overtake the RNR NAKs they
// follow. At 8669e99 the requester resumed from a retired ring slot and
// hung within a few thousand rounds.
func TestRNROvertakenJitter(t *testing.T) {
	g := newRoundsRig(t, 1)
	g.f.delay = func(p wirePkt) time.Duration {
		if !g.toA(p) {
			return 0
		}
		return time.Duration(g.f.rng.Int64N(int64(200 * time.Microsecond)))
	}
	g.run(3000)
	checkRNRHappened(t, g)
}

// TestRNROvertakenReorder is the same with 5% of A's packets held back
// (others overtake them) instead of jitter.
func TestRNROvertakenReorder(t *testing.T) {
	g := newRoundsRig(t, 2)
	g.f.delay = func(p wirePkt) time.Duration {
		if g.toA(p) && g.f.rng.Float64() < 0.05 {
			return time.Duration(5+g.f.rng.IntN(50)) * time.Microsecond
		}
		return 0
	}
	g.run(3000)
	checkRNRHappened(t, g)
}

func checkRNRHappened(t *testing.T, g *roundsRig) {
	t.Helper()
	if g.a.n.e.Stats.RcvdRNRErr.Load() == 0 {
		t.Fatal("no RNR NAK happened: the test lost its point")
	}
}

// TestForgedRNRInWindow: one forged RNR NAK with a PSN inside the
// window, arriving while B's real responses are delayed, must cost at
// most a pause, not the QP (issue 16).
func TestForgedRNRInWindow(t *testing.T) {
	g := newRoundsRig(t, 3)
	g.run(20)
	g.f.runFor(time.Millisecond) // B's receive is posted again: the real SEND gets no RNR NAK
	var forged []byte
	g.f.delay = func(p wirePkt) time.Duration {
		if g.toA(p) && &p.data[0] != &forged[0] {
			return 100 * time.Microsecond
		}
		return 0
	}
	g.post()
	g.f.step(g.f.clock.now) // A's requests leave
	q := g.a.qp
	q.e.mu.Lock()
	psn := q.wqe(q.sqTail - 2).firstPSN // the round's SEND
	q.e.mu.Unlock()
	forged = make([]byte, bth.Len+reth.AETHLen+bth.ICRCLen)
	h := bth.BTH(forged)
	h.SetOpcode(bth.RCAck)
	h.SetPKey(bth.DefaultPKey)
	h.SetDestQP(q.Num())
	h.SetPSN(psn)
	reth.AETH(forged[bth.Len:]).Set(reth.RNRSyndrome(20), 0) // 10 ms, far beyond the responses
	g.f.queue = append(g.f.queue, wirePkt{data: forged, src: g.b.n.addr, dst: g.a.n.addr})
	g.run(40)
	if g.a.n.e.Stats.RcvdRNRErr.Load() == 0 {
		t.Fatal("the forged RNR NAK was not taken")
	}
}

// TestAckPastPacedRewind: the same family through a timeout. The
// requester times out and rewinds while its pacer holds it (here the
// test holds the pacer), and the first pass's ACKs, late, then
// acknowledge PSNs the rewound requester has not sent again. Those must
// not complete WQEs past the send position: the application, keeping its
// queue full, posts new WQEs into the retired slots the requester would
// resume from, and they would go out under old PSNs.
func TestAckPastPacedRewind(t *testing.T) {
	const depth, total = 32, 96
	f := newFabric(t)
	a := f.node("198.18.0.1").newQP(t, RC, depth)
	b := f.node("198.18.0.2").newQP(t, RC, depth)
	o := defaultConn()
	o.timeout = 12 // 16.8 ms
	connect(t, a, b, o)
	smr, sbuf := a.n.reg(t, depth*64, allAccess)
	rmr, rbuf := b.n.reg(t, depth*64, allAccess)
	cmr, _ := b.n.reg(t, 16, allAccess)
	co := aligned8(cmr, 0)
	late := true
	f.delay = func(p wirePkt) time.Duration {
		if late && p.dst == a.n.addr {
			return 30 * time.Millisecond
		}
		return 0
	}
	posted, recvd, sent := 0, 0, 0
	post := func() {
		for posted < total && posted-sent < depth {
			i := posted % depth
			binary.LittleEndian.PutUint64(sbuf[i*64:], uint64(posted))
			wr := SendWR{ID: uint64(posted), Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, i*64, 64)}
			if posted%4 == 3 { // as in the issue: an atomic among the SENDs
				wr = SendWR{ID: uint64(posted), Opcode: WRFetchAdd, Flags: SendSignaled, SGL: sge(smr, i*64, 8),
					RemoteAddr: cmr.IOVA() + uint64(co), RKey: cmr.RKey(), CompareAdd: 1}
			}
			a.post(t, wr)
			posted++
		}
	}
	for i := range depth {
		b.recv(t, uint64(i), rmr, i*64, 64)
	}
	post()
	f.after(16*time.Millisecond, func() {
		// The pacer holds the QP from just before the timeout to after
		// the late ACKs.
		q := a.qp
		q.e.mu.Lock()
		q.e.schedule(q, timerPace, 45*time.Millisecond)
		q.e.mu.Unlock()
		late = false
	})
	for end := f.clock.now + 10*time.Second; sent < total; {
		if !f.step(end) {
			t.Fatalf("hang after %d of %d SENDs:\n%s", sent, total, dumpQP(a.qp))
		}
		for _, wc := range pollAll(a.scq) {
			if wc.Status != WCSuccess || wc.ID != uint64(sent) {
				t.Fatalf("completion %+v, want WR %d", wc, sent)
			}
			if got := binary.NativeEndian.Uint64(sbuf[sent%depth*64:]); sent%4 == 3 && got != uint64(sent/4) {
				t.Fatalf("FETCH_ADD %d returned %d, want %d", sent, got, sent/4)
			}
			sent++
		}
		for _, wc := range pollAll(b.rcq) {
			k := int(wc.ID)
			if recvd%4 == 3 {
				recvd++ // the FETCH_ADD's number
			}
			if got := binary.LittleEndian.Uint64(rbuf[k*64:]); wc.Status != WCSuccess || got != uint64(recvd) {
				t.Fatalf("receive %d: %v, message %d", recvd, wc.Status, got)
			}
			recvd++
			b.recv(t, wc.ID, rmr, k*64, 64)
		}
		post()
	}
	if a.n.e.Stats.CompleterRetryErr.Load() == 0 {
		t.Fatal("no timeout: the test lost its point")
	}
}

// TestRetryExcOnOldestWQE: with retry_cnt 0, a sequence-error NAK for a
// PSN after a READ still waiting for its response fails the READ, the
// oldest WQE, with RETRY_EXC_ERR; the NAKed SEND is flushed after it.
// (It used to fail the SEND and complete the READ flushed first, so the
// application's first error was a flush.)
func TestRetryExcOnOldestWQE(t *testing.T) {
	o := defaultConn()
	o.mtu, o.retry = MTU256, 0
	f, a, b := pair(t, RC, o)
	lmr, _ := a.n.reg(t, 1024, allAccess)
	rmr, _ := b.n.reg(t, 1024, allAccess)
	b.recv(t, 1, rmr, 512, 512)
	sendFirst := bth.PSN(o.apsn).Add(1)
	readLost, sendLost := dropOnce(t, func(p bth.Packet) bool { return p.Info.Op == bth.OpReadResponse }),
		dropOnce(t, func(p bth.Packet) bool { return p.Info.Op == bth.OpSend && p.BTH().PSN() == sendFirst })
	f.drop = func(p wirePkt) bool { return readLost(p) || sendLost(p) }
	a.post(t,
		SendWR{ID: 1, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, 64), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
		SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 512, 512)},
	)
	f.run(time.Second)
	check(t, "sender", pollAll(a.scq), want{1, WCRetryExcErr, WCRead}, want{2, WCWRFlushErr, WCSend})
	if a.n.e.Stats.RcvdSeqErr.Load() == 0 {
		t.Fatal("no sequence-error NAK: the test lost its point")
	}
}

// TestUCDuplicateDeliveredOnce: a UC message the network delivers twice
// completes one receive; the next message still arrives.
func TestUCDuplicateDeliveredOnce(t *testing.T) {
	f, a, b := pair(t, UC, defaultConn())
	smr, sbuf := a.n.reg(t, 64, allAccess)
	rmr, _ := b.n.reg(t, 256, allAccess)
	fill(sbuf, 9)
	for i := range 3 {
		b.recv(t, uint64(i), rmr, i*64, 64)
	}
	f.dupIf = func(p wirePkt) bool { return p.dst == b.n.addr }
	a.post(t, SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 64)})
	f.run(time.Second)
	f.dupIf = nil
	a.post(t, SendWR{ID: 2, Opcode: WRSendImm, Imm: 5, Flags: SendSignaled, SGL: sge(smr, 0, 64)})
	f.run(time.Second)
	check(t, "UC receiver", pollAll(b.rcq), want{0, WCSuccess, WCRecv}, want{1, WCSuccess, WCRecv})
	if b.n.e.Stats.Drops[DropDuplicate].Load() != 1 {
		t.Fatalf("%d duplicates dropped, want 1", b.n.e.Stats.Drops[DropDuplicate].Load())
	}
}

// TestLateAckPastSendPosition: after a timeout rewinds the requester and
// the pacer holds the resend, the first transmission's late ACK covers the
// whole WRITE. It completes the WRITE at once and the requester resumes
// after it: nothing it acknowledged goes out again. A requester that
// ignored such an ACK until the PSNs were resent livelocked whenever its
// paced resends took longer than its timeout (seen with every packet
// CE-marked: each round's re-ACK came before the resend had passed it).
func TestLateAckPastSendPosition(t *testing.T) {
	f := newFabric(t)
	a := f.node("198.18.0.1").newQP(t, RC, 8)
	b := f.node("198.18.0.2").newQP(t, RC, 8)
	o := defaultConn()
	o.timeout = 12 // 16.8 ms
	connect(t, a, b, o)
	smr, _ := a.n.reg(t, 8<<10, allAccess)
	rmr, _ := b.n.reg(t, 8<<10, allAccess)
	late, ackAt, resent := true, time.Duration(0), 0
	f.delay = func(p wirePkt) time.Duration {
		if p.dst == a.n.addr && late {
			return 30 * time.Millisecond
		}
		if p.src == a.n.addr && ackAt != 0 && f.clock.now > ackAt {
			resent++
		}
		return 0
	}
	a.post(t, SendWR{ID: 1, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(smr, 0, 8<<10), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()})
	f.after(16*time.Millisecond, func() {
		q := a.qp
		q.e.mu.Lock()
		q.e.schedule(q, timerPace, 45*time.Millisecond) // hold the resend past the late ACK
		q.e.mu.Unlock()
		late = false
	})
	var done time.Duration
	for end := f.clock.now + 2*time.Second; done == 0; {
		if !f.step(end) {
			t.Fatalf("no completion:\n%s", dumpQP(a.qp))
		}
		for _, wc := range pollAll(a.scq) {
			if wc.Status != WCSuccess || wc.ID != 1 {
				t.Fatalf("completion %+v", wc)
			}
			done, ackAt = f.clock.now, f.clock.now
		}
	}
	if done >= 45*time.Millisecond {
		t.Fatalf("the WRITE completed at %v, after its resend: the late ACK was ignored", done)
	}
	for end := f.clock.now + 100*time.Millisecond; f.step(end); {
	}
	if resent != 0 {
		t.Fatalf("%d packets sent after the ACK covered them all", resent)
	}
}
