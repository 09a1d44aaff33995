package mr

import (
	"errors"
	"math"
	"testing"
	"unsafe"
)

const rwAll = LocalWrite | RemoteWrite | RemoteRead | RemoteAtomic

func mustRegister(t testing.TB, pd *PD, buf []byte, access Access, opts ...Option) *MR {
	t.Helper()
	m, err := pd.Register(buf, access, opts...)
	if err != nil {
		t.Fatalf("Register(len %d, %v): %v", len(buf), access, err)
	}
	return m
}

func addr(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

func TestRegisterDefaults(t *testing.T) {
	tab := NewTable()
	pd := tab.AllocPD()
	buf := make([]byte, 100)
	m := mustRegister(t, pd, buf, LocalWrite|RemoteRead)

	if got, want := m.IOVA(), addr(buf); got != want {
		t.Errorf("IOVA = %#x, want address of buf[0] %#x", got, want)
	}
	if m.Len() != 100 || m.Access() != LocalWrite|RemoteRead || m.PD() != pd {
		t.Errorf("Len %d Access %v PD %p, want 100 LocalWrite|RemoteRead %p", m.Len(), m.Access(), m.PD(), pd)
	}
	if &m.Buffer()[0] != &buf[0] || len(m.Buffer()) != 100 {
		t.Errorf("Buffer is not the registered slice")
	}
	if m.LKey() != m.RKey() || m.LKey()>>8 == 0 {
		t.Errorf("LKey %#x RKey %#x: want equal keys with a non-zero index", m.LKey(), m.RKey())
	}
	if s := tab.Stats(); s != (Stats{PDs: 1, MRs: 1}) {
		t.Errorf("Stats = %+v, want 1 PD 1 MR", s)
	}
}

func TestRegisterIOVA(t *testing.T) {
	tab := NewTable()
	pd := tab.AllocPD()
	buf := make([]byte, 16)
	tests := []struct {
		name   string
		buf    []byte
		access Access
		opts   []Option
		want   uint64
	}{
		{"chosen", buf, LocalWrite, []Option{WithIOVA(0xdead0000)}, 0xdead0000},
		{"zero based", buf, LocalWrite | ZeroBased, nil, 0},
		{"chosen zero", buf, 0, []Option{WithIOVA(0)}, 0},
		{"ends at 2^64-1", buf, 0, []Option{WithIOVA(math.MaxUint64 - 16)}, math.MaxUint64 - 16},
		{"empty buffer", buf[:0], 0, []Option{WithIOVA(7)}, 7},
		{"nil buffer", nil, 0, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := mustRegister(t, pd, tc.buf, tc.access, tc.opts...)
			if m.IOVA() != tc.want || m.Len() != len(tc.buf) {
				t.Errorf("IOVA %#x Len %d, want %#x %d", m.IOVA(), m.Len(), tc.want, len(tc.buf))
			}
		})
	}
}

func TestRegisterRejects(t *testing.T) {
	tab := NewTable()
	pd := tab.AllocPD()
	buf := make([]byte, 16)
	tests := []struct {
		name   string
		pd     *PD
		access Access
		opts   []Option
		want   error
	}{
		{"OnDemand", pd, OnDemand, nil, ErrUnsupported},
		{"unknown bit 7", pd, 1 << 7, nil, ErrUnsupported},
		{"relaxed ordering", pd, 1 << 20, nil, ErrUnsupported},
		{"RemoteWrite without LocalWrite", pd, RemoteWrite, nil, ErrInvalidArgument},
		{"RemoteAtomic without LocalWrite", pd, RemoteAtomic | RemoteRead, nil, ErrInvalidArgument},
		{"WithIOVA and ZeroBased", pd, ZeroBased, []Option{WithIOVA(1)}, ErrInvalidArgument},
		{"IOVA wraps", pd, 0, []Option{WithIOVA(math.MaxUint64 - 15)}, ErrInvalidArgument},
		{"nil PD", nil, 0, nil, ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := tc.pd.Register(buf, tc.access, tc.opts...)
			if !errors.Is(err, tc.want) || m != nil {
				t.Errorf("Register = %v, %v; want nil, %v", m, err, tc.want)
			}
		})
	}
	if s := tab.Stats(); s.MRs != 0 {
		t.Errorf("rejected registrations left %d MRs", s.MRs)
	}
}

func TestPDLifecycle(t *testing.T) {
	tab := NewTable()
	pd := tab.AllocPD()
	m := mustRegister(t, pd, make([]byte, 8), 0)

	if err := pd.Dealloc(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Dealloc with a registered MR = %v, want ErrBusy", err)
	}
	if err := m.Deregister(); err != nil {
		t.Fatal(err)
	}
	if err := m.Deregister(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("second Deregister = %v, want ErrInvalidArgument", err)
	}
	if err := pd.Dealloc(); err != nil {
		t.Fatalf("Dealloc of an empty PD = %v", err)
	}
	if err := pd.Dealloc(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("second Dealloc = %v, want ErrInvalidArgument", err)
	}
	if _, err := pd.Register(make([]byte, 8), 0); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Register in a deallocated PD = %v, want ErrInvalidArgument", err)
	}
	var nilPD *PD
	if err := nilPD.Dealloc(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("nil PD Dealloc = %v, want ErrInvalidArgument", err)
	}
	if s := tab.Stats(); s != (Stats{}) {
		t.Errorf("Stats = %+v, want zero", s)
	}
}

func TestTableFull(t *testing.T) {
	tab := NewTable()
	tab.limit = 2
	pd := tab.AllocPD()
	a := mustRegister(t, pd, nil, 0)
	mustRegister(t, pd, nil, 0)
	if _, err := pd.Register(nil, 0); !errors.Is(err, ErrTableFull) {
		t.Fatalf("third Register = %v, want ErrTableFull", err)
	}
	if err := a.Deregister(); err != nil {
		t.Fatal(err)
	}
	c := mustRegister(t, pd, nil, 0)
	if c.LKey()>>8 != a.LKey()>>8 {
		t.Errorf("index %d not reused, want %d", c.LKey()>>8, a.LKey()>>8)
	}
}

// Re-registering must give a key that differs from the stale one, and
// the stale key must fail; the index is drawn at random, so a stream of
// re-registrations of one MR spreads over the table.
func TestReRegisterSpreadsIndices(t *testing.T) {
	tab := NewTable()
	pd := tab.AllocPD()
	buf := make([]byte, 8)
	prev := mustRegister(t, pd, buf, RemoteRead)
	idxs := map[uint32]bool{prev.LKey() >> 8: true}
	const cycles = 1000
	for range cycles {
		old := prev.RKey()
		if err := prev.Deregister(); err != nil {
			t.Fatal(err)
		}
		m := mustRegister(t, pd, buf, RemoteRead)
		if m.RKey() == old {
			t.Fatalf("key %#x given again at once", old)
		}
		if _, err := tab.Remote(old, pd, m.IOVA(), 1, RemoteRead); err != ErrInvalidKey {
			t.Fatalf("stale key %#x: err %v, want ErrInvalidKey", old, err)
		}
		idxs[m.RKey()>>8] = true
		prev = m
	}
	// 1001 draws from 4095 indices give about 890 distinct ones; fewer
	// than 800 would mean the draw is not random (far below 1e-9).
	if len(idxs) < 800 {
		t.Errorf("only %d distinct indices in %d registrations", len(idxs), cycles+1)
	}
}

// At one index the key byte walks a permutation of all 256 bytes: every
// window of 256 registrations there uses each byte once, so a stale key
// comes back only after 256 registrations at its index, and the order is
// not simply counting.
func TestKeyByteCyclesAtOneIndex(t *testing.T) {
	tab := NewTable()
	tab.limit = 1 // one usable index
	pd := tab.AllocPD()
	var keys []uint8
	for range 3 * 256 {
		m := mustRegister(t, pd, nil, 0)
		if m.LKey()>>8 != 1 {
			t.Fatalf("index %d, want 1", m.LKey()>>8)
		}
		keys = append(keys, uint8(m.LKey()))
		if err := m.Deregister(); err != nil {
			t.Fatal(err)
		}
	}
	steps := map[uint8]int{}
	for i := range keys {
		if i >= 256 && keys[i] != keys[i-256] {
			t.Fatalf("registration %d: key byte %#x, 256 earlier %#x: not one cycle", i, keys[i], keys[i-256])
		}
		if i > 0 {
			steps[keys[i]-keys[i-1]]++
		}
	}
	var seen [256]bool
	for _, k := range keys[:256] {
		if seen[k] {
			t.Fatalf("key byte %#x twice in one cycle", k)
		}
		seen[k] = true
	}
	// A shuffled cycle has many different steps; a counter has one.
	if len(steps) < 64 {
		t.Errorf("key byte steps take only %d values: the sequence is guessable", len(steps))
	}
}

// A key byte chosen by Revalidate is not the next one handed out at its
// index once the MR is deregistered.
func TestRevalidatedKeyNotReissued(t *testing.T) {
	tab := NewTable()
	tab.limit = 1
	pd := tab.AllocPD()
	for range 512 {
		m := mustRegister(t, pd, nil, 0, WithInvalidate())
		next := uint8(m.LKey()) + 1 // any byte will do; walk them all
		if next == uint8(m.LKey()) {
			next++
		}
		if err := tab.Invalidate(m.LKey(), pd); err != nil {
			t.Fatal(err)
		}
		k, err := m.Revalidate(next)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Deregister(); err != nil {
			t.Fatal(err)
		}
		if n := mustRegister(t, pd, nil, 0); n.LKey() == k {
			t.Fatalf("revalidated key %#x reissued at once", k)
		} else if err := n.Deregister(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTablesDrawDifferentKeys(t *testing.T) {
	var keys [2][8]uint32
	for i := range keys {
		pd := NewTable().AllocPD()
		for j := range keys[i] {
			keys[i][j] = mustRegister(t, pd, nil, 0).LKey()
		}
	}
	// Same indices, 64 random bits: equal only if the seeding is broken.
	if keys[0] == keys[1] {
		t.Errorf("two tables produced the same keys %#x", keys[0])
	}
}

func TestAccessString(t *testing.T) {
	for a, want := range map[Access]string{
		0:                       "0",
		LocalWrite | RemoteRead: "LocalWrite|RemoteRead",
		OnDemand | 1<<9:         "OnDemand|0x200",
	} {
		if got := a.String(); got != want {
			t.Errorf("Access(%#x).String() = %q, want %q", uint32(a), got, want)
		}
	}
}
