package mr

import (
	"flag"
	"math/rand/v2"
	"slices"
	"testing"
)

var staleLong = flag.Bool("stale.long", false, "TestStaleKeyCollisions: run 20,000,000 registrations per case")

// TestStaleKeyCollisions measures how soon a stale rkey names a live MR
// again: MRs are deregistered and registered in a random churn with a
// fixed number live, and every new key is compared with all keys issued
// before. Keys come from chunks of indices that retire once half their
// indices have handed out 255 key bytes, and chunk positions come back
// only after all 4,096 have served (about 2^31 registrations), so no key
// may recur in 2,000,000 registrations (where the 4,096 x 256 keys of one
// chunk were 47.6% recurrences); under the race detector and -short the
// run is shorter. docs/reliability.md has the figures, from -stale.long.
func TestStaleKeyCollisions(t *testing.T) {
	n := 2_000_000
	if testing.Short() || raceEnabled {
		n = 200_000
	}
	if *staleLong {
		n = 20_000_000
	}
	for _, live := range []int{1, 1000} {
		tab := NewTable()
		pd := tab.AllocPD()
		rng := rand.New(rand.NewPCG(1, uint64(live)))
		issued := make([]uint32, 0, n+live)
		mrs := make([]*MR, live)
		reg := func() *MR {
			m := mustRegister(t, pd, nil, 0)
			issued = append(issued, m.LKey())
			return m
		}
		for i := range mrs {
			mrs[i] = reg()
		}
		maxChunks := 0
		for range n {
			j := rng.IntN(live)
			if err := mrs[j].Deregister(); err != nil {
				t.Fatal(err)
			}
			mrs[j] = reg()
			maxChunks = max(maxChunks, len(tab.byPos))
		}
		sorted := slices.Clone(issued)
		slices.Sort(sorted)
		collisions := 0
		for i := 1; i < len(sorted); i++ {
			if sorted[i] == sorted[i-1] {
				collisions++
			}
		}
		first := -1
		if collisions > 0 {
			seen := make(map[uint32]bool, len(issued))
			for i, k := range issued {
				if seen[k] {
					first = i
					break
				}
				seen[k] = true
			}
		}
		t.Logf("%d live MRs, %d re-registrations: %d stale keys came back (first at registration %d); at most %d chunks (%d indices) in the index space",
			live, n, collisions, first, maxChunks, maxChunks*chunkSize)
		if collisions != 0 {
			t.Errorf("%d live MRs: a stale key came back at registration %d of %d", live, first, n)
		}
		// The index space stays small: the chunks in use plus the retired
		// ones still holding a live MR.
		if maxChunks > 2+live/(chunkSize/maxFill)+live {
			t.Errorf("%d live MRs: %d chunks in the index space", live, maxChunks)
		}
	}
}

// TestChunkPositionsCycle: with the index space cut to 2 chunk positions,
// a position comes back only after the other has served a chunk's life (at
// least chunkSize/2*spentAfter registrations), and a key only with its
// position: the closest recurrence is at least a chunk's life apart. (With
// the full 4,096 positions that is 4,095 lives.) Skipped under the race
// detector: 3 million registrations.
func TestChunkPositionsCycle(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("3 million registrations")
	}
	const positionsUsable = 2
	tab := NewTable()
	tab.limit = positionsUsable*chunkSize - 1
	pd := tab.AllocPD()
	var positions []uint32
	seen := map[uint32]int{} // key -> registration that issued it
	minDistance := -1
	m := mustRegister(t, pd, nil, 0)
	life := chunkSize / 2 * spentAfter
	n := 6 * life
	for i := range n {
		k := m.LKey()
		if pos := k >> (8 + chunkBits); len(positions) == 0 || positions[len(positions)-1] != pos {
			positions = append(positions, pos)
		}
		if j, ok := seen[k]; ok && (minDistance < 0 || i-j < minDistance) {
			minDistance = i - j
		}
		seen[k] = i
		if err := m.Deregister(); err != nil {
			t.Fatal(err)
		}
		m = mustRegister(t, pd, nil, 0)
	}
	t.Logf("%d registrations, chunk positions %v, closest key recurrence %d registrations apart", n, positions, minDistance)
	if len(positions) <= positionsUsable {
		t.Fatalf("chunk positions %v in %d registrations: chunks do not retire", positions, n)
	}
	for i := positionsUsable; i < len(positions); i++ {
		if positions[i] != positions[i-positionsUsable] {
			t.Fatalf("chunk positions %v do not cycle", positions)
		}
	}
	if minDistance < (positionsUsable-1)*life {
		t.Errorf("a key came back %d registrations later, under %d chunk lives (%d)", minDistance, positionsUsable-1, (positionsUsable-1)*life)
	}
}
