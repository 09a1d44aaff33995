package mr

import (
	"encoding/binary"
	"math"
	"sync"
	"testing"
)

func TestAtomic64Checks(t *testing.T) {
	tab := NewTable()
	pd := tab.AllocPD()
	// A 64-byte heap allocation is 8-aligned, so big[1:] is not.
	big := make([]byte, 64)
	if addr(big)%8 != 0 {
		t.Fatalf("test assumes an 8-aligned allocation, got %#x", addr(big))
	}
	atom := mustRegister(t, pd, big, rwAll, WithIOVA(0x1000))
	writeOnly := mustRegister(t, pd, big, LocalWrite|RemoteWrite, WithIOVA(0x1000))
	odd := mustRegister(t, pd, big[1:41], rwAll, WithIOVA(0x2000))
	oddZero := mustRegister(t, pd, big[4:], rwAll|ZeroBased)

	tests := []struct {
		name string
		mr   *MR
		va   uint64
		need Access
		want error
	}{
		{"aligned", atom, 0x1008, RemoteAtomic, nil},
		{"last word", atom, 0x1038, RemoteAtomic, nil},
		{"atomic write", writeOnly, 0x1000, RemoteWrite, nil},
		{"va misaligned", atom, 0x1004, RemoteAtomic, ErrMisaligned},
		{"va misaligned by 1", atom, 0x1001, RemoteAtomic, ErrMisaligned},
		{"memory misaligned", odd, 0x2000, RemoteAtomic, ErrMisaligned},
		{"zero based, memory misaligned", oddZero, 0, RemoteAtomic, ErrMisaligned},
		{"no atomic access", writeOnly, 0x1000, RemoteAtomic, ErrAccessDenied},
		{"past end", atom, 0x1040, RemoteAtomic, ErrOutOfBounds},
		{"straddles end", atom, 0x103c, RemoteAtomic, ErrOutOfBounds},
		{"wraps", atom, math.MaxUint64 - 3, RemoteAtomic, ErrOutOfBounds},
		{"need read", atom, 0x1000, RemoteRead, ErrInvalidArgument},
		{"need both", atom, 0x1000, RemoteAtomic | RemoteWrite, ErrInvalidArgument},
		{"bad key", atom, 0x1000, RemoteAtomic, ErrInvalidKey},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.mr.RKey()
			if tc.name == "bad key" {
				key ^= 0x80
			}
			w, err := tab.Atomic64(key, pd, tc.va, tc.need)
			if err != tc.want {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if err != nil {
				if w != (Word{}) {
					t.Fatal("refused Atomic64 returned a usable word")
				}
				return
			}
			// The word must be the bytes at va's offset in the buffer.
			off := tc.va - tc.mr.IOVA()
			w.Store(0x0102030405060708)
			if got := binary.NativeEndian.Uint64(tc.mr.Buffer()[off:]); got != 0x0102030405060708 {
				t.Errorf("Store wrote %#x at offset %d", got, off)
			}
		})
	}
}

func TestWordOps(t *testing.T) {
	tab := NewTable()
	pd := tab.AllocPD()
	buf := make([]byte, 16)
	m := mustRegister(t, pd, buf, rwAll)
	w, err := tab.Atomic64(m.RKey(), pd, m.IOVA()+8, RemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	word := func() uint64 { return binary.NativeEndian.Uint64(buf[8:]) }

	w.Store(10)
	if orig := w.CompareSwap(11, 99); orig != 10 || word() != 10 {
		t.Errorf("failing CompareSwap: orig %d word %d, want 10 10", orig, word())
	}
	if orig := w.CompareSwap(10, 99); orig != 10 || word() != 99 {
		t.Errorf("CompareSwap: orig %d word %d, want 10 99", orig, word())
	}
	if orig := w.FetchAdd(1); orig != 99 || word() != 100 {
		t.Errorf("FetchAdd: orig %d word %d, want 99 100", orig, word())
	}
	w.Store(math.MaxUint64)
	if orig := w.FetchAdd(2); orig != math.MaxUint64 || w.Load() != 1 {
		t.Errorf("wrapping FetchAdd: orig %#x word %d, want 2^64-1 1", orig, w.Load())
	}
	if binary.NativeEndian.Uint64(buf[:8]) != 0 {
		t.Errorf("neighbouring word changed: %x", buf[:8])
	}
}

// N goroutines x M operations must give the exact total, for FetchAdd and
// for increments built on CompareSwap.
func TestWordConcurrency(t *testing.T) {
	const goroutines, ops = 8, 5000
	tab := NewTable()
	pd := tab.AllocPD()
	buf := make([]byte, 16)
	m := mustRegister(t, pd, buf, rwAll)
	add, err := tab.Atomic64(m.RKey(), pd, m.IOVA(), RemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	cas, err := tab.Atomic64(m.RKey(), pd, m.IOVA()+8, RemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	errs := make(chan string, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range ops {
				add.FetchAdd(uint64(g*ops + i))
				// Retry a lost CompareSwap with the value it returned;
				// bounded so a broken CompareSwap cannot hang the test.
				v := cas.Load()
				for try := 0; ; try++ {
					if try == 1_000_000 {
						errs <- "CompareSwap increment never succeeded"
						return
					}
					orig := cas.CompareSwap(v, v+1)
					if orig == v {
						break
					}
					v = orig
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	const n = goroutines * ops
	if got, want := add.Load(), uint64(n*(n-1)/2); got != want {
		t.Errorf("FetchAdd total %d, want %d", got, want)
	}
	if got := cas.Load(); got != n {
		t.Errorf("CompareSwap increments %d, want %d", got, n)
	}
}
