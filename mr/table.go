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

	mu    sync.Mutex // serialises every change below and all publishing
	rng   *rand.Rand
	limit uint32 // highest usable index (lowered by tests)
	live  int    // indices holding a registered MR or a window
	// chunks are the chunks new keys are drawn from, in the order they
	// were added; byPos has every chunk in the index space, also retired
	// ones that still hold live keys (see "Index allocation" below).
	chunks []*chunkState
	byPos  map[uint32]*chunkState
	// order is a secret cyclic order of the chunk positions, and next the
	// place in it where addChunk looks first.
	order []uint32
	next  int
	perm  [256]uint8 // turns a count of registrations into a key byte
	// qpWindows has the type 2 windows bound to each QP (ReleaseQP).
	qpWindows map[QPID]map[*MW]struct{}
}

// NewTable returns an empty table. Its indices, key sequence and key bytes
// come from a ChaCha8 generator seeded from crypto/rand.
func NewTable() *Table {
	var seed [32]byte
	crand.Read(seed[:]) // never fails since Go 1.24
	t := &Table{
		rng:       rand.New(rand.NewChaCha8(seed)),
		limit:     maxIndex,
		byPos:     make(map[uint32]*chunkState),
		qpWindows: make(map[QPID]map[*MW]struct{}),
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
// chunk whenever more than 1/maxFill of its indices would be live, so a
// draw lands on a free index in a few tries and a guessed index is live
// with probability at most 1/maxFill (1/4096 for one MR). The key byte at
// an index walks a secret permutation of the 256 bytes from a random
// start, so it comes back at that index only after 256 registrations
// there; an index stops being drawn before that (it is spent). Once half
// of a chunk's indices are spent the chunk is retired: no key is drawn
// from it any more, and it leaves the index space when its last key is
// freed. New chunks take the positions in a secret cyclic order, so a
// position, and with it any key that was ever issued in it, comes back
// only after every other free position has served a chunk's life (at
// least chunkSize/2*spentAfter registrations each): about 2^31
// registrations with 4,095 positions, and then under a fresh random key
// byte. Only when no position is left do spent indices start over (the
// permutation walk goes on), which tests provoke by lowering the limit.
const (
	maxFill    = 4
	drawTries  = 64  // random draws before a linear search
	spentAfter = 255 // key bytes an index hands out in one chunk's life
)

// chunkState is the allocation state of one chunk. Guarded by Table.mu.
type chunkState struct {
	pos uint32
	// gen[i] is the place of index i in the key byte permutation, uses[i]
	// how many places it moved on in this chunk's life.
	gen     [chunkSize]uint8
	uses    [chunkSize]uint16
	live    int // live keys in the chunk
	spent   int // indices with uses[i] >= spentAfter
	retired bool
}

// allocIndex picks an index and a fresh key byte for it. Caller holds t.mu.
func (t *Table) allocIndex() (idx uint32, keyByte uint8, err error) {
	if (t.live+1)*maxFill > len(t.chunks)*chunkSize {
		t.addChunk() // may find no room; the chunks in use may still have some
	}
	idx, ok := t.drawIndex()
	if !ok && t.addChunk() {
		idx, ok = t.drawIndex()
	}
	if !ok && t.renewSpent() {
		idx, ok = t.drawIndex()
	}
	if !ok {
		return 0, 0, ErrTableFull
	}
	c := t.byPos[idx>>chunkBits]
	i := idx & (chunkSize - 1)
	t.advance(c, i)
	c.live++
	t.live++
	return idx, t.perm[c.gen[i]], nil
}

// advance moves index i of c to the next key byte and retires c once half
// of its indices are spent. Caller holds t.mu.
func (t *Table) advance(c *chunkState, i uint32) {
	c.gen[i]++
	if c.uses[i]++; c.uses[i] != spentAfter {
		return
	}
	if c.spent++; c.spent*2 >= chunkSize && !c.retired {
		c.retired = true
		for k, a := range t.chunks {
			if a == c {
				t.chunks = append(t.chunks[:k], t.chunks[k+1:]...)
				break
			}
		}
	}
}

// usable reports whether idx may hold an MR: index 0 never does (key 0,
// what a zero-length transfer's RETH carries, must match nothing).
func (t *Table) usable(idx uint32) bool { return idx != 0 && idx <= t.limit }

// drawIndex returns a free, unspent index from the chunks in use: a few
// random draws, then a search from a random chunk. Caller holds t.mu.
func (t *Table) drawIndex() (uint32, bool) {
	if len(t.chunks) == 0 {
		return 0, false
	}
	free := func(c *chunkState, i uint32) bool {
		idx := c.pos<<chunkBits | i
		return t.usable(idx) && c.uses[i] < spentAfter && t.slot(idx).Load() == nil
	}
	for range drawTries {
		c, i := t.chunks[t.rng.IntN(len(t.chunks))], uint32(t.rng.IntN(chunkSize))
		if free(c, i) {
			return c.pos<<chunkBits | i, true
		}
	}
	start := t.rng.IntN(len(t.chunks))
	for k := range t.chunks {
		c := t.chunks[(start+k)%len(t.chunks)]
		for i := range uint32(chunkSize) {
			if free(c, i) {
				return c.pos<<chunkBits | i, true
			}
		}
	}
	return 0, false
}

// addChunk brings a free chunk position, the next in the table's secret
// cyclic order, into use; false when there is none below the limit.
// Caller holds t.mu.
func (t *Table) addChunk() bool {
	n := int(t.limit>>chunkBits + 1) // chunk positions holding usable indices
	if len(t.order) != n {
		t.order = make([]uint32, n)
		for i := range t.order {
			t.order[i] = uint32(i)
		}
		t.rng.Shuffle(n, func(i, j int) { t.order[i], t.order[j] = t.order[j], t.order[i] })
		t.next = 0
	}
	for range n {
		pos := t.order[t.next]
		t.next = (t.next + 1) % n
		if t.byPos[pos] != nil {
			continue
		}
		c := &chunkState{pos: pos}
		for i := range c.gen {
			c.gen[i] = uint8(t.rng.Uint32())
		}
		t.byPos[pos] = c
		t.dir[pos].Store(new(chunk))
		t.chunks = append(t.chunks, c)
		return true
	}
	return false
}

// renewSpent starts a new life for the spent indices of every chunk, when
// no chunk position is left: their key bytes walk on through the
// permutation. It reports whether any index was renewed. Caller holds t.mu.
func (t *Table) renewSpent() bool {
	renewed := false
	for _, c := range t.byPos {
		if c.spent == 0 {
			continue
		}
		renewed = true
		c.uses, c.spent = [chunkSize]uint16{}, 0
		if c.retired {
			c.retired = false
			t.chunks = append(t.chunks, c)
		}
	}
	return renewed
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
// never names the next one at its index. A retired chunk whose last key
// this was leaves the index space. Caller holds t.mu.
func (t *Table) freeIndex(idx uint32, last uint8) {
	t.live--
	c := t.byPos[idx>>chunkBits]
	i := idx & (chunkSize - 1)
	if t.perm[c.gen[i]+1] == last {
		t.advance(c, i)
	}
	if c.live--; c.live == 0 && c.retired {
		delete(t.byPos, c.pos)
		t.dir[c.pos].Store(nil)
	}
}
