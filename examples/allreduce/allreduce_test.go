package allreduce

import (
	"context"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/app/job"
)

// TestRing reduces over RDMA and over TCP, in-process, with counts that
// divide evenly, that leave a short last chunk and an empty one; every rank checks
// every element exactly against the locally computed sum, every
// iteration.
func TestRing(t *testing.T) {
	for _, tcp := range []bool{false, true} {
		for _, c := range []Config{{Count: 4096, Ranks: 4, Iters: 2}, {Count: 1001, Ranks: 3, Iters: 2}, {Count: 5, Ranks: 2, Iters: 1}, {Count: 5, Ranks: 4, Iters: 1}} {
			c.TCP = tcp
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			r, err := Run(ctx, c, job.Goroutines(Rank(c)))
			cancel()
			if err != nil {
				t.Fatalf("%+v: %v", c, err)
			}
			if r.Checked != c.Count*c.Ranks*c.Iters || len(r.Times) != c.Iters || r.AlgGbps() <= 0 {
				t.Errorf("%+v: %+v", c, r)
			}
		}
	}
}

// TestCheckCatches: the check fails when one element is off, so the
// ring tests above can fail.
func TestCheckCatches(t *testing.T) {
	g := newRing(Config{Count: 8, Ranks: 2, Iters: 1}, 0)
	for j := range g.data {
		g.data[j] = Input(0, j) + Input(1, j)
	}
	if err := g.check(); err != nil {
		t.Fatal(err)
	}
	g.data[5]++
	if err := g.check(); err == nil {
		t.Error("a wrong element passed the check")
	}
}

// TestBadConfig: a ring of one rank, or fewer elements than ranks, is
// refused.
func TestBadConfig(t *testing.T) {
	for _, c := range []Config{{Count: 8, Ranks: 1, Iters: 1}, {Count: 3, Ranks: 4, Iters: 1}, {Count: 8, Ranks: 2}} {
		if _, err := Run(context.Background(), c, job.Goroutines(Rank(c))); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
