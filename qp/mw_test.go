package qp

import (
	"bytes"
	"testing"
	"time"

	"github.com/rxego/rxego/mr"
)

// windowed registers a 4096-byte MR on ep's node that windows may be
// bound to; it grants no remote access itself.
func windowed(t *testing.T, ep *endpoint) (*mr.MR, []byte) {
	t.Helper()
	return ep.n.reg(t, 4096, mr.LocalWrite|mr.MWBind)
}

func allocMW(t *testing.T, ep *endpoint, typ mr.MWType) *mr.MW {
	t.Helper()
	w, err := ep.n.pd.AllocMW(typ)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestMWType1: ibv_bind_mw's counterpart binds a window on an MR without
// remote rights; the peer WRITEs and READs through the window's rkey and
// exactly the window's bytes move; the MR's own key and the window's old
// key stay refused.
func TestMWType1(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	m, buf := windowed(t, b)
	w := allocMW(t, b, mr.MWType1)
	old := w.RKey()
	key, err := b.qp.BindMW(w, 1, SendSignaled, m, m.IOVA()+1024, 512, mr.RemoteRead|mr.RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	f.run(time.Second)
	check(t, "bind", pollAll(b.scq), want{1, WCSuccess, WCBindMW})
	if key != w.RKey() || key == old || key>>8 != old>>8 {
		t.Fatalf("rkey %#x after bind, BindMW said %#x, before %#x", w.RKey(), key, old)
	}
	src, sbuf := a.n.reg(t, 4096, allAccess)
	copy(sbuf, bytes.Repeat([]byte("window"), 100))
	a.post(t, SendWR{ID: 2, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(src, 0, 512), RemoteAddr: m.IOVA() + 1024, RKey: key})
	a.post(t, SendWR{ID: 3, Opcode: WRRead, Flags: SendSignaled, SGL: sge(src, 2048, 100), RemoteAddr: m.IOVA() + 1024 + 412, RKey: key})
	f.run(time.Second)
	check(t, "through the window", pollAll(a.scq), want{2, WCSuccess, WCWrite}, want{3, WCSuccess, WCRead})
	if !bytes.Equal(buf[1024:1536], sbuf[:512]) || !bytes.Equal(sbuf[2048:2148], sbuf[412:512]) {
		t.Fatal("bytes through the window differ")
	}
	if bytes.Count(buf[:1024], []byte{0}) != 1024 || bytes.Count(buf[1536:], []byte{0}) != 4096-1536 {
		t.Fatal("bytes outside the window were written")
	}
	// The MR's own key grants nothing remote.
	a.post(t, SendWR{ID: 4, Opcode: WRRead, Flags: SendSignaled, SGL: sge(src, 0, 8), RemoteAddr: m.IOVA() + 1024, RKey: m.RKey()})
	f.run(time.Second)
	check(t, "MR key", pollAll(a.scq), want{4, WCRemAccessErr, WCRead})
}

// TestMWRefusals: accesses outside a window's range or rights, with its
// old key, or on another QP for a type 2 window, each get a remote
// access error NAK (the requester completes with WCRemAccessErr) and
// touch nothing.
func TestMWRefusals(t *testing.T) {
	cases := []struct {
		name string
		typ  mr.MWType
		wr   func(m *mr.MR, key, old uint32, src *mr.MR) SendWR
	}{
		{"WRITE before the window", mr.MWType1, func(m *mr.MR, key, _ uint32, src *mr.MR) SendWR {
			return SendWR{Opcode: WRWrite, SGL: sge(src, 0, 8), RemoteAddr: m.IOVA() + 1020, RKey: key}
		}},
		{"WRITE past the window", mr.MWType1, func(m *mr.MR, key, _ uint32, src *mr.MR) SendWR {
			return SendWR{Opcode: WRWrite, SGL: sge(src, 0, 8), RemoteAddr: m.IOVA() + 1024 + 256 - 4, RKey: key}
		}},
		{"READ on a write-only window", mr.MWType1, func(m *mr.MR, key, _ uint32, src *mr.MR) SendWR {
			return SendWR{Opcode: WRRead, SGL: sge(src, 0, 8), RemoteAddr: m.IOVA() + 1024, RKey: key}
		}},
		{"atomic on a write-only window", mr.MWType1, func(m *mr.MR, key, _ uint32, src *mr.MR) SendWR {
			return SendWR{Opcode: WRFetchAdd, SGL: sge(src, 0, 8), RemoteAddr: m.IOVA() + 1024, RKey: key}
		}},
		{"old key", mr.MWType1, func(m *mr.MR, _, old uint32, src *mr.MR) SendWR {
			return SendWR{Opcode: WRWrite, SGL: sge(src, 0, 8), RemoteAddr: m.IOVA() + 1024, RKey: old}
		}},
		{"zero-based window, VA address", mr.MWType2, func(m *mr.MR, key, _ uint32, src *mr.MR) SendWR {
			return SendWR{Opcode: WRWrite, SGL: sge(src, 0, 8), RemoteAddr: m.IOVA() + 1024, RKey: key}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, a, b := pair(t, RC, defaultConn())
			m, buf := windowed(t, b)
			w := allocMW(t, b, c.typ)
			old := w.RKey()
			access := mr.RemoteWrite
			if c.typ == mr.MWType2 {
				access |= mr.ZeroBased
			}
			b.post(t, SendWR{ID: 1, Opcode: WRBindMW, Flags: SendSignaled,
				Bind: MWBind{MW: old, RKey: IncRKey(old), MR: m.LKey(), Addr: m.IOVA() + 1024, Length: 256, Access: access}})
			f.run(time.Second)
			check(t, "bind", pollAll(b.scq), want{1, WCSuccess, WCBindMW})
			src, sbuf := a.n.reg(t, 64, allAccess)
			copy(sbuf, "xxxxxxxx")
			wr := c.wr(m, w.RKey(), old, src)
			wr.ID, wr.Flags = 2, SendSignaled
			a.post(t, wr)
			f.run(time.Second)
			check(t, "access", pollAll(a.scq), want{2, WCRemAccessErr, wcOpcodeOf(wr.Opcode)})
			if bytes.Count(buf, []byte{0}) != len(buf) {
				t.Fatal("memory was written")
			}
		})
	}
}

// TestMWType2: a BIND_MW work request binds a zero-based type 2 window;
// the peer reaches it from address 0 on the QP that bound it, and not on
// another QP of the same PD; SEND with Invalidate on its rkey unbinds it
// (the receive completion names the key) and the next access gets a
// remote access error; a new bind then works again.
func TestMWType2(t *testing.T) {
	f := newFabric(t)
	na, nb := f.node("198.18.0.1"), f.node("198.18.0.2")
	a, b := na.newQP(t, RC, 64), nb.newQP(t, RC, 64)
	a2, b2 := na.newQP(t, RC, 64), nb.newQP(t, RC, 64)
	connect(t, a, b, defaultConn())
	connect(t, a2, b2, defaultConn())
	m, buf := windowed(t, b)
	w := allocMW(t, b, mr.MWType2)
	key := w.RKey()&^0xff | 0x5a
	b.post(t, SendWR{ID: 1, Opcode: WRBindMW, Flags: SendSignaled,
		Bind: MWBind{MW: w.RKey(), RKey: key, MR: m.LKey(), Addr: m.IOVA() + 100, Length: 300, Access: mr.RemoteWrite | mr.RemoteRead | mr.ZeroBased}})
	f.run(time.Second)
	check(t, "bind", pollAll(b.scq), want{1, WCSuccess, WCBindMW})
	if w.RKey() != key {
		t.Fatalf("rkey %#x, want %#x", w.RKey(), key)
	}
	src, sbuf := a.n.reg(t, 4096, allAccess)
	copy(sbuf, "zero-based window")
	a.post(t, SendWR{ID: 2, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(src, 0, 17), RemoteAddr: 10, RKey: key})
	f.run(time.Second)
	check(t, "write", pollAll(a.scq), want{2, WCSuccess, WCWrite})
	if string(buf[110:127]) != "zero-based window" {
		t.Fatalf("window bytes %q", buf[100:140])
	}
	// Another QP of the same PD is refused.
	src2, _ := a2.n.reg(t, 64, allAccess)
	a2.post(t, SendWR{ID: 3, Opcode: WRRead, Flags: SendSignaled, SGL: sge(src2, 0, 8), RemoteAddr: 10, RKey: key})
	f.run(time.Second)
	check(t, "other QP", pollAll(a2.scq), want{3, WCRemAccessErr, WCRead})

	rmr, _ := b.n.reg(t, 64, allAccess)
	b.recv(t, 4, rmr, 0, 64)
	a.post(t, SendWR{ID: 5, Opcode: WRSendInv, InvalidateRKey: key, Flags: SendSignaled, SGL: sge(src, 0, 4)})
	f.run(time.Second)
	check(t, "send with invalidate", pollAll(a.scq), want{5, WCSuccess, WCSend})
	rw := pollAll(b.rcq)
	check(t, "receive", rw, want{4, WCSuccess, WCRecv})
	if rw[0].Flags&WCWithInv == 0 || rw[0].InvalidatedRKey != key || w.Bound() {
		t.Fatalf("receive %+v, window bound %v", rw[0], w.Bound())
	}
	// Binding again under a new key works; the old key stays refused.
	key2 := IncRKey(key)
	b.post(t, SendWR{ID: 6, Opcode: WRBindMW, Flags: SendSignaled,
		Bind: MWBind{MW: key, RKey: key2, MR: m.LKey(), Addr: m.IOVA(), Length: 8, Access: mr.RemoteRead}})
	f.run(time.Second)
	check(t, "rebind", pollAll(b.scq), want{6, WCSuccess, WCBindMW})
	a.post(t, SendWR{ID: 7, Opcode: WRRead, Flags: SendSignaled, SGL: sge(src, 0, 8), RemoteAddr: m.IOVA(), RKey: key2})
	f.run(time.Second)
	check(t, "read after rebind", pollAll(a.scq), want{7, WCSuccess, WCRead})
	a.post(t, SendWR{ID: 8, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(src, 0, 8), RemoteAddr: 10, RKey: key})
	f.run(time.Second)
	check(t, "old key after invalidation", pollAll(a.scq), want{8, WCRemAccessErr, WCWrite})
}

// TestMWLocalInvalidate: LOCAL_INV on a type 2 window's rkey unbinds it
// in send-queue order: the READ before it succeeds, the one after gets a
// remote access error. A type 1 window refuses LOCAL_INV.
func TestMWLocalInvalidate(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	m, _ := windowed(t, b)
	w := allocMW(t, b, mr.MWType2)
	key := IncRKey(w.RKey())
	b.post(t, SendWR{ID: 1, Opcode: WRBindMW, Bind: MWBind{MW: w.RKey(), RKey: key, MR: m.LKey(), Addr: m.IOVA(), Length: 64, Access: mr.RemoteRead}})
	f.run(time.Second)
	src, _ := a.n.reg(t, 64, allAccess)
	a.post(t, SendWR{ID: 2, Opcode: WRRead, Flags: SendSignaled, SGL: sge(src, 0, 8), RemoteAddr: m.IOVA(), RKey: key})
	f.run(time.Second)
	check(t, "read before", pollAll(a.scq), want{2, WCSuccess, WCRead})
	b.post(t, SendWR{ID: 3, Opcode: WRLocalInv, Flags: SendSignaled, InvalidateRKey: key})
	f.run(time.Second)
	check(t, "local invalidate", pollAll(b.scq), want{3, WCSuccess, WCLocalInv})
	a.post(t, SendWR{ID: 4, Opcode: WRRead, Flags: SendSignaled, SGL: sge(src, 0, 8), RemoteAddr: m.IOVA(), RKey: key})
	f.run(time.Second)
	check(t, "read after", pollAll(a.scq), want{4, WCRemAccessErr, WCRead})

	f, _, b = pair(t, RC, defaultConn())
	m, _ = windowed(t, b)
	w1 := allocMW(t, b, mr.MWType1)
	k1, err := b.qp.BindMW(w1, 5, 0, m, m.IOVA(), 64, mr.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	b.post(t, SendWR{ID: 6, Opcode: WRLocalInv, InvalidateRKey: k1})
	f.run(time.Second)
	check(t, "type 1 local invalidate", pollAll(b.scq), want{6, WCLocQPOpErr, WCLocalInv})
}

// TestMWBindRefused: a bind the checks refuse completes with
// WCMWBindErr, moves the QP to ERR (as rxe) and leaves the window
// unbound; BindMW refuses a type 2 window at post time.
func TestMWBindRefused(t *testing.T) {
	f, _, b := pair(t, RC, defaultConn())
	plain, _ := b.n.reg(t, 64, allAccess) // no MWBind
	w := allocMW(t, b, mr.MWType1)
	if _, err := b.qp.BindMW(w, 1, SendSignaled, plain, plain.IOVA(), 64, mr.RemoteRead); err != nil {
		t.Fatal(err)
	}
	b.post(t, SendWR{ID: 2, Opcode: WRSend})
	f.run(time.Second)
	check(t, "bind", pollAll(b.scq), want{1, WCMWBindErr, WCBindMW}, want{2, WCWRFlushErr, WCSend})
	if w.Bound() || b.qp.State() != Err {
		t.Fatalf("window bound %v, QP %v", w.Bound(), b.qp.State())
	}
	_, _, b = pair(t, RC, defaultConn())
	if _, err := b.qp.BindMW(allocMW(t, b, mr.MWType2), 3, 0, plain, 0, 0, 0); err == nil {
		t.Fatal("BindMW took a type 2 window")
	}
}
