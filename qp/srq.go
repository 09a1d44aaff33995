package qp

import "fmt"

// srqLife is an SRQ's lifecycle and limit event, guarded by the SRQ's mu.
type srqLife struct {
	users     int  // QPs attached (Engine.Create, QP.Destroy)
	destroyed bool // Destroy was called
	// limit is the armed srq_limit (0: disarmed); limitCh gets a value
	// when the posted count drops below it (see Arm).
	limit   int
	limitCh chan struct{}
}

// acquire counts a QP that takes its receives from the SRQ; a nil SRQ
// (the QP has its own receive queue) is fine.
func (s *SRQ) acquire() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return ErrClosed
	}
	s.users++
	return nil
}

// release undoes acquire.
func (s *SRQ) release() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.users--
	s.mu.Unlock()
}

// Depth returns how many receive WQEs the SRQ holds at most (max_wr).
func (s *SRQ) Depth() int { return len(s.ring) }

// Destroy destroys the SRQ (ibv_destroy_srq): the receives still posted
// are dropped without completions, and PostRecv fails with ErrClosed.
// While a QP that is not destroyed uses the SRQ, Destroy fails with
// ErrBusy and changes nothing, as ibv_destroy_srq does. A second Destroy
// returns ErrClosed. The channel of LimitReached is closed.
func (s *SRQ) Destroy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return ErrClosed
	}
	if s.users > 0 {
		return fmt.Errorf("%w: SRQ in use by %d QP(s); destroy them first", ErrBusy, s.users)
	}
	s.destroyed = true
	clear(s.ring)
	s.n, s.limit = 0, 0
	if s.limitCh != nil {
		close(s.limitCh)
	}
	return nil
}

// Arm sets the SRQ's limit (ibv_modify_srq with IBV_SRQ_LIMIT): when a
// receive taken from the SRQ leaves fewer than limit WQEs posted, the
// channel of LimitReached gets a value once and the limit disarms, as
// IBV_EVENT_SRQ_LIMIT_REACHED does (rxe's rule: the count after the take
// is below the limit). Arm again after each event to keep watching.
// limit 0 disarms; a limit of the depth or more is refused, as verbs
// refuses one above max_wr.
func (s *SRQ) Arm(limit int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return ErrClosed
	}
	if limit < 0 || limit >= len(s.ring) {
		return fmt.Errorf("qp: SRQ limit %d out of range: want 0 (disarm) to %d (below the depth %d)", limit, len(s.ring)-1, len(s.ring))
	}
	if s.limitCh == nil {
		s.limitCh = make(chan struct{}, 1)
	}
	s.limit = limit
	return nil
}

// Limit returns the armed limit, 0 when disarmed (ibv_query_srq's
// srq_limit).
func (s *SRQ) Limit() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit
}

// LimitReached returns the channel that receives a value when the armed
// limit is reached (see Arm): the SRQ's IBV_EVENT_SRQ_LIMIT_REACHED, for a
// select beside the application's other channels. It is closed when the
// SRQ is destroyed.
func (s *SRQ) LimitReached() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limitCh == nil {
		s.limitCh = make(chan struct{}, 1)
		if s.destroyed {
			close(s.limitCh)
		}
	}
	return s.limitCh
}

// checkLimit fires the limit event when the count has dropped below the
// armed limit; s.mu is held.
func (s *SRQ) checkLimit() {
	if s.limit == 0 || s.n >= s.limit {
		return
	}
	s.limit = 0
	select {
	case s.limitCh <- struct{}{}:
	default:
	}
}
