package mr

import (
	"sync/atomic"
	"unsafe"
)

// Word is the 64-bit target of an atomic operation, as returned by
// Atomic64. Its operations use sync/atomic on the word in host byte order
// (the engine converts from and to the big-endian wire values), so they
// are atomic against each other and against the application's own
// sync/atomic use of the same word. The zero Word is not usable.
type Word struct {
	p *uint64
}

// Atomic64 checks a peer's atomic access to the 8 bytes at va of the MR
// named by rkey, for a request on a QP of pd, and returns the word. need
// is RemoteAtomic for CmpSwap and FetchAdd, RemoteWrite for ATOMIC WRITE
// (as rxe checks it). Beyond the checks of Remote, va and the memory
// behind it must be 8-byte aligned (ErrMisaligned); the memory can be
// misaligned when the MR's buffer starts at an odd address. Atomic64 does
// not allocate. Like Remote, it serves no type 2 window; see Atomic64QP.
func (t *Table) Atomic64(rkey uint32, pd *PD, va uint64, need Access) (Word, error) {
	return t.Atomic64QP(rkey, pd, 0, va, need)
}

// Atomic64QP is Atomic64 for a request arriving on QP qp (see RemoteQP).
func (t *Table) Atomic64QP(rkey uint32, pd *PD, qp QPID, va uint64, need Access) (Word, error) {
	if need != RemoteAtomic && need != RemoteWrite {
		return Word{}, ErrInvalidArgument
	}
	b, err := t.lookup(rkey, pd, qp, va, 8, need)
	if err != nil {
		return Word{}, err
	}
	p := unsafe.Pointer(&b[0])
	if va%8 != 0 || uintptr(p)%8 != 0 {
		return Word{}, ErrMisaligned
	}
	return Word{p: (*uint64)(p)}, nil
}

// CompareSwap stores swap if the word equals compare, and returns the
// original value either way (IBA CmpSwap).
func (w Word) CompareSwap(compare, swap uint64) (orig uint64) {
	// sync/atomic has no compare-and-swap that returns the old value.
	// A retry happens only when another writer changed the word between
	// the load and the swap, so every iteration is someone's progress.
	for {
		old := atomic.LoadUint64(w.p)
		if old != compare || atomic.CompareAndSwapUint64(w.p, old, swap) {
			return old
		}
	}
}

// FetchAdd adds add (wrapping) and returns the original value (IBA
// FetchAdd).
func (w Word) FetchAdd(add uint64) (orig uint64) {
	return atomic.AddUint64(w.p, add) - add
}

// Store writes v atomically (IBA ATOMIC WRITE).
func (w Word) Store(v uint64) { atomic.StoreUint64(w.p, v) }

// Load reads the word atomically.
func (w Word) Load() uint64 { return atomic.LoadUint64(w.p) }
