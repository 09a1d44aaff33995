package mr

import (
	"flag"
	"math/rand/v2"
	"testing"
)

var staleLong = flag.Bool("stale.long", false, "TestStaleKeyCollisions: run 3,000,000 registrations per case, past the first recurrence")

// TestStaleKeyCollisions measures how soon a stale rkey names a live MR
// again: MRs are deregistered and registered in a random churn with a
// fixed number live, and every new key is looked up among all keys issued
// before. With random indices over at least maxFill times the live count
// and a 256-long key cycle per index, a key recurs only once its index has
// been drawn 256 more times (about 256 x 4095 registrations with one MR
// live), so none may recur in the default run. docs/reliability.md has the
// figures, from -stale.long.
func TestStaleKeyCollisions(t *testing.T) {
	n := 200_000
	if testing.Short() {
		n = 50_000
	}
	if *staleLong {
		n = 3_000_000
	}
	for _, live := range []int{1, 1000} {
		tab := NewTable()
		pd := tab.AllocPD()
		rng := rand.New(rand.NewPCG(1, uint64(live)))
		issued := make(map[uint32]struct{}, n+live)
		mrs := make([]*MR, live)
		collisions, first := 0, 0
		reg := func(i int) *MR {
			m := mustRegister(t, pd, nil, 0)
			if _, dup := issued[m.LKey()]; dup {
				collisions++
				if first == 0 {
					first = i
				}
			}
			issued[m.LKey()] = struct{}{}
			return m
		}
		for i := range mrs {
			mrs[i] = reg(0)
		}
		for i := 1; i <= n; i++ {
			j := rng.IntN(live)
			if err := mrs[j].Deregister(); err != nil {
				t.Fatal(err)
			}
			mrs[j] = reg(i)
		}
		t.Logf("%d live MRs, %d re-registrations: %d stale keys came back (first at registration %d); %d indices in use, %d distinct keys",
			live, n, collisions, first, len(tab.chunks)*chunkSize, len(issued))
		if !*staleLong && collisions != 0 {
			t.Errorf("%d live MRs: a stale key came back at registration %d of %d", live, first, n)
		}
	}
}
