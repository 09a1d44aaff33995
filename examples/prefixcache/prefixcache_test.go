package prefixcache

import (
	"context"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/app/job"
)

// TestPull has three readers pull a 1 MiB prefix twice each, by READ
// from an idle owner and from a TCP server, in-process, every reader
// checking its copy byte for byte.
func TestPull(t *testing.T) {
	for _, tcp := range []bool{false, true} {
		c := Config{Bytes: 1<<20 + 24, Readers: 3, Rounds: 2, Chunk: 64 << 10, Depth: 4, TCP: tcp, Verify: true}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		r, err := Run(ctx, c, job.Goroutines(Rank(c)))
		cancel()
		if err != nil {
			t.Fatalf("tcp=%v: %v", tcp, err)
		}
		if !r.Verified || r.Served != 3*2*c.Bytes || r.Wall <= 0 {
			t.Errorf("tcp=%v: %+v", tcp, r)
		}
	}
}

// TestBadConfig: a configuration out of range is refused.
func TestBadConfig(t *testing.T) {
	for _, c := range []Config{{Bytes: 0, Readers: 1, Rounds: 1, Chunk: 1, Depth: 1}, {Bytes: 10, Readers: 1, Rounds: 1, Chunk: 1, Depth: 17}} {
		if _, err := Run(context.Background(), c, job.Goroutines(Rank(c))); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
