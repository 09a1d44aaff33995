package rxego_test

import (
	"testing"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/qp"
)

// TestRecvGRHFlag: successful RC receive completions (SEND, SEND with
// immediate, WRITE with immediate) carry IBV_WC_GRH, as rxe's do on
// RoCE; flushed ones do not.
func TestRecvGRHFlag(t *testing.T) {
	a, b := openSide(t, nil), openSide(t, nil)
	connectPair(t, a, b, &rxego.ConnectOptions{})
	for i := range 4 {
		if err := b.qp.PostRecv(rxego.RecvWR{ID: uint64(10 + i), SGL: []rxego.SGE{{Addr: b.mr.IOVA(), Length: 64, LKey: b.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	sge := []rxego.SGE{{Addr: a.mr.IOVA(), Length: 8, LKey: a.mr.LKey()}}
	wrs := []rxego.SendWR{
		{ID: 1, Opcode: rxego.WRSend, SGL: sge},
		{ID: 2, Opcode: rxego.WRSendImm, Imm: 5, SGL: sge},
		{ID: 3, Opcode: rxego.WRWriteImm, Imm: 6, SGL: sge, RemoteAddr: b.mr.IOVA() + 1024, RKey: b.mr.RKey()},
	}
	if err := a.qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		op    qp.WCOpcode
		flags qp.WCFlags
	}{{qp.WCRecv, qp.WCWithGRH}, {qp.WCRecv, qp.WCWithGRH | qp.WCWithImm}, {qp.WCRecvRDMAImm, qp.WCWithGRH | qp.WCWithImm}}
	for i, w := range want {
		wc := wait1(t, b.cq)
		if wc.Status != qp.WCSuccess || wc.Opcode != w.op || wc.Flags != w.flags {
			t.Errorf("receive %d: %+v; want %v with flags %#x", i, wc, w.op, w.flags)
		}
	}
	// The fourth receive flushes: no GRH.
	attr := rxego.QPAttr{State: qp.Err}
	if err := b.qp.Modify(&attr, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, b.cq); wc.Status != qp.WCWRFlushErr || wc.Flags&qp.WCWithGRH != 0 {
		t.Errorf("flushed receive: %+v; want WR_FLUSH_ERR without GRH", wc)
	}
}
