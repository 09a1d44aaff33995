package mr

import (
	"errors"
	"testing"
)

func mustAllocMW(t *testing.T, pd *PD, typ MWType) *MW {
	t.Helper()
	w, err := pd.AllocMW(typ)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func mustBind(t *testing.T, tab *Table, pd *PD, qp QPID, b Binding) uint32 {
	t.Helper()
	key, err := tab.Bind(pd, qp, b)
	if err != nil {
		t.Fatalf("Bind(%+v) = %v", b, err)
	}
	return key
}

// A type 1 window serves every QP of its PD, exactly its range and
// rights, with a key of its own; unbinding (length 0) and Dealloc end it.
func TestWindowType1(t *testing.T) {
	tab := NewTable()
	pd := tab.AllocPD()
	buf := make([]byte, 4096)
	m := mustRegister(t, pd, buf, LocalWrite|MWBind, WithIOVA(0x10000))
	w := mustAllocMW(t, pd, MWType1)
	if _, err := tab.Remote(w.RKey(), pd, 0x10000, 8, RemoteRead); err != ErrInvalidated {
		t.Fatalf("unbound window: %v, want ErrInvalidated", err)
	}
	old := w.RKey()
	key := mustBind(t, tab, pd, 5, Binding{MW: old, KeyByte: uint8(old) + 1, MR: m.LKey(), Addr: 0x10100, Length: 256, Access: RemoteRead})
	if key != w.RKey() || key>>8 != old>>8 || uint8(key) != uint8(old)+1 || !w.Bound() {
		t.Fatalf("key %#x, RKey %#x, old %#x, bound %v", key, w.RKey(), old, w.Bound())
	}
	if _, err := tab.Remote(old, pd, 0x10100, 8, RemoteRead); err != ErrInvalidKey {
		t.Errorf("old key: %v", err)
	}
	for _, qpn := range []QPID{0, 5, 9} { // type 1: any QP of the PD
		got, err := tab.RemoteQP(key, pd, qpn, 0x10180, 16, RemoteRead)
		if err != nil {
			t.Fatalf("QP %d: %v", qpn, err)
		}
		checkSlice(t, got, buf, 0x180, 16)
	}
	refusals := []struct {
		name   string
		va     uint64
		n      uint32
		need   Access
		pd     *PD
		expect error
	}{
		{"before the window", 0x100ff, 2, RemoteRead, pd, ErrOutOfBounds},
		{"past the window", 0x101f8, 9, RemoteRead, pd, ErrOutOfBounds},
		{"inside the MR, outside the window", 0x10000, 8, RemoteRead, pd, ErrOutOfBounds},
		{"write on a read window", 0x10100, 8, RemoteWrite, pd, ErrAccessDenied},
		{"atomic on a read window", 0x10100, 8, RemoteAtomic, pd, ErrAccessDenied},
		{"other PD", 0x10100, 8, RemoteRead, tab.AllocPD(), ErrWrongPD},
	}
	for _, r := range refusals {
		if _, err := tab.Remote(key, r.pd, r.va, r.n, r.need); err != r.expect {
			t.Errorf("%s: %v, want %v", r.name, err, r.expect)
		}
	}
	if _, err := tab.Local(key, pd, 0x10100, 8, 0); err != ErrInvalidKey {
		t.Errorf("window key as an lkey: %v", err)
	}
	if err := tab.Invalidate(key, pd); err != ErrAccessDenied {
		t.Errorf("invalidating a type 1 window: %v", err)
	}
	if err := m.Deregister(); !errors.Is(err, ErrBusy) {
		t.Errorf("Deregister with a bound window: %v", err)
	}
	// Rebinding a type 1 window moves it; length 0 unbinds it.
	key2 := mustBind(t, tab, pd, 5, Binding{MW: key, KeyByte: uint8(key) + 1, MR: m.LKey(), Addr: 0x10000, Length: 16, Access: RemoteRead | RemoteWrite})
	if _, err := tab.Remote(key2, pd, 0x10000, 16, RemoteWrite); err != nil {
		t.Errorf("rebound window: %v", err)
	}
	key3 := mustBind(t, tab, pd, 5, Binding{MW: key2, KeyByte: uint8(key2) + 1})
	if _, err := tab.Remote(key3, pd, 0x10000, 1, RemoteRead); err != ErrInvalidated || w.Bound() {
		t.Errorf("unbound window: %v", err)
	}
	if err := pd.Dealloc(); !errors.Is(err, ErrBusy) {
		t.Errorf("PD Dealloc with a window: %v", err)
	}
	if err := m.Deregister(); err != nil {
		t.Errorf("Deregister after unbind: %v", err)
	}
	if err := w.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := w.Dealloc(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("second Dealloc: %v", err)
	}
	if _, err := tab.Remote(key3, pd, 0x10000, 1, RemoteRead); err != ErrInvalidKey {
		t.Errorf("deallocated window: %v", err)
	}
	if err := pd.Dealloc(); err != nil {
		t.Errorf("PD Dealloc: %v", err)
	}
}

// A type 2 window answers only the QP that bound it, may be zero-based,
// must be invalidated before it is bound again, and invalidation ends
// remote access.
func TestWindowType2(t *testing.T) {
	tab := NewTable()
	pd := tab.AllocPD()
	buf := make([]byte, 4096)
	m := mustRegister(t, pd, buf, LocalWrite|MWBind|RemoteRead, WithIOVA(0x10000))
	w := mustAllocMW(t, pd, MWType2)
	b := Binding{MW: w.RKey(), KeyByte: 0x42, MR: m.LKey(), Addr: 0x10800, Length: 64, Access: RemoteWrite | RemoteAtomic | ZeroBased}
	key := mustBind(t, tab, pd, 7, b)
	if uint8(key) != 0x42 {
		t.Fatalf("key %#x", key)
	}
	got, err := tab.RemoteQP(key, pd, 7, 8, 8, RemoteWrite) // zero-based: offset 8 of the window
	if err != nil {
		t.Fatal(err)
	}
	checkSlice(t, got, buf, 0x808, 8)
	if _, err := tab.Atomic64QP(key, pd, 7, 56, RemoteAtomic); err != nil {
		t.Errorf("atomic through the window: %v", err)
	}
	if _, err := tab.RemoteQP(key, pd, 8, 8, 8, RemoteWrite); err != ErrWrongQP {
		t.Errorf("other QP: %v", err)
	}
	if _, err := tab.Remote(key, pd, 8, 8, RemoteWrite); err != ErrWrongQP {
		t.Errorf("Remote (no QP): %v", err)
	}
	if _, err := tab.RemoteQP(key, pd, 7, 60, 8, RemoteWrite); err != ErrOutOfBounds {
		t.Errorf("past the zero-based window: %v", err)
	}
	if _, err := tab.Bind(pd, 7, Binding{MW: key, KeyByte: 0x43, MR: m.LKey(), Addr: 0x10000, Length: 8, Access: RemoteRead}); !errors.Is(err, ErrBusy) {
		t.Errorf("binding a bound type 2 window: %v", err)
	}
	if err := tab.Invalidate(key, tab.AllocPD()); err != ErrWrongPD {
		t.Errorf("invalidate from another PD: %v", err)
	}
	if err := tab.Invalidate(key, pd); err != nil {
		t.Fatal(err)
	}
	if err := tab.Invalidate(key, pd); err != nil {
		t.Errorf("second invalidate: %v", err)
	}
	if _, err := tab.RemoteQP(key, pd, 7, 8, 8, RemoteWrite); err != ErrInvalidated {
		t.Errorf("after invalidation: %v", err)
	}
	if err := m.Deregister(); err != nil { // the window let go of the MR
		t.Errorf("Deregister after invalidation: %v", err)
	}
}

// Every bind refusal, each leaving the window as it was.
func TestBindRefusals(t *testing.T) {
	tab := NewTable()
	pd, other := tab.AllocPD(), tab.AllocPD()
	buf := make([]byte, 256)
	ok := mustRegister(t, pd, buf, LocalWrite|MWBind, WithIOVA(0x1000))
	noBind := mustRegister(t, pd, buf, LocalWrite|RemoteRead, WithIOVA(0x1000))
	readOnly := mustRegister(t, pd, buf, MWBind, WithIOVA(0x1000))
	zb := mustRegister(t, pd, buf, LocalWrite|MWBind|ZeroBased)
	foreign := mustRegister(t, other, buf, LocalWrite|MWBind, WithIOVA(0x1000))
	w1 := mustAllocMW(t, pd, MWType1)
	w2 := mustAllocMW(t, pd, MWType2)
	fw := mustAllocMW(t, other, MWType1)
	good := func(w *MW) Binding {
		return Binding{MW: w.RKey(), KeyByte: 1, MR: ok.LKey(), Addr: 0x1000, Length: 256, Access: RemoteRead}
	}
	cases := []struct {
		name string
		b    Binding
		want error
	}{
		{"unknown window", Binding{MW: 0xffff00, MR: ok.LKey(), Addr: 0x1000, Length: 1, Access: RemoteRead}, ErrInvalidKey},
		{"MR key as window", Binding{MW: ok.LKey(), MR: ok.LKey(), Addr: 0x1000, Length: 1}, ErrInvalidKey},
		{"window of another PD", good(fw), ErrWrongPD},
		{"MR of another PD", func() Binding { b := good(w1); b.MR = foreign.LKey(); return b }(), ErrWrongPD},
		{"MR without MWBind", func() Binding { b := good(w1); b.MR = noBind.LKey(); return b }(), ErrAccessDenied},
		{"writable window, MR without LocalWrite", func() Binding {
			b := good(w1)
			b.MR, b.Access = readOnly.LKey(), RemoteWrite
			return b
		}(), ErrAccessDenied},
		{"zero-based MR", func() Binding { b := good(w1); b.MR, b.Addr = zb.LKey(), 0; return b }(), ErrInvalidArgument},
		{"type 1 zero-based", func() Binding { b := good(w1); b.Access |= ZeroBased; return b }(), ErrInvalidArgument},
		{"type 2 length 0", func() Binding { b := good(w2); b.Length = 0; return b }(), ErrInvalidArgument},
		{"before the MR", func() Binding { b := good(w1); b.Addr = 0xfff; return b }(), ErrOutOfBounds},
		{"past the MR", func() Binding { b := good(w1); b.Addr = 0x1001; return b }(), ErrOutOfBounds},
		{"longer than 2^32", func() Binding { b := good(w1); b.Length = 1<<32 + 1; return b }(), ErrOutOfBounds},
		{"local access flag", func() Binding { b := good(w1); b.Access |= LocalWrite; return b }(), ErrInvalidArgument},
		{"stale window key", func() Binding { b := good(w1); b.MW ^= 0x80; return b }(), ErrInvalidKey},
	}
	for _, c := range cases {
		before := c.b.MW
		if _, err := tab.Bind(pd, 3, c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		for _, w := range []*MW{w1, w2, fw} {
			if w.Bound() {
				t.Fatalf("%s: window %#x bound after a refusal (was %#x)", c.name, w.RKey(), before)
			}
		}
	}
	if _, err := pd.AllocMW(3); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("AllocMW(3): %v", err)
	}
	// The MR of a bound window cannot be invalidated (as rxe).
	inv := mustRegister(t, pd, buf, LocalWrite|MWBind, WithIOVA(0x1000), WithInvalidate())
	b := good(w1)
	b.MR = inv.LKey()
	mustBind(t, tab, pd, 3, b)
	if err := tab.Invalidate(inv.RKey(), pd); err != ErrBusy {
		t.Errorf("invalidating an MR with a bound window: %v", err)
	}
}
