package rxego_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/rxego/rxego"
)

// side is one end of a loopback test connection.
type side struct {
	dev *rxego.Device
	pd  *rxego.PD
	cq  *rxego.CQ
	qp  *rxego.QP
	mr  *rxego.MR
	buf []byte
}

func open(t *testing.T, typ rxego.QPType, size int) *side { return openWith(t, nil, typ, size) }

func connectPair(t *testing.T, a, b *side, opts *rxego.ConnectOptions) {
	t.Helper()
	if err := a.qp.Connect(rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qp.Num(), PSN: 200}, &rxego.ConnectOptions{LocalPSN: 100, MTU: opts.MTU}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(rxego.RemoteQP{Addr: a.dev.Addr(), QPN: a.qp.Num(), PSN: 100}, &rxego.ConnectOptions{LocalPSN: 200, MTU: opts.MTU}); err != nil {
		t.Fatal(err)
	}
}

func wait1(t *testing.T, cq *rxego.CQ) rxego.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]rxego.WC, 1)
	if _, err := cq.PollWait(ctx, wc); err != nil {
		t.Fatalf("no completion: %v", err)
	}
	return wc[0]
}

func TestLoopbackWriteSendRead(t *testing.T) {
	const size = 1 << 20
	a := open(t, rxego.RC, 2*size)
	b := open(t, rxego.RC, 2*size)
	connectPair(t, a, b, &rxego.ConnectOptions{MTU: 5})
	for i := range a.buf[:size] {
		a.buf[i] = byte(i * 7)
	}
	// WRITE: the receiver sees no completion.
	if err := a.qp.PostSend(rxego.SendWR{ID: 1, Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: size, LKey: a.mr.LKey()}}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, a.cq); wc.Status != 0 || wc.ID != 1 {
		t.Fatalf("write completion %+v", wc)
	}
	b.dev.Sync()
	if !bytes.Equal(a.buf[:size], b.buf[:size]) {
		t.Fatal("WRITE data differs")
	}
	if b.cq.Len() != 0 {
		t.Fatal("WRITE produced a receiver completion")
	}
	// SEND with immediate into a posted receive.
	if err := b.qp.PostRecv(rxego.RecvWR{ID: 5, SGL: []rxego.SGE{{Addr: b.mr.IOVA() + size, Length: size, LKey: b.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(rxego.SendWR{ID: 2, Opcode: rxego.WRSendImm, Imm: 77, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: 5000, LKey: a.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, b.cq); wc.Status != 0 || wc.ID != 5 || wc.ByteLen != 5000 || wc.Imm != 77 {
		t.Fatalf("recv completion %+v", wc)
	}
	if wc := wait1(t, a.cq); wc.Status != 0 || wc.ID != 2 {
		t.Fatalf("send completion %+v", wc)
	}
	if !bytes.Equal(b.buf[size:size+5000], a.buf[:5000]) {
		t.Fatal("SEND data differs")
	}
	// READ it back.
	if err := a.qp.PostSend(rxego.SendWR{ID: 3, Opcode: rxego.WRRead, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: a.mr.IOVA() + size, Length: size, LKey: a.mr.LKey()}}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, a.cq); wc.Status != 0 || wc.ID != 3 || wc.ByteLen != size {
		t.Fatalf("read completion %+v", wc)
	}
	if !bytes.Equal(a.buf[size:], b.buf[:size]) {
		t.Fatal("READ data differs")
	}
	t.Logf("a: %+v", a.dev.Transport().Stats())
}
