package qp

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"
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
	poller  func()        // see SetPoller
	spin    time.Duration // see SetPoller
}

// SetPoller makes Poll, when it finds the CQ empty, call f (which takes in
// packets that may complete work, on the polling goroutine) and look
// again, and makes PollWait poll so for up to spin before it blocks. A
// device in busy-poll mode sets it on its CQs before they are used.
func (c *CQ) SetPoller(f func(), spin time.Duration) {
	c.poller, c.spin = f, spin
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
	ok, _ := c.pushWoke(wc)
	return ok
}

// pushWoke is push that also reports whether a goroutine was waiting.
func (c *CQ) pushWoke(wc WC) (ok, woke bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == len(c.ring) {
		c.overrun = true
		return false, false
	}
	c.ring[(c.head+c.n)%len(c.ring)] = wc
	c.n++
	if c.n == 1 && c.waiters > 0 {
		c.ringBell()
		woke = true
	}
	return true, woke
}

// Poll moves up to len(wcs) completions into wcs and returns how many.
// With a poller (SetPoller) an empty CQ runs it once and looks again.
func (c *CQ) Poll(wcs []WC) int {
	n := c.take(wcs)
	if n == 0 && c.poller != nil && len(wcs) > 0 {
		c.poller()
		n = c.take(wcs)
	}
	return n
}

// take moves up to len(wcs) completions into wcs.
func (c *CQ) take(wcs []WC) int {
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
	if c.poller != nil && c.spin > 0 {
		end := time.Now().Add(c.spin)
		for i := 1; ; i++ {
			if n := c.Poll(wcs); n > 0 {
				return n, nil
			}
			if i%64 == 0 && (ctx.Err() != nil || time.Now().After(end)) {
				break
			}
			runtime.Gosched()
		}
	}
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
