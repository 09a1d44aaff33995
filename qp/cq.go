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
	waiters int           // goroutines in Wait
	bell    chan struct{} // a token when entries arrive while someone waits
	done    chan struct{} // closed by Close
	closed  bool
}

// NewCQ makes a CQ that holds up to depth completions.
func NewCQ(depth int) (*CQ, error) {
	if depth <= 0 || depth > 1<<22 {
		return nil, errors.New("qp: CQ depth must be 1..4194304")
	}
	return &CQ{ring: make([]WC, depth), bell: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

// ring wakes one waiter, without blocking and without allocating: the
// bell holds at most one token. c.mu is held.
func (c *CQ) ringBell() {
	if c.waiters > 0 {
		select {
		case c.bell <- struct{}{}:
		default:
		}
	}
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
		c.ringBell()
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
	c.mu.Lock()
	c.waiters++
	defer func() {
		c.waiters--
		if c.n > 0 {
			c.ringBell() // the token this waiter took may have been another's too
		}
		c.mu.Unlock()
	}()
	for {
		if c.n > 0 {
			return nil
		}
		if c.closed {
			return errors.New("qp: CQ closed")
		}
		c.mu.Unlock()
		var err error
		select {
		case <-c.bell:
		case <-c.done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		c.mu.Lock()
		if err != nil && c.n == 0 {
			return err
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
		close(c.done)
	}
}
