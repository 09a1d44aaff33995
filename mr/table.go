package mr

import (
	crand "crypto/rand"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// The index space (24 bits) is a two-level array so that lookups are two
// atomic loads with no lock and registration never copies the table.
const (
	chunkBits = 12
	chunkSize = 1 << chunkBits
	dirSize   = 1 << (24 - chunkBits)
	maxIndex  = 1<<24 - 1
)

// chunk holds the snapshots of chunkSize consecutive indices.
type chunk [chunkSize]atomic.Pointer[entry]

// Table holds the PDs and MRs of one device and answers the engine's
// lookups. Create it with NewTable.
type Table struct {
	dir [dirSize]atomic.Pointer[chunk]

	pds atomic.Int64 // allocated PDs
	mrs atomic.Int64 // registered MRs

	mu      sync.Mutex // serialises every change below and all publishing
	rng     *rand.Rand
	next    uint32   // lowest never-used index
	limit   uint32   // highest usable index (lowered by tests)
	free    []uint32 // freed indices, oldest first
	lastKey []uint8  // last key byte used at each index below next
}

// NewTable returns an empty table. Its key bytes come from a ChaCha8
// generator seeded from crypto/rand.
func NewTable() *Table {
	var seed [32]byte
	crand.Read(seed[:]) // never fails since Go 1.24
	return &Table{
		rng:     rand.New(rand.NewChaCha8(seed)),
		next:    1, // index 0 is reserved so key 0 is never valid
		limit:   maxIndex,
		lastKey: make([]uint8, 1),
	}
}

// Stats is a snapshot of a table's object counts, for metrics.
type Stats struct {
	PDs int // allocated protection domains
	MRs int // registered memory regions (valid or invalidated)
}

// Stats returns the current counts. It is cheap (two atomic loads).
func (t *Table) Stats() Stats {
	return Stats{PDs: int(t.pds.Load()), MRs: int(t.mrs.Load())}
}

// PD is a protection domain: an MR is usable only by QPs of its own PD.
type PD struct {
	t *Table
	// Guarded by t.mu.
	nMR  int
	dead bool
}

// AllocPD creates a protection domain in t.
func (t *Table) AllocPD() *PD {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pds.Add(1)
	return &PD{t: t}
}

// Dealloc frees the PD. It fails with ErrBusy while MRs are registered in
// it, and with ErrInvalidArgument if it was already deallocated.
func (pd *PD) Dealloc() error {
	if pd == nil {
		return fmt.Errorf("%w: nil PD", ErrInvalidArgument)
	}
	t := pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case pd.dead:
		return fmt.Errorf("%w: PD already deallocated", ErrInvalidArgument)
	case pd.nMR > 0:
		return fmt.Errorf("%w: PD has %d registered MRs", ErrBusy, pd.nMR)
	}
	pd.dead = true
	t.pds.Add(-1)
	return nil
}

// slot returns the snapshot pointer for index i, or nil if its chunk was
// never allocated. i must be below 2^24.
func (t *Table) slot(i uint32) *atomic.Pointer[entry] {
	c := t.dir[(i>>chunkBits)&(dirSize-1)].Load()
	if c == nil {
		return nil
	}
	return &c[i&(chunkSize-1)]
}

// allocIndex picks an index and a fresh key byte for it. Caller holds t.mu.
func (t *Table) allocIndex() (idx uint32, keyByte uint8, err error) {
	if len(t.free) > 0 {
		idx = t.free[0]
		t.free = t.free[1:]
		// Any byte but the last one used here: last+1+[0,255) mod 256.
		return idx, t.lastKey[idx] + 1 + uint8(t.rng.IntN(255)), nil
	}
	if t.next > t.limit {
		return 0, 0, ErrTableFull
	}
	idx = t.next
	t.next++
	if t.dir[idx>>chunkBits].Load() == nil {
		t.dir[idx>>chunkBits].Store(new(chunk))
	}
	t.lastKey = append(t.lastKey, 0)
	return idx, uint8(t.rng.Uint32()), nil
}

// freeIndex retires idx, remembering the key byte last used there.
// Caller holds t.mu.
func (t *Table) freeIndex(idx uint32, keyByte uint8) {
	t.lastKey[idx] = keyByte
	t.free = append(t.free, idx)
}
