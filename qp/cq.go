package qp

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrCQOverrun is what PollWait and Wait return (wrapped, with the QPs
// it hit), and CQ.Err, once a completion arrived while the CQ was full:
// verbs raises IBV_EVENT_CQ_ERR. The completion is lost and the QP that
// generated it moves to ERR (as rxe's responder does on a receive
// completion it cannot post; rxe's completer drops a send completion and
// goes on, rxego fails that QP too), so its outstanding work completes
// with WR_FLUSH_ERR where there is room; other QPs on the CQ go on. The
// completions already queued can still be polled; then PollWait fails.
var ErrCQOverrun = errors.New("qp: completion queue overrun")

// ErrBusy is returned (wrapped) by CQ.Close while a QP still uses the
// CQ, as ibv_destroy_cq fails with EBUSY: destroy the QP first; and by
// QP.Destroy while the QP is attached to a multicast group, as
// ibv_destroy_qp does.
var ErrBusy = errors.New("qp: busy")

// CQ is a completion queue. The engine pushes completions; the application
// polls them, or waits until some are there.
type CQ struct {
	mu      sync.Mutex
	ring    []WC
	head    int // next to poll
	n       int // entries present
	overrun bool
	lost    int           // completions lost to the overrun
	hit     []uint32      // the QPs whose completions were lost (at most maxOverrunQPs)
	waiters int           // goroutines in Wait
	bell    chan struct{} // a token when entries arrive while someone waits
	done    chan struct{} // closed by Close
	closed  bool
	users   int           // QPs that complete work here (Engine.Create, QP.Destroy)
	notify  chan struct{} // see Notify; nil until first asked for
	poller  func()        // see SetPoller
	spin    time.Duration // see SetPoller
	waiter  Waiter        // see SetWaiter
	watched bool          // a goroutine in waiter.WaitCQ asked to be woken (Watch)
	down    atomic.Bool   // overrun or closed (Down), set under mu
}

// Waiter waits for a CQ's completions in PollWait in place of the CQ's
// own Wait: a device whose application goroutines read the socket
// themselves while they wait (so that the packet's wake-up reaches the
// goroutine that wants it, with no hand-off) gives one to its CQs.
type Waiter interface {
	// WaitCQ waits until c may hold completions, ctx is done (it returns
	// ctx's error) or c may have closed; it may return nil early.
	WaitCQ(ctx context.Context, c *CQ) error
	// Wake is called when a completion arrives in, or Close closes, a CQ
	// that a goroutine in WaitCQ watches (see Watch). It is called with
	// the CQ's lock held and must not block.
	Wake()
}

// SetWaiter makes PollWait wait through w rather than Wait. It may be set
// while the CQ is in use (a device attaches a CQ to the shard of its first
// QP); a PollWait already waiting goes on as it began.
func (c *CQ) SetWaiter(w Waiter) {
	c.mu.Lock()
	c.waiter = w
	c.mu.Unlock()
}

// Watch reports whether the CQ is empty and open and, if it is, makes
// the next completion or Close call the Waiter's Wake until Unwatch: a
// goroutine that then blocks without seeing the CQ's bell is still woken.
func (c *CQ) Watch() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n > 0 || c.closed {
		return false
	}
	c.watched = true
	return true
}

// Unwatch ends Watch.
func (c *CQ) Unwatch() {
	c.mu.Lock()
	c.watched = false
	c.mu.Unlock()
}

// SetPoller makes Poll, when it finds the CQ empty, call f (which takes in
// packets that may complete work, on the polling goroutine) and look
// again, and makes PollWait poll so for up to spin before it blocks. A
// device in busy-poll mode sets it on its CQs before they are used.
func (c *CQ) SetPoller(f func(), spin time.Duration) {
	c.mu.Lock()
	c.poller, c.spin = f, spin
	c.mu.Unlock()
}

// hooks returns the poller, its spin and the waiter.
func (c *CQ) hooks() (func(), time.Duration, Waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.poller, c.spin, c.waiter
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
		first := !c.overrun
		c.overrun = true
		c.down.Store(true)
		c.lost++
		if !slices.Contains(c.hit, wc.QPN) && len(c.hit) < maxOverrunQPs {
			c.hit = append(c.hit, wc.QPN)
		}
		if first {
			// Like IBV_EVENT_CQ_ERR: every waiter learns of it now, not
			// when the next completion comes (none may).
			c.ringBell()
			if c.watched {
				c.waiter.Wake()
			}
			c.signal()
		}
		return false, false
	}
	c.ring[(c.head+c.n)%len(c.ring)] = wc
	c.n++
	if c.n == 1 && c.waiters > 0 {
		c.ringBell()
		woke = true
	}
	if c.n == 1 && c.watched {
		c.waiter.Wake()
	}
	if c.n == 1 {
		c.signal()
	}
	return true, woke
}

// Poll moves up to len(wcs) completions into wcs and returns how many.
// With a poller (SetPoller) an empty CQ runs it once and looks again.
func (c *CQ) Poll(wcs []WC) int {
	n, poller := c.take(wcs)
	if n == 0 && poller != nil && len(wcs) > 0 {
		poller()
		n, _ = c.take(wcs)
	}
	return n
}

// take moves up to len(wcs) completions into wcs; it also returns the
// poller, read under the same lock.
func (c *CQ) take(wcs []WC) (int, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := 0
	for k < len(wcs) && c.n > 0 {
		wcs[k] = c.ring[c.head]
		c.head = (c.head + 1) % len(c.ring)
		c.n--
		k++
	}
	return k, c.poller
}

// Len returns how many completions are waiting.
func (c *CQ) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// maxOverrunQPs bounds the QPs an overrun error names.
const maxOverrunQPs = 8

// Err returns an error wrapping ErrCQOverrun once the CQ has overrun.
func (c *CQ) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errLocked()
}

// errLocked is Err; c.mu is held.
func (c *CQ) errLocked() error {
	if !c.overrun {
		return nil
	}
	qps := make([]string, len(c.hit))
	for i, n := range c.hit {
		qps[i] = fmt.Sprintf("%d (%#06x)", n, n)
	}
	return fmt.Errorf("%w: %d completion(s) arrived while all %d entries were full and were lost; QP %s moved to ERR",
		ErrCQOverrun, c.lost, len(c.ring), strings.Join(qps, ", "))
}

// Wait blocks until at least one completion is waiting, ctx is done, or
// the CQ is closed (ErrClosed) or has overrun (ErrCQOverrun) and is
// empty.
func (c *CQ) Wait(ctx context.Context) error { return c.WaitOr(ctx, nil) }

// WaitOr is Wait that also returns nil, CQ empty or not, when it receives
// from wake: a device uses it to hand its socket to a goroutine waiting
// for completions (see Waiter).
func (c *CQ) WaitOr(ctx context.Context, wake <-chan struct{}) error {
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
			return ErrClosed
		}
		if c.overrun {
			return c.errLocked()
		}
		c.mu.Unlock()
		var err error
		woken := false
		select {
		case <-c.bell:
		case <-c.done:
		case <-ctx.Done():
			err = ctx.Err()
		case <-wake:
			woken = true
		}
		c.mu.Lock()
		if err != nil && c.n == 0 {
			return err
		}
		if woken {
			return nil
		}
	}
}

// PollWait polls, waiting first when nothing is there: the blocking
// equivalent of a completion-channel loop. With no room in wcs it returns
// 0 at once, as ibv_poll_cq asked for 0 entries does. Once the CQ has
// overrun and its queued completions are polled, it fails with an error
// wrapping ErrCQOverrun.
func (c *CQ) PollWait(ctx context.Context, wcs []WC) (int, error) {
	if len(wcs) == 0 {
		return 0, nil
	}
	poller, spin, waiter := c.hooks()
	if poller != nil && spin > 0 {
		end := time.Now().Add(spin)
		for i := 1; ; i++ {
			if n := c.Poll(wcs); n > 0 {
				return n, nil
			}
			if i%64 == 0 {
				if ctx.Err() != nil || time.Now().After(end) {
					break
				}
				// Let other goroutines of this P run now and then; a
				// yield at every poll would put a trip through the
				// scheduler between each packet's arrival and its being
				// seen, where the poll (a non-blocking recvmmsg) already
				// takes a system call.
				runtime.Gosched()
			}
		}
	}
	for {
		if n := c.Poll(wcs); n > 0 {
			return n, nil
		}
		if err := c.Err(); err != nil {
			return 0, err
		}
		var err error
		if waiter != nil && !c.isClosed() {
			err = waiter.WaitCQ(ctx, c)
		} else {
			err = c.Wait(ctx)
		}
		if err != nil {
			return 0, err
		}
	}
}

// isClosed reports whether Close has been called.
func (c *CQ) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Down reports whether the CQ has overrun or closed, with one atomic
// load and no lock: a poll loop's check after each empty Poll, before it
// asks Err or Closed which.
func (c *CQ) Down() bool { return c.down.Load() }

// Closed reports whether the CQ has been closed.
func (c *CQ) Closed() bool { return c.isClosed() }

// Notify returns a channel that receives a value when completions arrive,
// for use in a select beside other channels: the Go form of a completion
// channel (ibv_req_notify_cq, then ibv_get_cq_event). Call Notify again
// before each wait; it arms the notification, and when the CQ already
// holds completions (or is closed) the channel is ready at once, so no
// completion that arrives between a Poll and the wait is missed. After a
// wake-up, Poll until it returns 0: a value means "look", and a wake-up
// may find the CQ already emptied by an earlier Poll. The channel is
// closed when the CQ is. One goroutine should wait on it at a time (each
// value wakes one receiver).
//
// Completions reach a CQ only while something takes in the device's
// packets; an rxego.Device does so on its own goroutine whenever no one
// waits in PollWait, so Notify works with it in every mode.
func (c *CQ) Notify() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.notify == nil {
		c.notify = make(chan struct{}, 1)
		if c.closed {
			close(c.notify)
		}
	}
	if c.n > 0 {
		c.signal()
	}
	return c.notify
}

// signal gives Notify's channel a value, if it has none and is open.
// c.mu is held.
func (c *CQ) signal() {
	if c.notify != nil && !c.closed {
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
}

// acquire counts a QP that will complete work on the CQ.
func (c *CQ) acquire() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.users++
	return nil
}

// release undoes acquire.
func (c *CQ) release() {
	c.mu.Lock()
	c.users--
	c.mu.Unlock()
}

// Close closes the CQ: goroutines waiting in Wait, WaitOr, PollWait or on
// Notify's channel wake up; completions still queued can be polled, and
// then waits fail with ErrClosed. While a QP that is not destroyed uses
// the CQ, Close fails with ErrBusy and changes nothing, as
// ibv_destroy_cq does. A second Close returns ErrClosed.
func (c *CQ) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if c.users > 0 {
		return fmt.Errorf("%w: CQ in use by %d QP(s)", ErrBusy, c.users)
	}
	c.closed = true
	c.down.Store(true)
	close(c.done)
	if c.notify != nil {
		close(c.notify)
	}
	if c.watched {
		c.waiter.Wake()
	}
	return nil
}
