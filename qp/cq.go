package qp

import (
	"context"
	"errors"
	"sync"
)

// ErrCQOverrun is reported (once, through CQ.Err) when completions arrive
// faster than the application polls and the queue is full; like a verbs
// CQ overrun it is fatal to the CQ's QPs.
var ErrCQOverrun = errors.New("qp: completion queue overrun")

// CQ is a completion queue. The engine pushes completions; the application
// polls them, or waits until some are there.
type CQ struct {
	mu      sync.Mutex
	ring    []WC
	head    int // next to poll
	n       int // entries present
	overrun bool
	notify  chan struct{} // closed-and-replaced broadcast when entries arrive
	closed  bool
}

// NewCQ makes a CQ that holds up to depth completions.
func NewCQ(depth int) (*CQ, error) {
	if depth <= 0 || depth > 1<<22 {
		return nil, errors.New("qp: CQ depth must be 1..4194304")
	}
	return &CQ{ring: make([]WC, depth), notify: make(chan struct{})}, nil
}

// Depth returns the CQ's capacity.
func (c *CQ) Depth() int { return len(c.ring) }

// push adds a completion; it reports false on overrun.
func (c *CQ) push(wc WC) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == len(c.ring) {
		c.overrun = true
		return false
	}
	c.ring[(c.head+c.n)%len(c.ring)] = wc
	c.n++
	if c.n == 1 {
		close(c.notify)
		c.notify = make(chan struct{})
	}
	return true
}

// Poll moves up to len(wcs) completions into wcs and returns how many.
func (c *CQ) Poll(wcs []WC) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := 0
	for k < len(wcs) && c.n > 0 {
		wcs[k] = c.ring[c.head]
		c.head = (c.head + 1) % len(c.ring)
		c.n--
		k++
	}
	return k
}

// Len returns how many completions are waiting.
func (c *CQ) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// Err returns ErrCQOverrun once the CQ has overrun.
func (c *CQ) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.overrun {
		return ErrCQOverrun
	}
	return nil
}

// Wait blocks until at least one completion is waiting, ctx is done, or
// the CQ is closed.
func (c *CQ) Wait(ctx context.Context) error {
	for {
		c.mu.Lock()
		if c.n > 0 {
			c.mu.Unlock()
			return nil
		}
		if c.closed {
			c.mu.Unlock()
			return errors.New("qp: CQ closed")
		}
		ch := c.notify
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// PollWait polls, waiting first when nothing is there: the blocking
// equivalent of a completion-channel loop.
func (c *CQ) PollWait(ctx context.Context, wcs []WC) (int, error) {
	for {
		if n := c.Poll(wcs); n > 0 {
			return n, nil
		}
		if err := c.Wait(ctx); err != nil {
			return 0, err
		}
	}
}

// Close wakes waiters; later Waits fail.
func (c *CQ) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		close(c.notify)
		c.notify = make(chan struct{})
	}
}
