package qp

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// srqSetup makes n RC pairs whose B sides share one SRQ and one receive
// CQ.
func srqSetup(t *testing.T, n, depth int) (*fabric, []*endpoint, []*endpoint, *SRQ, *CQ) {
	f := newFabric(t)
	na, nb := f.node("198.18.0.1"), f.node("198.18.0.2")
	srq, err := nb.e.NewSRQ(nb.pd, depth, 2)
	if err != nil {
		t.Fatal(err)
	}
	rcq, _ := NewCQ(64)
	var as, bs []*endpoint
	for i := 0; i < n; i++ {
		a := na.newQP(t, RC, 16)
		scq, _ := NewCQ(64)
		attr := InitAttr{Type: RC, PD: nb.pd, SendCQ: scq, RecvCQ: rcq, SRQ: srq, Caps: Caps{MaxSendWR: 16, MaxSendSGE: 1}}
		q, err := nb.e.Create(attr)
		if err != nil {
			t.Fatal(err)
		}
		b := &endpoint{n: nb, qp: q, scq: scq, rcq: rcq, attr: attr}
		o := defaultConn()
		o.minRN = 2
		connect(t, a, b, o)
		as, bs = append(as, a), append(bs, b)
	}
	return f, as, bs, srq, rcq
}

// TestSRQSharedInOrder: QPs sharing an SRQ take its receives in the order
// their messages arrive, each completion naming its QP.
func TestSRQSharedInOrder(t *testing.T) {
	f, as, bs, srq, rcq := srqSetup(t, 3, 8)
	nb := bs[0].n
	rmr, rbuf := nb.reg(t, 8*1000, allAccess)
	for i := 0; i < 6; i++ {
		if err := srq.PostRecv(RecvWR{ID: uint64(i), SGL: sge(rmr, i*1000, 1000)}); err != nil {
			t.Fatal(err)
		}
	}
	if srq.Len() != 6 {
		t.Fatalf("SRQ holds %d", srq.Len())
	}
	// Interleave: QP 0, 1, 2, 0, 1, 2, delivered one message at a time.
	for k := 0; k < 6; k++ {
		a := as[k%3]
		smr, sbuf := a.n.reg(t, 1000, allAccess)
		for j := range sbuf {
			sbuf[j] = byte(k)
		}
		a.post(t, SendWR{ID: uint64(k), Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 500+k)})
		f.run(time.Second)
	}
	rw := pollAll(rcq)
	if len(rw) != 6 {
		t.Fatalf("%d receive completions", len(rw))
	}
	nb.e.Sync()
	for k, wc := range rw {
		if wc.ID != uint64(k) || wc.Status != WCSuccess || wc.QPN != bs[k%3].qp.Num() || wc.ByteLen != uint32(500+k) {
			t.Fatalf("completion %d: %+v", k, wc)
		}
		if !bytes.Equal(rbuf[k*1000:k*1000+500+k], bytes.Repeat([]byte{byte(k)}, 500+k)) {
			t.Fatalf("receive %d data", k)
		}
	}
	if srq.Len() != 0 {
		t.Fatalf("SRQ still holds %d", srq.Len())
	}
}

// TestSRQEmptyRNR: with the SRQ empty, a SEND is answered with RNR NAKs
// until a receive is posted to the SRQ.
func TestSRQEmptyRNR(t *testing.T) {
	f, as, bs, srq, rcq := srqSetup(t, 2, 4)
	smr, _ := as[1].n.reg(t, 64, allAccess)
	rmr, _ := bs[0].n.reg(t, 64, allAccess)
	as[1].post(t, SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 64)})
	f.run(3*DefaultRNRTick + time.Millisecond)
	if bs[1].n.e.Stats.SendRNRErr.Load() < 3 || len(pollAll(as[1].scq)) != 0 {
		t.Fatalf("%d RNR NAKs", bs[1].n.e.Stats.SendRNRErr.Load())
	}
	if err := srq.PostRecv(RecvWR{ID: 9, SGL: sge(rmr, 0, 64)}); err != nil {
		t.Fatal(err)
	}
	f.run(time.Second)
	check(t, "sender", pollAll(as[1].scq), want{1, WCSuccess, WCSend})
	rw := pollAll(rcq)
	check(t, "receiver", rw, want{9, WCSuccess, WCRecv})
	if rw[0].QPN != bs[1].qp.Num() {
		t.Fatalf("completion names QP %d", rw[0].QPN)
	}
}

// TestSRQPostRules: a QP with an SRQ takes no receives of its own; an SRQ
// refuses a batch that does not fit, posting none of it, and WRs with too
// many SGEs; a QP's own receive queue does the same.
func TestSRQPostRules(t *testing.T) {
	f, _, bs, srq, _ := srqSetup(t, 1, 4)
	if err := bs[0].qp.PostRecv(RecvWR{ID: 1}); !errors.Is(err, ErrInvalidWR) {
		t.Fatalf("PostRecv on a QP with an SRQ: %v", err)
	}
	three := []RecvWR{{ID: 1}, {ID: 2}, {ID: 3}}
	if err := srq.PostRecv(three...); err != nil {
		t.Fatal(err)
	}
	if err := srq.PostRecv(RecvWR{ID: 4}, RecvWR{ID: 5}); !errors.Is(err, ErrQueueFull) || srq.Len() != 3 {
		t.Fatalf("overfull SRQ post: %v, %d posted", err, srq.Len())
	}
	if err := srq.PostRecv(RecvWR{ID: 6, SGL: make([]SGE, 3)}); !errors.Is(err, ErrInvalidWR) || srq.Len() != 3 {
		t.Fatalf("3 SGEs on a 2-SGE SRQ: %v", err)
	}
	for _, bad := range [][2]int{{0, 1}, {MaxWR + 1, 1}, {4, MaxSGE + 1}, {4, -1}} {
		if _, err := bs[0].n.e.NewSRQ(bs[0].n.pd, bad[0], bad[1]); err == nil {
			t.Fatalf("NewSRQ(%d, %d) succeeded", bad[0], bad[1])
		}
	}

	// The same rules on a QP's own receive queue (16 deep).
	a := f.node("198.18.0.9").newQPWithCQs(t, RC, 8, 8)
	bringTo(t, a.qp, Init)
	if err := a.qp.PostRecv(three...); err != nil {
		t.Fatal(err)
	}
	err := a.qp.PostRecv(make([]RecvWR, 14)...)
	if !errors.Is(err, ErrQueueFull) || a.qp.rq.len() != 3 {
		t.Fatalf("overfull RQ post: %v, %d posted", err, a.qp.rq.len())
	}
	if err := a.qp.PostRecv(RecvWR{SGL: make([]SGE, 5)}); !errors.Is(err, ErrInvalidWR) || a.qp.rq.len() != 3 {
		t.Fatalf("5 SGEs on a 4-SGE RQ: %v", err)
	}
}
