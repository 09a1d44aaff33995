package qp

import (
	"bytes"
	"testing"
	"time"

	"github.com/rxego/rxego/mr"
)

// bindType2 binds a fresh type 2 window of ep's node to the first 64
// bytes of m on ep's QP, with remote read and write, and returns its key.
func bindType2(t *testing.T, f *fabric, ep *endpoint, m *mr.MR, id uint64) (*mr.MW, uint32) {
	t.Helper()
	w := allocMW(t, ep, mr.MWType2)
	key := IncRKey(w.RKey())
	ep.post(t, SendWR{ID: id, Opcode: WRBindMW, Flags: SendSignaled,
		Bind: MWBind{MW: w.RKey(), RKey: key, MR: m.LKey(), Addr: m.IOVA(), Length: 64, Access: mr.RemoteRead | mr.RemoteWrite}})
	f.run(time.Second)
	check(t, "bind", pollAll(ep.scq), want{id, WCSuccess, WCBindMW})
	return w, key
}

// TestMWType2DiesWithItsQP: a type 2 window bound by a QP that is then
// destroyed is unbound, and a new QP created under the same number and
// connected to a third node reaches nothing through the old key: its
// WRITE and READ get remote access errors and the memory is untouched.
func TestMWType2DiesWithItsQP(t *testing.T) {
	f := newFabric(t)
	na, nb, nc := f.node("198.18.0.1"), f.node("198.18.0.2"), f.node("198.18.0.3")
	a, b := na.newQP(t, RC, 16), nb.newQP(t, RC, 16)
	connect(t, a, b, defaultConn())
	m, buf := windowed(t, b)
	w, key := bindType2(t, f, b, m, 1)
	num := b.qp.Num()
	if err := b.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if w.Bound() {
		t.Fatal("the window is still bound after its QP was destroyed")
	}
	// The number is held back for a while (quarantine.go); once the hold
	// is over a new QP may take it, and must not inherit the window.
	f.runFor(closedQPHold + time.Second)
	a2 := nc.newQP(t, RC, 16)
	b2 := nb.newQPWithNum(t, num)
	connect(t, a2, b2, defaultConn())
	src, sbuf := a2.n.reg(t, 64, allAccess)
	copy(sbuf, "forged through a dead window")
	a2.post(t, SendWR{ID: 2, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(src, 0, 28), RemoteAddr: m.IOVA(), RKey: key})
	f.run(time.Second)
	check(t, "write", pollAll(a2.scq), want{2, WCRemAccessErr, WCWrite})
	renew(t, a2, b2, 1)
	a2.post(t, SendWR{ID: 3, Opcode: WRRead, Flags: SendSignaled, SGL: sge(src, 0, 8), RemoteAddr: m.IOVA(), RKey: key})
	f.run(time.Second)
	check(t, "read", pollAll(a2.scq), want{3, WCRemAccessErr, WCRead})
	if !bytes.Equal(buf, make([]byte, len(buf))) {
		t.Fatal("memory behind the dead window was written")
	}
	// The MR is free of the window again.
	if err := m.Deregister(); err != nil {
		t.Fatalf("Deregister after the window's QP died: %v", err)
	}
}

// renew takes both QPs of a connection through ERR and RESET (unless
// there already) and
// connects them again with new PSNs (seeded by n), after a remote access
// error has put one in ERR.
func renew(t *testing.T, a, b *endpoint, n int) {
	t.Helper()
	for _, ep := range []*endpoint{a, b} {
		if ep.qp.State() == Reset {
			continue
		}
		for _, s := range []State{Err, Reset} {
			if err := ep.qp.Modify(&Attr{State: s}, AttrState); err != nil {
				t.Fatal(err)
			}
		}
		pollAll(ep.scq)
	}
	o := defaultConn()
	o.apsn, o.bpsn = uint32(1000+n*10), uint32(90000+n*10)
	connect(t, a, b, o)
}

// newQPWithNum is newQP for an RC QP with the given number.
func (n *node) newQPWithNum(t *testing.T, num uint32) *endpoint {
	t.Helper()
	scq, _ := NewCQ(64)
	rcq, _ := NewCQ(64)
	a := InitAttr{Type: RC, PD: n.pd, SendCQ: scq, RecvCQ: rcq, QPN: num, Caps: Caps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 4, MaxRecvSGE: 4}}
	q, err := n.e.Create(a)
	if err != nil {
		t.Fatal(err)
	}
	return &endpoint{n: n, qp: q, scq: scq, rcq: rcq, attr: a}
}

// TestMWType2DiesWithReset: a QP's type 2 bindings do not survive ERR ->
// RESET -> RTS: after the round the old key is refused on the same QP,
// and a new bind works.
func TestMWType2DiesWithReset(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	m, buf := windowed(t, b)
	w, key := bindType2(t, f, b, m, 1)
	for _, s := range []State{Err, Reset} {
		if err := b.qp.Modify(&Attr{State: s}, AttrState); err != nil {
			t.Fatal(err)
		}
	}
	pollAll(b.scq)
	if w.Bound() {
		t.Fatal("the window is still bound after its QP was reset")
	}
	renew(t, a, b, 1)
	src, sbuf := a.n.reg(t, 64, allAccess)
	copy(sbuf, "after reset")
	a.post(t, SendWR{ID: 2, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(src, 0, 11), RemoteAddr: m.IOVA(), RKey: key})
	f.run(time.Second)
	check(t, "write through the old binding", pollAll(a.scq), want{2, WCRemAccessErr, WCWrite})
	if !bytes.Equal(buf, make([]byte, len(buf))) {
		t.Fatal("memory written through a binding from before the reset")
	}
	renew(t, a, b, 2)
	key2 := IncRKey(key)
	b.post(t, SendWR{ID: 3, Opcode: WRBindMW, Flags: SendSignaled,
		Bind: MWBind{MW: key, RKey: key2, MR: m.LKey(), Addr: m.IOVA(), Length: 64, Access: mr.RemoteWrite}})
	f.run(time.Second)
	check(t, "bind again", pollAll(b.scq), want{3, WCSuccess, WCBindMW})
	a.post(t, SendWR{ID: 4, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(src, 0, 11), RemoteAddr: m.IOVA(), RKey: key2})
	f.run(time.Second)
	check(t, "write through the new binding", pollAll(a.scq), want{4, WCSuccess, WCWrite})
	if string(buf[:11]) != "after reset" {
		t.Fatalf("window bytes %q", buf[:11])
	}
}

// TestMWType1KeysDoNotRepeat: 600 rebinds of a type 1 window by BindMW
// give 601 distinct rkeys (the key byte alone would repeat after 256), each
// works while current and fails once replaced.
func TestMWType1KeysDoNotRepeat(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	m, _ := windowed(t, b)
	w := allocMW(t, b, mr.MWType1)
	src, _ := a.n.reg(t, 64, allAccess)
	seen := map[uint32]bool{w.RKey(): true}
	var prev uint32
	for i := range 600 {
		key, err := b.qp.BindMW(w, uint64(i), 0, m, m.IOVA(), 64, mr.RemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		f.run(time.Second)
		if seen[key] || w.RKey() != key {
			t.Fatalf("rebind %d: rkey %#x (window has %#x) came back", i, key, w.RKey())
		}
		seen[key] = true
		if i%50 == 0 || i == 599 || key>>8 != prev>>8 {
			a.post(t, SendWR{ID: 1, Opcode: WRRead, Flags: SendSignaled, SGL: sge(src, 0, 8), RemoteAddr: m.IOVA(), RKey: key})
			f.run(time.Second)
			check(t, "current key", pollAll(a.scq), want{1, WCSuccess, WCRead})
			if prev != 0 {
				a.post(t, SendWR{ID: 2, Opcode: WRRead, Flags: SendSignaled, SGL: sge(src, 0, 8), RemoteAddr: m.IOVA(), RKey: prev})
				f.run(time.Second)
				check(t, "replaced key", pollAll(a.scq), want{2, WCRemAccessErr, WCRead})
				renew(t, a, b, i)
			}
		}
		prev = key
	}
	if err := w.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := m.Deregister(); err != nil {
		t.Fatalf("Deregister after the window's moves: %v", err)
	}
}
