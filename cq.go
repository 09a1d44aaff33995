package rxego

import (
	"context"
	"sync"

	"github.com/rxego/rxego/qp"
)

// CQ is a completion queue (ibv_cq): the QPs of every shard may complete
// work on it. It shows verbs only; how its waits are served (busy
// polling, reading the socket on the waiting goroutine) is the device's.
type CQ struct {
	cq   *qp.CQ
	once sync.Once       // attaches the CQ to its first QP's shard
	use  func(shard int) // marks a shard as holding one of the CQ's QPs (device.Attach)
}

// CreateCQ makes a completion queue of the given depth. Close it (after
// destroying the QPs that use it) when done; Device.Close closes it too.
func (d *Device) CreateCQ(depth int) (*CQ, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	c, err := qp.NewCQ(depth)
	if err != nil {
		return nil, apiErr(err)
	}
	d.cqMu.Lock()
	defer d.cqMu.Unlock()
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if len(d.cqs) >= 2*d.cqsLive+16 {
		// Forget the CQs the application closed; amortised over the
		// CreateCQ calls since the last time, this costs O(1) each.
		live := d.cqs[:0]
		for _, c := range d.cqs {
			if !c.Closed() {
				live = append(live, c)
			}
		}
		clear(d.cqs[len(live):])
		d.cqs, d.cqsLive = live, len(live)
	}
	d.cqs = append(d.cqs, c)
	return &CQ{cq: c}, nil
}

// attach gives the CQ its device's scheduling, with shard s, the shard of
// the first QP created with it, as its home: a goroutine waiting on the
// CQ reads that shard's socket itself; a busy poller polls the sockets
// of the shards its QPs live on.
func (c *CQ) attach(d *Device, s int) {
	c.once.Do(func() { c.use = d.dev.AttachCQ(c.cq, s) })
	c.use(s)
}

// Poll moves up to len(wcs) completions into wcs and returns how many
// (ibv_poll_cq). It never waits. On a CQ that has overrun it returns the
// completions it still holds, then 0 and an error wrapping ErrCQOverrun
// (verbs raises IBV_EVENT_CQ_ERR); on a closed, empty CQ, 0 and
// ErrClosed. An empty, healthy CQ gives 0 and nil.
func (c *CQ) Poll(wcs []WC) (int, error) {
	if n := c.cq.Poll(wcs); n > 0 || !c.cq.Down() {
		return n, nil
	}
	if err := c.cq.Err(); err != nil {
		return 0, apiErr(err)
	}
	if c.cq.Closed() {
		return 0, ErrClosed
	}
	return 0, nil
}

// PollWait polls, waiting first when nothing is there: the blocking
// equivalent of a completion-channel loop. It returns ctx's error when ctx
// ends first, ErrClosed once the CQ is closed and empty, and an error
// wrapping ErrCQOverrun once the CQ has overrun and is empty (see
// ErrCQOverrun). With nil or empty wcs it returns 0 at once, as
// ibv_poll_cq asked for 0 entries does.
func (c *CQ) PollWait(ctx context.Context, wcs []WC) (int, error) {
	n, err := c.cq.PollWait(ctx, wcs)
	return n, apiErr(err)
}

// Wait blocks until at least one completion is waiting, ctx is done, or
// the CQ is closed (ErrClosed) or has overrun (ErrCQOverrun) and is empty.
func (c *CQ) Wait(ctx context.Context) error { return apiErr(c.cq.Wait(ctx)) }

// Len returns how many completions are waiting.
func (c *CQ) Len() int { return c.cq.Len() }

// Depth returns the CQ's capacity.
func (c *CQ) Depth() int { return c.cq.Depth() }

// Err returns an error wrapping ErrCQOverrun once the CQ has overrun.
func (c *CQ) Err() error { return apiErr(c.cq.Err()) }

// Close closes the CQ (ibv_destroy_cq): goroutines waiting in PollWait,
// Wait or on Notify's channel wake up; completions still queued can be
// polled, and then waits fail with ErrClosed. While a QP that is not
// destroyed uses the CQ, Close fails with ErrBusy and changes nothing. A
// second Close returns ErrClosed.
func (c *CQ) Close() error { return apiErr(c.cq.Close()) }

// Closed reports whether the CQ has been closed.
func (c *CQ) Closed() bool { return c.cq.Closed() }

// Notify returns a channel that receives a value when completions arrive,
// for a select beside other channels: the Go form of a completion channel
// (ibv_req_notify_cq, then ibv_get_cq_event). Call it again before each
// wait; after a wake-up, Poll until it returns 0. The channel is closed
// when the CQ is. An overrun signals it too: when Poll then finds
// nothing, Err says why.
func (c *CQ) Notify() <-chan struct{} { return c.cq.Notify() }
