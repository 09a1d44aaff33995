package qp

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/reth"
)

// TestNAKFlushesInOrder: a NAK completes its WR with the matching status,
// moves the QP to ERR and flushes the rest of the send queue in order —
// unsignaled WRs included, since errors always complete — and the receive
// queue too. Unsignaled WRs that succeeded produce nothing.
func TestNAKFlushesInOrder(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	lmr, _ := a.n.reg(t, 4096, allAccess)
	rmr, _ := b.n.reg(t, 4096, allAccess)
	b.recv(t, 50, rmr, 0, 4096)
	b.recv(t, 51, rmr, 0, 4096)
	a.recv(t, 60, lmr, 0, 100)
	a.recv(t, 61, lmr, 100, 100)
	a.post(t,
		SendWR{ID: 0, Opcode: WRSend, SGL: sge(lmr, 0, 10)}, // unsignaled, succeeds: no completion
		SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 0, 10)},
		SendWR{ID: 2, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, 0, 10), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey() + 1<<8},
		SendWR{ID: 3, Opcode: WRSend, SGL: sge(lmr, 0, 10)},
		SendWR{ID: 4, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, 10), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
		SendWR{ID: 5, Opcode: WRFetchAdd, SGL: sge(lmr, aligned8(lmr, 16), 8), RemoteAddr: rmr.IOVA() + uint64(aligned8(rmr, 0)), RKey: rmr.RKey()},
	)
	f.run(time.Second)
	check(t, "requester send CQ", pollAll(a.scq),
		want{1, WCSuccess, WCSend}, want{2, WCRemAccessErr, WCWrite}, want{3, WCWRFlushErr, WCSend},
		want{4, WCWRFlushErr, WCRead}, want{5, WCWRFlushErr, WCFetchAdd})
	check(t, "requester recv CQ", pollAll(a.rcq), want{60, WCWRFlushErr, WCRecv}, want{61, WCWRFlushErr, WCRecv})
	// Both receives were used before the responder failed: nothing to flush.
	check(t, "responder recv CQ", pollAll(b.rcq), want{50, WCSuccess, WCRecv}, want{51, WCSuccess, WCRecv})
	if a.qp.State() != Err || b.qp.State() != Err {
		t.Fatalf("states %v/%v", a.qp.State(), b.qp.State())
	}
	if got := a.n.e.Stats.FlushedWorkRequests.Load(); got != 5 {
		t.Fatalf("flushed %d WRs, want 5 (3 send, 2 receive)", got)
	}
}

// TestNAKStatuses: each NAK code maps to its completion status.
func TestNAKStatuses(t *testing.T) {
	cases := []struct {
		name string
		mk   func(a, b *endpoint) SendWR
		st   WCStatus
	}{
		{"remote-access", func(a, b *endpoint) SendWR {
			return SendWR{Opcode: WRRead, SGL: sge(mustReg(t, a, 64), 0, 8), RemoteAddr: 1, RKey: 0x1234}
		}, WCRemAccessErr},
		{"remote-op", func(a, b *endpoint) SendWR {
			return SendWR{Opcode: WRSend, SGL: sge(mustReg(t, a, 4096), 0, 4096)} // longer than the receive
		}, WCRemOpErr},
	}
	for _, c := range cases {
		f, a, b := pair(t, RC, defaultConn())
		b.recv(t, 1, mustReg(t, b, 64), 0, 64)
		wr := c.mk(a, b)
		wr.ID, wr.Flags = 9, SendSignaled
		a.post(t, wr)
		f.run(time.Second)
		check(t, c.name, pollAll(a.scq), want{9, c.st, wcOpcodeOf(wr.Opcode)})
	}
	// Codes forged by the fabric, which turns the ACK of a WRITE into a
	// NAK with that code. rxe completes every code but
	// the ones above with REM_OP_ERR.
	for _, code := range []uint8{reth.NAKRemoteOp, reth.NAKInvalidRDReq, 0x1f} {
		f, a, b := pair(t, RC, defaultConn())
		rmr := mustReg(t, b, 64)
		f.drop = func(p wirePkt) bool {
			if parse(t, p).Info.Op == bth.OpAck {
				p.data[bth.Len] = byte(reth.NAKSyndrome(code)) // the AETH syndrome, in place
			}
			return false
		}
		a.post(t, SendWR{ID: 9, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(mustReg(t, a, 64), 0, 8), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
			SendWR{ID: 10, Opcode: WRSend})
		f.run(time.Second)
		check(t, fmt.Sprintf("NAK code %d", code), pollAll(a.scq), want{9, WCRemOpErr, WCWrite}, want{10, WCWRFlushErr, WCSend})
	}
}

func mustReg(t *testing.T, ep *endpoint, n int) *mr.MR {
	m, _ := ep.n.reg(t, n, allAccess)
	return m
}

// TestPostToErrQPFlushes: work posted to a QP in ERR completes at once
// with WR_FLUSH_ERR, in order, and sends nothing.
func TestPostToErrQPFlushes(t *testing.T) {
	f, a, _ := pair(t, RC, defaultConn())
	lmr, _ := a.n.reg(t, 64, allAccess)
	if err := a.qp.Modify(&Attr{State: Err}, AttrState); err != nil {
		t.Fatal(err)
	}
	sent := a.n.e.Stats.SentPkts.Load()
	a.post(t, SendWR{ID: 1, Opcode: WRSend, SGL: sge(lmr, 0, 8)}, SendWR{ID: 2, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, 8)})
	a.recv(t, 3, lmr, 0, 8)
	// No fabric run: the completions are there as soon as the post returns.
	check(t, "send CQ", pollAll(a.scq), want{1, WCWRFlushErr, WCSend}, want{2, WCWRFlushErr, WCRead})
	check(t, "recv CQ", pollAll(a.rcq), want{3, WCWRFlushErr, WCRecv})
	f.run(time.Second)
	if a.n.e.Stats.SentPkts.Load() != sent {
		t.Fatal("a QP in ERR sent packets")
	}
}

// TestLocalProtectionError: a send whose SGE names no valid local memory
// completes with LOC_PROT_ERR and the QP moves to ERR, the data never
// leaving.
func TestLocalProtectionError(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	lmr, _ := a.n.reg(t, 64, allAccess)
	rmr, _ := b.n.reg(t, 64, allAccess)
	b.recv(t, 1, rmr, 0, 64)
	sent := 0
	f.tap = func(p wirePkt, pkt bth.Packet) {
		if pkt.Info.Op == bth.OpSend {
			sent++
		}
	}
	a.post(t,
		SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{{Addr: lmr.IOVA(), Length: 8, LKey: lmr.LKey() ^ 1}}},
		SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 0, 8)},
	)
	f.run(time.Second)
	check(t, "send CQ", pollAll(a.scq), want{1, WCLocProtErr, WCSend}, want{2, WCWRFlushErr, WCSend})
	if sent != 0 || a.qp.State() != Err {
		t.Fatalf("%d SEND packets, state %v", sent, a.qp.State())
	}
}

// TestPostRecvRacingErr: a receive posted while the QP moves to ERR —
// after PostRecv saw it in RTS but before the receive was queued — is
// flushed, not left on the queue forever.
func TestPostRecvRacingErr(t *testing.T) {
	f := newFabric(t)
	n := f.node("198.18.0.1")
	m, _ := n.reg(t, 64, allAccess)
	ep := n.newQPWithCQs(t, RC, 8, 64)
	bringTo(t, ep.qp, RTS)
	testHookBeforeRecvPut = func(q *QP) {
		if err := q.Modify(&Attr{State: Err}, AttrState); err != nil {
			t.Error(err)
		}
	}
	defer func() { testHookBeforeRecvPut = nil }()
	ep.recv(t, 1, m, 0, 8)
	check(t, "receive posted across the move to ERR", pollAll(ep.rcq), want{1, WCWRFlushErr, WCRecv})
}

// TestStaleNAKIgnored: a NAK or RNR NAK that arrives late, for PSNs
// already acknowledged (a delayed duplicate), must not rewind the
// requester: the next message gets a fresh PSN and is delivered.
func TestStaleNAKIgnored(t *testing.T) {
	for _, kind := range []string{"seq", "rnr"} {
		o := defaultConn()
		f, a, b := pair(t, RC, o)
		smr, _ := a.n.reg(t, 64, allAccess)
		rmr, _ := b.n.reg(t, 64, allAccess)
		var nak *wirePkt
		f.tap = func(p wirePkt, pkt bth.Packet) {
			if nak == nil && (kind == "seq" && isNAK(pkt, reth.NAKPSNSeqError) || kind == "rnr" && isRNR(pkt)) {
				c := p
				nak = &c
			}
		}
		if kind == "seq" {
			f.drop = dropOnce(t, func(pkt bth.Packet) bool { return pkt.Info.Op == bth.OpSend })
			b.recv(t, 1, rmr, 0, 64)
			b.recv(t, 2, rmr, 0, 64)
			a.post(t, SendWR{ID: 1, Opcode: WRSend, SGL: sge(smr, 0, 8)}, SendWR{ID: 2, Opcode: WRSend, SGL: sge(smr, 0, 8)})
			f.run(time.Second)
		} else {
			a.post(t, SendWR{ID: 1, Opcode: WRSend, SGL: sge(smr, 0, 8)})
			f.run(time.Microsecond) // one RNR NAK
			b.recv(t, 1, rmr, 0, 64)
			f.run(time.Second)
		}
		if nak == nil {
			t.Fatalf("%s: no NAK happened", kind)
		}
		rcvd := len(pollAll(b.rcq))
		f.queue = append(f.queue, *nak) // the delayed duplicate
		f.run(time.Second)
		b.recv(t, 3, rmr, 0, 64)
		a.post(t, SendWR{ID: 3, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 8)})
		f.run(time.Second)
		check(t, kind+" sender", pollAll(a.scq), want{3, WCSuccess, WCSend})
		check(t, kind+" receiver", pollAll(b.rcq), want{3, WCSuccess, WCRecv})
		if rcvd == 0 || a.n.e.Stats.Drops[DropStaleResponse].Load() != 1 {
			t.Fatalf("%s: %d receives before, stale drops %d", kind, rcvd, a.n.e.Stats.Drops[DropStaleResponse].Load())
		}
	}
}

// TestDestroyQP1: a packet for QP1 after the QP1 was destroyed (a CM MAD
// retransmitted to a device whose connection manager has closed) counts
// as drop_closed_qp, not drop_unknown_qp, and QP1 can be made again at
// once (it is a fixed number, not drawn from the pool).
func TestDestroyQP1(t *testing.T) {
	f := newFabric(t)
	na, nb := f.node("198.18.0.1"), f.node("198.18.0.2")
	gsi := func() *QP {
		t.Helper()
		cq, _ := NewCQ(4)
		q, err := na.e.Create(InitAttr{Type: UD, PD: na.pd, SendCQ: cq, RecvCQ: cq,
			Caps: Caps{MaxSendWR: 1, MaxRecvWR: 1}, QPN: 1})
		if err != nil {
			t.Fatalf("creating QP1: %v", err)
		}
		return q
	}
	if err := gsi().Destroy(); err != nil {
		t.Fatal(err)
	}
	mad := make([]byte, bth.Len+reth.DETHLen+256+bth.ICRCLen)
	h := bth.BTH(mad)
	h.SetOpcode(bth.UDSendOnly)
	h.SetPKey(bth.DefaultPKey)
	h.SetDestQP(1)
	f.queue = append(f.queue, wirePkt{data: mad, src: nb.addr, dst: na.addr})
	f.run(time.Millisecond)
	st := &na.e.Stats
	if closed, unknown := st.Drops[DropClosedQP].Load(), st.Drops[DropUnknownQP].Load(); closed != 1 || unknown != 0 {
		t.Fatalf("a MAD for the destroyed QP1: closed_qp drops %d, unknown_qp drops %d; want 1 and 0", closed, unknown)
	}
	gsi()
}

// TestDestroy: a destroyed QP drops its work without completions, stops
// its timers and refuses every call; packets for it are dropped as for
// an unknown QP.
func TestDestroy(t *testing.T) {
	o := defaultConn()
	o.timeout, o.retry = 8, 2
	f, a, b := pair(t, RC, o)
	lmr, _ := a.n.reg(t, 64, allAccess)
	f.drop = func(wirePkt) bool { return true }
	a.recv(t, 1, lmr, 0, 8)
	a.post(t, SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 0, 8)})
	if err := a.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	f.run(time.Second)
	if _, ok := a.n.e.NextDeadline(); ok {
		t.Fatal("a destroyed QP's timer is armed")
	}
	if w := append(pollAll(a.scq), pollAll(a.rcq)...); len(w) != 0 {
		t.Fatalf("completions after Destroy: %+v", w)
	}
	for name, err := range map[string]error{
		"PostSend": a.qp.PostSend(SendWR{Opcode: WRSend}),
		"PostRecv": a.qp.PostRecv(RecvWR{}),
		"Modify":   a.qp.Modify(&Attr{State: Err}, AttrState),
		"Destroy":  a.qp.Destroy(),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("%s on a destroyed QP: %v", name, err)
		}
	}
	if _, ok := a.n.e.QP(a.qp.Num()); ok {
		t.Fatal("the engine still lists the QP")
	}
	// The peer's packets now find no QP: within closedQPHold of the
	// Destroy they count as for a closed QP, and the number is not
	// given to a new QP, however asked for.
	f.drop = nil
	b.post(t, SendWR{ID: 2, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(mustReg(t, b, 8), 0, 8), RemoteAddr: lmr.IOVA(), RKey: lmr.RKey()})
	f.run(time.Second)
	check(t, "peer", pollAll(b.scq), want{2, WCRetryExcErr, WCWrite})
	st := &a.n.e.Stats
	if closed, unknown := st.Drops[DropClosedQP].Load(), st.Drops[DropUnknownQP].Load(); closed != uint64(o.retry)+1 || unknown != 0 {
		t.Fatalf("closed_qp drops %d (want %d), unknown_qp drops %d (want 0)", closed, o.retry+1, unknown)
	}
	if _, err := a.n.e.Create(InitAttr{Type: RC, PD: a.n.pd, SendCQ: a.scq, RecvCQ: a.rcq, Caps: Caps{MaxSendWR: 1, MaxRecvWR: 1},
		QPN: a.qp.Num()}); !errors.Is(err, ErrQPNTaken) {
		t.Fatalf("creating QP %d again just after its Destroy: %v, want ErrQPNTaken", a.qp.Num(), err)
	}
	for range 3 {
		if x := a.n.newQP(t, RC, 4); x.qp.Num() == a.qp.Num() {
			t.Fatalf("a new QP got the number %d destroyed %v ago", x.qp.Num(), f.clock.now)
		}
	}
	// After closedQPHold they are strangers, and the number is free.
	f.runFor(closedQPHold)
	late := make([]byte, bth.Len+reth.AETHLen+bth.ICRCLen) // an ACK, as the peer's responder would send
	h := bth.BTH(late)
	h.SetOpcode(bth.RCAck)
	h.SetPKey(bth.DefaultPKey)
	h.SetDestQP(a.qp.Num())
	f.queue = append(f.queue, wirePkt{data: late, src: b.n.addr, dst: a.n.addr})
	f.run(time.Millisecond)
	if unknown := st.Drops[DropUnknownQP].Load(); unknown != 1 {
		t.Fatalf("unknown_qp drops %d after the hold, want 1", unknown)
	}
	if _, err := a.n.e.Create(InitAttr{Type: RC, PD: a.n.pd, SendCQ: a.scq, RecvCQ: a.rcq, Caps: Caps{MaxSendWR: 1, MaxRecvWR: 1},
		QPN: a.qp.Num()}); err != nil {
		t.Fatalf("creating QP %d again after the hold: %v", a.qp.Num(), err)
	}
}
