package mr

import (
	"errors"
	"math"
	"testing"
)

// checkSlice asserts that got is exactly buf[off:off+n] with capacity n.
func checkSlice(t *testing.T, got, buf []byte, off uint64, n uint32) {
	t.Helper()
	if uint64(len(got)) != uint64(n) || uint64(cap(got)) != uint64(n) {
		t.Fatalf("len %d cap %d, want %d", len(got), cap(got), n)
	}
	if n > 0 && &got[0] != &buf[off] {
		t.Fatalf("slice starts at the wrong byte, want offset %d", off)
	}
}

// Every refusal reason, and the order in which they are reported.
func TestLookupRefusals(t *testing.T) {
	tab := NewTable()
	pd, other := tab.AllocPD(), tab.AllocPD()
	buf := make([]byte, 256)
	rw := mustRegister(t, pd, buf, rwAll, WithIOVA(0x1000))
	ro := mustRegister(t, pd, buf, RemoteRead, WithIOVA(0x1000))
	local := mustRegister(t, pd, buf, 0, WithIOVA(0x1000))
	foreign := mustRegister(t, other, buf, rwAll, WithIOVA(0x1000))
	inv := mustRegister(t, pd, buf, rwAll, WithIOVA(0x1000), WithInvalidate())
	if err := tab.Invalidate(inv.RKey(), pd); err != nil {
		t.Fatal(err)
	}
	gone := mustRegister(t, pd, buf, rwAll, WithIOVA(0x1000))
	goneKey := gone.RKey()
	if err := gone.Deregister(); err != nil {
		t.Fatal(err)
	}

	type op int
	const (
		remote op = iota
		local_
	)
	tests := []struct {
		name string
		op   op
		key  uint32
		pd   *PD
		va   uint64
		n    uint32
		need Access
		want error
	}{
		{"remote read ok", remote, ro.RKey(), pd, 0x1010, 16, RemoteRead, nil},
		{"remote write ok", remote, rw.RKey(), pd, 0x1000, 256, RemoteWrite, nil},
		{"local read ok", local_, local.LKey(), pd, 0x1000, 1, 0, nil},
		{"local write ok", local_, rw.LKey(), pd, 0x10ff, 1, LocalWrite, nil},
		{"key 0", remote, 0, pd, 0x1000, 1, RemoteRead, ErrInvalidKey},
		{"unused index", remote, 0xfff00 | ro.RKey()&0xff, pd, 0x1000, 1, RemoteRead, ErrInvalidKey},
		{"index beyond allocated chunks", remote, 0xffffff00, pd, 0x1000, 1, RemoteRead, ErrInvalidKey},
		{"wrong key byte", remote, ro.RKey() ^ 0x5a, pd, 0x1000, 1, RemoteRead, ErrInvalidKey},
		{"deregistered", remote, goneKey, pd, 0x1000, 1, RemoteRead, ErrInvalidKey},
		{"deregistered local", local_, goneKey, pd, 0x1000, 1, 0, ErrInvalidKey},
		{"invalidated", remote, inv.RKey(), pd, 0x1000, 1, RemoteRead, ErrInvalidated},
		{"invalidated local", local_, inv.LKey(), pd, 0x1000, 1, 0, ErrInvalidated},
		{"invalidated beats wrong PD", remote, inv.RKey(), other, 0x1000, 1, RemoteRead, ErrInvalidated},
		{"wrong PD", remote, rw.RKey(), other, 0x1000, 1, RemoteRead, ErrWrongPD},
		{"another PD's key", remote, foreign.RKey(), pd, 0x1000, 1, RemoteRead, ErrWrongPD},
		{"nil PD", local_, rw.LKey(), nil, 0x1000, 1, 0, ErrWrongPD},
		{"wrong PD beats access", remote, ro.RKey(), other, 0x1000, 1, RemoteWrite, ErrWrongPD},
		{"write to read-only", remote, ro.RKey(), pd, 0x1000, 1, RemoteWrite, ErrAccessDenied},
		{"atomic on read-only", remote, ro.RKey(), pd, 0x1000, 8, RemoteAtomic, ErrAccessDenied},
		{"remote read of local-only", remote, local.RKey(), pd, 0x1000, 1, RemoteRead, ErrAccessDenied},
		{"local write to read-only", local_, ro.LKey(), pd, 0x1000, 1, LocalWrite, ErrAccessDenied},
		{"all of need required", remote, ro.RKey(), pd, 0x1000, 1, RemoteRead | RemoteWrite, ErrAccessDenied},
		{"access beats bounds", remote, ro.RKey(), pd, 0, 1 << 31, RemoteWrite, ErrAccessDenied},
		{"out of bounds", remote, rw.RKey(), pd, 0x1000, 257, RemoteRead, ErrOutOfBounds},
		{"remote need empty", remote, rw.RKey(), pd, 0x1000, 1, 0, ErrInvalidArgument},
		{"remote need local", remote, rw.RKey(), pd, 0x1000, 1, LocalWrite, ErrInvalidArgument},
		{"local need remote", local_, rw.LKey(), pd, 0x1000, 1, RemoteRead, ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lookup := tab.Remote
			if tc.op == local_ {
				lookup = tab.Local
			}
			got, err := lookup(tc.key, tc.pd, tc.va, tc.n, tc.need)
			if err != tc.want {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if err != nil {
				if got != nil {
					t.Fatalf("refused lookup returned %d bytes", len(got))
				}
				return
			}
			checkSlice(t, got, buf, tc.va-0x1000, tc.n)
		})
	}
}

// Bounds at the exact edges, including wrap-around at 2^64.
func TestBounds(t *testing.T) {
	tab := NewTable()
	pd := tab.AllocPD()
	buf := make([]byte, 256)
	const base = 0x1000
	top := uint64(math.MaxUint64 - 256) // MR ends at 2^64-1
	mid := mustRegister(t, pd, buf, RemoteRead, WithIOVA(base))
	high := mustRegister(t, pd, buf, RemoteRead, WithIOVA(top))
	empty := mustRegister(t, pd, buf[:0], RemoteRead, WithIOVA(base))

	tests := []struct {
		name string
		mr   *MR
		va   uint64
		n    uint32
		ok   bool
	}{
		{"whole", mid, base, 256, true},
		{"first byte", mid, base, 1, true},
		{"last byte", mid, base + 255, 1, true},
		{"zero length at start", mid, base, 0, true},
		{"zero length at end", mid, base + 256, 0, true},
		{"zero length past end", mid, base + 257, 0, false},
		{"zero length before start", mid, base - 1, 0, false},
		{"one past end", mid, base + 256, 1, false},
		{"one before start", mid, base - 1, 1, false},
		{"straddles start", mid, base - 1, 2, false},
		{"one too long", mid, base, 257, false},
		{"straddles end", mid, base + 255, 2, false},
		{"length 2^31", mid, base, 1 << 31, false},
		{"length 2^32-1", mid, base, math.MaxUint32, false},
		{"va 2^64-1", mid, math.MaxUint64, 1, false},
		{"va+len wraps into the MR", mid, math.MaxUint64 - 7, 0x1010, false},
		{"va 0", mid, 0, 1, false},
		{"high whole", high, top, 256, true},
		{"high zero length at 2^64-1", high, math.MaxUint64, 0, true},
		{"high last byte", high, math.MaxUint64 - 1, 1, true},
		{"high va 2^64-1 len 1 wraps", high, math.MaxUint64, 1, false},
		{"high wraps", high, math.MaxUint64 - 5, 10, false},
		{"high max length", high, top, math.MaxUint32, false},
		{"empty MR zero length", empty, base, 0, true},
		{"empty MR one byte", empty, base, 1, false},
		{"empty MR zero length after", empty, base + 1, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tab.Remote(tc.mr.RKey(), pd, tc.va, tc.n, RemoteRead)
			if !tc.ok {
				if err != ErrOutOfBounds {
					t.Fatalf("err = %v, want ErrOutOfBounds", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("err = %v, want success", err)
			}
			checkSlice(t, got, buf, tc.va-tc.mr.IOVA(), tc.n)
		})
	}
}

// A 2^31-byte RDMA transfer, the largest RETH DMA length, over a 2 GiB MR.
func TestBoundsMaxDMALength(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 2 GiB (untouched)")
	}
	tab := NewTable()
	pd := tab.AllocPD()
	buf := make([]byte, 1<<31)
	m := mustRegister(t, pd, buf, LocalWrite|RemoteWrite)
	got, err := tab.Remote(m.RKey(), pd, m.IOVA(), 1<<31, RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	checkSlice(t, got, buf, 0, 1<<31)
	if _, err := tab.Remote(m.RKey(), pd, m.IOVA()+1, 1<<31, RemoteWrite); err != ErrOutOfBounds {
		t.Errorf("2^31 bytes from offset 1: err %v, want ErrOutOfBounds", err)
	}
}

func TestZeroBasedAddressing(t *testing.T) {
	tab := NewTable()
	pd := tab.AllocPD()
	buf := make([]byte, 64)
	m := mustRegister(t, pd, buf, LocalWrite|RemoteWrite|ZeroBased)
	got, err := tab.Remote(m.RKey(), pd, 10, 4, RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	copy(got, "abcd")
	if string(buf[10:14]) != "abcd" {
		t.Errorf("write through the returned slice landed elsewhere: %q", buf[8:16])
	}
	// The real address of the buffer means nothing to a zero-based MR.
	if _, err := tab.Remote(m.RKey(), pd, addr(buf), 1, RemoteWrite); err != ErrOutOfBounds {
		t.Errorf("real address on a zero-based MR: err %v, want ErrOutOfBounds", err)
	}
}

func TestInvalidateRevalidate(t *testing.T) {
	tab := NewTable()
	pd, other := tab.AllocPD(), tab.AllocPD()
	buf := make([]byte, 64)
	m := mustRegister(t, pd, buf, rwAll, WithInvalidate())
	plain := mustRegister(t, pd, buf, rwAll)
	old := m.RKey()

	for _, tc := range []struct {
		name string
		key  uint32
		pd   *PD
		want error
	}{
		{"wrong key byte", old ^ 1, pd, ErrInvalidKey},
		{"unused index", 0x00abcd00, pd, ErrInvalidKey},
		{"index beyond allocated chunks", 0xffffff00, pd, ErrInvalidKey},
		{"wrong PD", old, other, ErrWrongPD},
		{"not invalidatable", plain.RKey(), pd, ErrAccessDenied},
	} {
		if err := tab.Invalidate(tc.key, tc.pd); err != tc.want {
			t.Errorf("Invalidate %s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := m.Revalidate(uint8(old) + 1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Revalidate of a valid MR = %v, want ErrInvalidArgument", err)
	}
	if _, err := tab.Remote(old, pd, m.IOVA(), 8, RemoteRead); err != nil {
		t.Fatalf("failed invalidations changed the MR: %v", err)
	}

	if err := tab.Invalidate(old, pd); err != nil {
		t.Fatal(err)
	}
	if err := tab.Invalidate(old, pd); err != nil {
		t.Errorf("second Invalidate = %v, want nil", err)
	}
	if _, err := tab.Remote(old, pd, m.IOVA(), 8, RemoteRead); err != ErrInvalidated {
		t.Errorf("Remote after Invalidate: %v, want ErrInvalidated", err)
	}
	if _, err := tab.Local(old, pd, m.IOVA(), 8, 0); err != ErrInvalidated {
		t.Errorf("Local after Invalidate: %v, want ErrInvalidated", err)
	}
	if _, err := m.Revalidate(uint8(old)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Revalidate with the same key byte = %v, want ErrInvalidArgument", err)
	}

	key, err := m.Revalidate(uint8(old) + 1)
	if err != nil {
		t.Fatal(err)
	}
	if key != old&^0xff|uint32(uint8(old)+1) || m.RKey() != key || m.LKey() != key {
		t.Fatalf("Revalidate key %#x, RKey %#x, old %#x", key, m.RKey(), old)
	}
	if _, err := tab.Remote(key, pd, m.IOVA(), 8, RemoteRead); err != nil {
		t.Errorf("new key after Revalidate: %v", err)
	}
	if _, err := tab.Remote(old, pd, m.IOVA(), 8, RemoteRead); err != ErrInvalidKey {
		t.Errorf("old key after Revalidate: %v, want ErrInvalidKey", err)
	}

	// Deregistering an invalidated MR works and ends it for good.
	if err := tab.Invalidate(key, pd); err != nil {
		t.Fatal(err)
	}
	if err := m.Deregister(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Revalidate(uint8(key) + 1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Revalidate after Deregister = %v, want ErrInvalidArgument", err)
	}
	if err := tab.Invalidate(key, pd); err != ErrInvalidKey {
		t.Errorf("Invalidate after Deregister = %v, want ErrInvalidKey", err)
	}
	if s := tab.Stats(); s.MRs != 1 {
		t.Errorf("Stats.MRs = %d, want 1", s.MRs)
	}
}

func TestLookupDoesNotAllocate(t *testing.T) {
	tab := NewTable()
	pd := tab.AllocPD()
	buf := make([]byte, 4096)
	m := mustRegister(t, pd, buf, rwAll)
	key, va := m.RKey(), m.IOVA()
	for name, f := range map[string]func(){
		"Remote":   func() { _, _ = tab.Remote(key, pd, va+64, 1024, RemoteWrite) },
		"Local":    func() { _, _ = tab.Local(key, pd, va, 4096, LocalWrite) },
		"refused":  func() { _, _ = tab.Remote(key^1, pd, va, 1, RemoteRead) },
		"Atomic64": func() { w, _ := tab.Atomic64(key, pd, va+8, RemoteAtomic); w.FetchAdd(1) },
	} {
		if n := testing.AllocsPerRun(1000, f); n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", name, n)
		}
	}
}
