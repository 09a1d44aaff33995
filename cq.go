package rxego

import (
	"context"
	"sync"

	"github.com/rxego/rxego/internal/sched"
	"github.com/rxego/rxego/qp"
)

// CQ is a completion queue (ibv_cq): the QPs of every shard may complete
// work on it. It shows verbs only; how its waits are served (busy
// polling, reading the socket on the waiting goroutine) is the device's.
type CQ struct {
	cq   *qp.CQ
	once sync.Once // attaches the CQ to its first QP's shard
}

// CreateCQ makes a completion queue of the given depth.
func (d *Device) CreateCQ(depth int) (*CQ, error) {
	c, err := qp.NewCQ(depth)
	if err != nil {
		return nil, err
	}
	return &CQ{cq: c}, nil
}

// attach gives the CQ its device's scheduling, with shard s, the shard of
// the first QP created with it, as its home: a goroutine waiting on the
// CQ reads that shard's socket itself.
func (c *CQ) attach(d *Device, s int) {
	c.once.Do(func() {
		home := 0
		if len(d.rcvs) > 1 {
			home = s
		}
		sched.Attach(c.cq, d.rcvs, home)
	})
}

// Poll moves up to len(wcs) completions into wcs and returns how many
// (ibv_poll_cq).
func (c *CQ) Poll(wcs []WC) int { return c.cq.Poll(wcs) }

// PollWait polls, waiting first when nothing is there: the blocking
// equivalent of a completion-channel loop. It returns ctx's error when ctx
// ends first, or an error once the CQ is closed.
func (c *CQ) PollWait(ctx context.Context, wcs []WC) (int, error) { return c.cq.PollWait(ctx, wcs) }

// Wait blocks until at least one completion is waiting, ctx is done, or
// the CQ is closed.
func (c *CQ) Wait(ctx context.Context) error { return c.cq.Wait(ctx) }

// Len returns how many completions are waiting.
func (c *CQ) Len() int { return c.cq.Len() }

// Depth returns the CQ's capacity.
func (c *CQ) Depth() int { return c.cq.Depth() }

// Err returns qp.ErrCQOverrun once the CQ has overrun.
func (c *CQ) Err() error { return c.cq.Err() }

// Close wakes the CQ's waiters; later waits fail.
func (c *CQ) Close() { c.cq.Close() }
