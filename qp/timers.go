package qp

import (
	"time"
)

type timerKind uint8

const (
	timerRetransmit timerKind = iota
	timerRNR
	timerPace     // the pacer allows the next packet
	timerCC       // the congestion controller's rate-increase and alpha timers
	timerRead     // the responder sends the next part of a long READ response
	timerAck      // ACKs InputPolled held are due
	timerSendErr  // a send the Output reported as failed for good (SendFailed)
	timerReadRoom // the READ budget has room again (readRelease)
	numTimers
)

// qpTimer is one of a QP's timers. Its two times lie side by side, not
// in two arrays, so that arming the retransmission timer for each message
// touches one cache line of a cold QP, not two.
type qpTimer struct {
	deadline time.Duration // when the timer fires; 0: disarmed
	queued   time.Duration // the heap entry speaking for it (see timerHeap)
}

type timerEntry struct {
	at   time.Duration
	qp   *QP
	kind timerKind
}

// timerHeap is a binary min-heap of timer entries by time. It is typed
// (no container/heap) so pushing and popping never allocate.
//
// Re-arming a timer for a later time pushes nothing: the entry already
// queued stays, and when it comes due it is pushed again for the
// deadline the QP holds then. So a retransmission timer restarted by every
// acknowledgement costs a store, not a heap operation, and the heap holds
// about one entry per armed timer. q.timer[kind].queued is the time of the entry
// that speaks for (q, kind); any other entry for it is an orphan, skipped
// when it surfaces.
type timerHeap []timerEntry

func (h timerHeap) Len() int { return len(h) }

func (h *timerHeap) push(t timerEntry) {
	*h = append(*h, t)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if s[p].at <= s[i].at {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h *timerHeap) pop() timerEntry {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s[n] = timerEntry{}
	s = s[:n]
	for i := 0; ; {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && s[r].at < s[l].at {
			m = r
		}
		if s[i].at <= s[m].at {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// schedule arms timer kind of q at time at (replacing an earlier arming).
func (e *Engine) schedule(q *QP, kind timerKind, at time.Duration) {
	if at == 0 {
		at = 1 // 0 means disarmed
	}
	q.timer[kind].deadline = at
	if q.timer[kind].queued != 0 && q.timer[kind].queued <= at {
		return // the queued entry comes first and re-queues itself
	}
	q.timer[kind].queued = at
	e.timers.push(timerEntry{at, q, kind})
	if e.wakeFunc != nil && e.timers[0].at == at {
		e.wakeFunc(at)
	}
}

func (e *Engine) cancel(q *QP, kind timerKind) { q.timer[kind].deadline = 0 }

// live reports whether heap entry t still speaks for its timer.
func (t *timerEntry) live() bool {
	q := t.qp
	return q.timer[t.kind].queued == t.at && !q.destroyed && q.timer[t.kind].deadline != 0
}

// skim pops entries from the top of the heap that no longer matter: orphans,
// disarmed timers, and entries whose timer was re-armed later (which go
// back in at the new time).
func (e *Engine) skim() {
	for e.timers.Len() > 0 {
		t := &e.timers[0]
		q := t.qp
		if t.live() && q.timer[t.kind].deadline <= t.at {
			return
		}
		x := e.timers.pop()
		if q.timer[x.kind].queued != x.at {
			continue // an orphan
		}
		q.timer[x.kind].queued = 0
		if d := q.timer[x.kind].deadline; d != 0 && !q.destroyed {
			q.timer[x.kind].queued = d
			e.timers.push(timerEntry{d, q, x.kind})
		}
	}
}

func (e *Engine) runTimers(now time.Duration) {
	e.holdTurns()
	defer e.releaseTurns() // the QPs the timers let send, each in turn
	for {
		e.skim()
		if e.timers.Len() == 0 || e.timers[0].at > now {
			return
		}
		t := e.timers.pop()
		q := t.qp
		q.timer[t.kind].queued = 0
		q.timer[t.kind].deadline = 0
		switch t.kind {
		case timerRetransmit:
			e.retransmitTimeout(q, now)
		case timerRNR:
			e.rnrTimerExpired(q, now)
		case timerPace:
			e.kick(q)
		case timerCC:
			e.ccTimer(q, now)
		case timerRead:
			e.continueRead(q, now)
		case timerAck:
			e.flushAcks()
		case timerSendErr:
			e.sendError(q)
		case timerReadRoom:
			e.kick(q)
		}
	}
}

// MonoClock is a Clock reading the monotonic clock since its creation.
type MonoClock struct{ start time.Time }

// NewMonoClock returns a clock starting now.
func NewMonoClock() *MonoClock { return &MonoClock{start: time.Now()} }

// Now returns the time since the clock was made.
func (c *MonoClock) Now() time.Duration { return time.Since(c.start) }

// RunTimers drives the engine's timers on real time until stop is closed.
// The engine's clock must be a MonoClock (or another clock tracking real
// time).
func (e *Engine) RunTimers(stop <-chan struct{}) {
	wake := make(chan struct{}, 1)
	e.SetWake(func(time.Duration) {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		d := time.Hour
		if at, ok := e.NextDeadline(); ok {
			d = at - e.cfg.Clock.Now()
			if d < 0 {
				d = 0
			}
		}
		t.Reset(d)
		select {
		case <-stop:
			return
		case <-wake:
		case <-t.C:
			e.Tick()
		}
	}
}
