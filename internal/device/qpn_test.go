package device

import (
	"testing"

	"github.com/rxego/rxego/transport"
)

// TestQPNumbering checks the numbers CreateQP hands each shard, for shard
// counts that divide the block count and one that does not: every number
// from firstQPN on that lies in one of the shard's blocks, in order, none
// skipped and none of another shard's, wrapping past 0xffffff to the
// shard's first.
func TestQPNumbering(t *testing.T) {
	for _, n := range []int{1, 2, 3, 16} {
		d := &Device{shards: make([]*shard, n)}
		seen := make(map[uint32]bool)
		for s := range n {
			q := d.firstQPNOf(s)
			if q < firstQPN || d.ShardOf(q) != s {
				t.Fatalf("%d shards: shard %d starts at %d (shard %d)", n, s, q, d.ShardOf(q))
			}
			for range 5 * transport.QPNBlock {
				if seen[q] {
					t.Fatalf("%d shards: %d handed out twice", n, q)
				}
				seen[q] = true
				next := d.nextQPNOf(q, s)
				if d.ShardOf(next) != s || next <= q {
					t.Fatalf("%d shards: shard %d goes from %d to %d (shard %d)", n, s, q, next, d.ShardOf(next))
				}
				// Nothing of the shard's between q and next is skipped.
				for skipped := q + 1; skipped < next; skipped++ {
					if d.ShardOf(skipped) == s {
						t.Fatalf("%d shards: shard %d skips %d", n, s, skipped)
					}
				}
				q = next
			}
			last := uint32(0xffffff)
			for d.ShardOf(last) != s {
				last--
			}
			if got, want := d.nextQPNOf(last, s), d.firstQPNOf(s); got != want {
				t.Errorf("%d shards: after %#x shard %d goes to %d, want its first, %d", n, last, s, got, want)
			}
		}
		// Every number from firstQPN up to the highest handed out is some
		// shard's.
		hi := uint32(0)
		for q := range seen {
			hi = max(hi, q)
		}
		for q := uint32(firstQPN); q < hi && n <= 3; q++ {
			if !seen[q] && q < 5*transport.QPNBlock*uint32(n) {
				t.Errorf("%d shards: %d is no shard's", n, q)
			}
		}
	}
}
