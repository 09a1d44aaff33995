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

	mu     sync.Mutex // serialises every change below and all publishing
	rng    *rand.Rand
	limit  uint32   // highest usable index (lowered by tests)
	chunks []uint32 // chunk numbers in use, in the order they were added
	live   int      // indices holding a registered MR
	// gen[c][i] counts the registrations at index c<<chunkBits|i (from a
	// random start); perm turns the count into the key byte.
	gen  map[uint32]*[chunkSize]uint8
	perm [256]uint8
}

// NewTable returns an empty table. Its indices, key sequence and key bytes
// come from a ChaCha8 generator seeded from crypto/rand.
func NewTable() *Table {
	var seed [32]byte
	crand.Read(seed[:]) // never fails since Go 1.24
	t := &Table{
		rng:   rand.New(rand.NewChaCha8(seed)),
		limit: maxIndex,
		gen:   make(map[uint32]*[chunkSize]uint8),
	}
	for i := range t.perm {
		t.perm[i] = uint8(i)
	}
	t.rng.Shuffle(len(t.perm), func(i, j int) { t.perm[i], t.perm[j] = t.perm[j], t.perm[i] })
	return t
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
	nMW  int // allocated memory windows
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
		return fmt.Errorf("%w: PD already deallocated (%w)", ErrClosed, ErrInvalidArgument)
	case pd.nMR > 0:
		return fmt.Errorf("%w: PD has %d registered MRs", ErrBusy, pd.nMR)
	case pd.nMW > 0:
		return fmt.Errorf("%w: PD has %d memory windows", ErrBusy, pd.nMW)
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

// Index allocation (see "Keys" in the package comment). An MR gets a
// free index drawn at random from the chunks in use, and the table adds a
// chunk, at a random place in the index space, whenever more than
// 1/maxFill of its indices would be live, so a draw lands on a free index
// in a few tries and a guessed index is live with probability at most
// 1/maxFill (1/4096 for one MR). The key byte at an index walks a secret
// permutation of the 256 bytes from a random start: a key byte comes back
// at an index only after 256 registrations there, and a stale key only
// once its index has been drawn that often again.
const (
	maxFill   = 4
	drawTries = 64 // random draws before a linear search
)

// allocIndex picks an index and a fresh key byte for it. Caller holds t.mu.
func (t *Table) allocIndex() (idx uint32, keyByte uint8, err error) {
	if (t.live+1)*maxFill > len(t.chunks)*chunkSize {
		t.addChunk() // may find no room; the chunks in use may still have some
	}
	idx, ok := t.drawIndex()
	if !ok && t.addChunk() {
		idx, ok = t.drawIndex()
	}
	if !ok {
		return 0, 0, ErrTableFull
	}
	g := &t.gen[idx>>chunkBits][idx&(chunkSize-1)]
	*g++
	t.live++
	return idx, t.perm[*g], nil
}

// usable reports whether idx may hold an MR: index 0 never does (key 0,
// what a zero-length transfer's RETH carries, must match nothing).
func (t *Table) usable(idx uint32) bool { return idx != 0 && idx <= t.limit }

// drawIndex returns a free index from the chunks in use: a few random
// draws, then a search from a random chunk. Caller holds t.mu.
func (t *Table) drawIndex() (uint32, bool) {
	if len(t.chunks) == 0 {
		return 0, false
	}
	free := func(idx uint32) bool { return t.usable(idx) && t.slot(idx).Load() == nil }
	for range drawTries {
		idx := t.chunks[t.rng.IntN(len(t.chunks))]<<chunkBits | uint32(t.rng.IntN(chunkSize))
		if free(idx) {
			return idx, true
		}
	}
	start := t.rng.IntN(len(t.chunks))
	for k := range t.chunks {
		c := t.chunks[(start+k)%len(t.chunks)]
		for i := range uint32(chunkSize) {
			if idx := c<<chunkBits | i; free(idx) {
				return idx, true
			}
		}
	}
	return 0, false
}

// addChunk brings a chunk not yet in use, at a random place below the
// limit, into use; false when there is none. Caller holds t.mu.
func (t *Table) addChunk() bool {
	n := t.limit>>chunkBits + 1 // chunks holding usable indices
	if uint32(len(t.chunks)) >= n {
		return false
	}
	c := uint32(t.rng.IntN(int(n)))
	for t.dir[c].Load() != nil { // a free one exists: len(t.chunks) < n
		c = (c + 1) % n
	}
	t.dir[c].Store(new(chunk))
	g := new([chunkSize]uint8)
	for i := range g {
		g[i] = uint8(t.rng.Uint32())
	}
	t.gen[c] = g
	t.chunks = append(t.chunks, c)
	return true
}

// allocLocked picks the index and fresh key of a new MR or window of pd.
// Caller holds t.mu.
func (pd *PD) allocLocked() (idx, key uint32, err error) {
	if pd.dead {
		return 0, 0, fmt.Errorf("%w: PD deallocated", ErrInvalidArgument)
	}
	idx, keyByte, err := pd.t.allocIndex()
	if err != nil {
		return 0, 0, err
	}
	return idx, idx<<8 | uint32(keyByte), nil
}

// freeIndex retires idx, whose MR had key byte last. The next key byte
// there is the next in the permutation, skipped if it is last (possible
// after Revalidate chose a byte), so the key of the MR just deregistered
// never names the next one at its index. Caller holds t.mu.
func (t *Table) freeIndex(idx uint32, last uint8) {
	t.live--
	if g := &t.gen[idx>>chunkBits][idx&(chunkSize-1)]; t.perm[*g+1] == last {
		*g++
	}
}
