package rxego_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/qp"
)

// TestMemoryWindowLoopback: over real sockets, a type 1 window bound with
// QP.BindMW and a type 2 window bound by a WRBindMW work request each let
// the peer WRITE and READ exactly their range of an MR without remote
// rights; invalidating the type 2 window turns the next READ into a
// remote access error.
func TestMemoryWindowLoopback(t *testing.T) {
	a := open(t, rxego.RC, 8192)
	b := open(t, rxego.RC, 8192)
	connectPair(t, a, b, &rxego.ConnectOptions{MTU: 3})
	buf := make([]byte, 4096)
	copy(buf[:2048], bytes.Repeat([]byte("type2"), 410)) // before the device can see it
	m, err := b.pd.RegMR(buf, rxego.AccessLocalWrite|rxego.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	w1, err := b.pd.AllocMW(rxego.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	k1, err := b.qp.BindMW(w1, 1, rxego.SendSignaled, m, m.IOVA()+2048, 2048, rxego.AccessRemoteWrite|rxego.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, b.cq); wc.Status != 0 || wc.ID != 1 || wc.Opcode != qp.WCBindMW {
		t.Fatalf("bind completion %+v", wc)
	}
	w2, _ := b.pd.AllocMW(rxego.MWType2)
	k2 := w2.RKey()&^0xff | 0x33
	if err := b.qp.PostSend(rxego.SendWR{ID: 2, Opcode: rxego.WRBindMW, Flags: rxego.SendSignaled,
		Bind: rxego.MWBind{MW: w2.RKey(), RKey: k2, MR: m.LKey(), Addr: m.IOVA(), Length: 2048, Access: rxego.AccessRemoteRead | rxego.AccessZeroBased}}); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, b.cq); wc.Status != 0 || wc.ID != 2 {
		t.Fatalf("bind completion %+v", wc)
	}
	for i := range a.buf[:2048] {
		a.buf[i] = byte(i*5 + 1)
	}
	post := func(wr rxego.SendWR) rxego.WC {
		t.Helper()
		wr.Flags = rxego.SendSignaled
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		return wait1(t, a.cq)
	}
	sg := func(off, n int) []rxego.SGE {
		return []rxego.SGE{{Addr: a.mr.IOVA() + uint64(off), Length: uint32(n), LKey: a.mr.LKey()}}
	}
	if wc := post(rxego.SendWR{ID: 3, Opcode: rxego.WRWrite, SGL: sg(0, 2048), RemoteAddr: m.IOVA() + 2048, RKey: k1}); wc.Status != 0 {
		t.Fatalf("WRITE through the type 1 window: %v", wc.Status)
	}
	if wc := post(rxego.SendWR{ID: 4, Opcode: rxego.WRRead, SGL: sg(4096, 2048), RemoteAddr: 0, RKey: k2}); wc.Status != 0 {
		t.Fatalf("READ through the type 2 window: %v", wc.Status)
	}
	b.dev.Sync()
	if !bytes.Equal(buf[2048:], a.buf[:2048]) || !bytes.Equal(a.buf[4096:6144], buf[:2048]) {
		t.Fatal("bytes through the windows differ")
	}
	if err := b.qp.PostSend(rxego.SendWR{ID: 5, Opcode: rxego.WRLocalInv, Flags: rxego.SendSignaled, InvalidateRKey: k2}); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, b.cq); wc.Status != 0 || wc.ID != 5 {
		t.Fatalf("local invalidate %+v", wc)
	}
	if wc := post(rxego.SendWR{ID: 6, Opcode: rxego.WRRead, SGL: sg(0, 8), RemoteAddr: 0, RKey: k2}); wc.Status != qp.WCRemAccessErr {
		t.Fatalf("READ after invalidation: %v, want remote access error", wc.Status)
	}
}

// TestMemoryHandlesAreTheRoots: an MR knows the root PD it was registered
// in, and the errors of MRs and MWs read "rxego: ..." and match the root's
// ErrInvalidArgument (deregistering, deallocating twice; binding no
// window), as every other call's do.
func TestMemoryHandlesAreTheRoots(t *testing.T) {
	a := open(t, rxego.RC, 4096)
	m, err := a.pd.RegMR(make([]byte, 4096), rxego.AccessLocalWrite|rxego.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	if m.PD() != a.pd || m.Len() != 4096 || m.LKey() != m.RKey() {
		t.Errorf("MR: PD %p (want %p), len %d, lkey %#x rkey %#x", m.PD(), a.pd, m.Len(), m.LKey(), m.RKey())
	}
	if _, err := a.qp.BindMW(nil, 1, 0, m, m.IOVA(), 64, rxego.AccessRemoteRead); !errors.Is(err, rxego.ErrInvalidArgument) ||
		!strings.HasPrefix(err.Error(), "rxego: ") {
		t.Errorf("BindMW without a window: %v", err)
	}
	w, err := a.pd.AllocMW(rxego.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.NextRKey(); !errors.Is(err, rxego.ErrInvalidArgument) {
		t.Errorf("NextRKey of a type 2 window: %v", err)
	}
	if err := w.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := m.Deregister(); err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{"Dealloc": w.Dealloc(), "Deregister": m.Deregister()} {
		if !errors.Is(err, rxego.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), "rxego: ") {
			t.Errorf("%s twice: %v, want an rxego: error matching ErrInvalidArgument", what, err)
		}
	}
}
