package qp

import "time"

// The requester's congestion window (issue 23). IBTA and rxe resend
// everything from the oldest unacknowledged PSN after a timeout, up to
// the whole send window at once; against a slow responder (a loaded host,
// a small VM) whose queue already holds that window, the resends only
// bury it deeper, and every QP does the same at every timeout. So a QP
// keeps, within the fixed Config.Window, a congestion window as TCP
// does. It starts open (a QP sends as before until the peer drops
// something). A timeout restarts it at one PSN, acknowledgements grow it
// again (doubling each round trip up to half of what was in flight at
// the timeout, then one PSN per window's worth of acknowledgements), and
// a PSN sequence error NAK (a packet lost) halves what was in flight.
// Halving alone is not enough against random loss, which does not stop
// when the window shrinks: Go-back-N resends what is in flight behind
// every loss, so a loss cap (lossCap) keeps the window at a lossShare-th
// of the PSNs delivered between losses, and, before the first loss, at
// the initial window or a startShare-th of the PSNs delivered.
// The timer itself keeps IBTA's timing: one Local ACK Timeout per try
// and retry_cnt tries, as rxe, with no exponential back-off (its tests
// and applications count on retry_cnt+1 timeouts to RETRY_EXC_ERR).

// minCwnd is the least a sequence error NAK or slow start's threshold
// leaves of the congestion window, in PSNs: a few packets, enough to keep
// ACKs coming back. A timeout leaves one PSN (the oldest unacknowledged,
// resent), as TCP's loss window; ACKs then open it again.
const minCwnd = 2

// queueDelay is the round-trip time beyond twice the least one seen at
// which a QP takes packets to be queueing at a slow peer (a loaded host,
// an emulated guest) and stops opening its window, as delay-based TCP
// (Vegas, HyStart) does before the queue overflows. A millisecond is
// far above the jitter of a fast path.
const queueDelay = time.Millisecond

// lossShare is the least number of PSNs a QP delivers, between two
// losses, per PSN its congestion window may hold. Go-back-N resends what
// is in flight behind a loss, about the window, so a QP that loses a
// packet every G PSNs (random loss does not go away when the window
// shrinks, as congestion does) keeps its window at G/lossShare at most:
// what goes twice stays near 1/lossShare of what is sent, where halving
// alone (TCP's AIMD) settles near 1.2/sqrt(loss rate), 12 PSNs or 12 %
// at 1 % loss. Without loss the bound lifts as PSNs are acknowledged
// (lossCap), and the window grows back.
const lossShare = 12

// startShare is lossShare before the first loss, for a QP that starts
// with a small window (Config.InitialWindow): its window holds at most the
// initial window or a startShare-th of the PSNs delivered so far. Slow
// start alone doubles the window each round trip, and the first loss
// (after about 100 PSNs at 1 % loss) then found 15 to 86 PSNs in flight
// against an rxe guest, most of what a short run resent.
const startShare = 4

// window returns how many PSNs q may keep unacknowledged now.
func (e *Engine) window(q *QP) int {
	w := e.cfg.Window
	if c := q.req.cwnd; c > 0 && c < w {
		w = c
	}
	return min(w, e.lossCap(q))
}

// lossCap is the most PSNs q's window may hold for the losses it has
// seen: lossShare-th of the PSNs it delivered between losses (an average
// of the last few gaps, or the gap since the last loss when that is
// longer), and Config.Window while it has lost nothing.
func (e *Engine) lossCap(q *QP) int {
	r := &q.req
	since := int(r.compPSN.Diff(r.lossPSN))
	if r.lossGap == 0 {
		start := e.cfg.Window
		if w := e.cfg.InitialWindow; w > 0 && w < start {
			start = w
		}
		return max(start, since/startShare)
	}
	return max(minCwnd, max(r.lossGap, since)/lossShare)
}

// lossSeen records a loss (a sequence error NAK or a missing READ
// response) in the gap average lossCap reads: a quarter of the new
// gap, as TCP's RTT average weighs a sample.
func (e *Engine) lossSeen(q *QP) {
	r := &q.req
	gap := max(int(r.compPSN.Diff(r.lossPSN)), 1)
	if r.lossGap == 0 {
		r.lossGap = gap
	} else {
		r.lossGap = (3*r.lossGap + gap) / 4
	}
	r.lossPSN = r.compPSN
}

// ackReqDue reports whether the packet the requester is about to send
// must ask for an acknowledgement beyond the every-AckEvery rule: when it
// fills the window, or half a small window has gone unasked, the requester
// would otherwise wait for an ACK that the responder has no reason to
// send until the message ends.
func (e *Engine) ackReqDue(q *QP) bool {
	r := &q.req
	w := e.window(q)
	return int(r.psn.Diff(r.compPSN))+1 >= w || r.noAck+1 >= max(w/2, 1)
}

// cwndOpen grows the congestion window by the PSNs acknowledged since the
// last call. It is called whenever an acknowledgement or response moved
// compPSN.
func (e *Engine) cwndOpen(q *QP, now time.Duration) {
	r := &q.req
	k := int(r.compPSN.Diff(r.ackedTo))
	r.ackedTo = r.compPSN
	if r.afterTimeout && !r.compPSN.Before(r.recoverTo) {
		r.afterTimeout = false
	}
	if r.rttArmed && r.compPSN.After(r.rttPSN) {
		r.rttArmed = false
		rtt := now - r.rttAt
		if r.minRTT == 0 || rtt < r.minRTT {
			r.minRTT = rtt
		}
		r.queueing = rtt > 2*r.minRTT+queueDelay
	}
	if k <= 0 || r.cwnd == 0 {
		return
	}
	if r.queueing {
		// Packets wait at the peer: a bigger window would only lengthen
		// the queue until it overflows. Slow start ends here.
		r.ssthresh = min(r.ssthresh, r.cwnd)
		return
	}
	if r.cwnd < r.ssthresh {
		r.cwnd = min(r.cwnd+k, r.ssthresh) // slow start
	} else {
		r.cwndAcc += k // congestion avoidance: one PSN per window acknowledged
		for r.cwndAcc >= r.cwnd {
			r.cwndAcc -= r.cwnd
			r.cwnd++
		}
	}
	if r.cwnd >= e.cfg.Window {
		r.cwnd = 0 // open: the fixed window rules again
	} else {
		r.cwnd = min(r.cwnd, max(e.lossCap(q), r.cwnd-k)) // no growth beyond the loss cap
	}
}

// cwndTimeout shrinks the window after a retransmission timeout: what was
// in flight did not come back in time, so the responder (or the path) is
// slower than the window assumed. It also tells DCQCN, as a CNP would.
func (e *Engine) cwndTimeout(q *QP, now time.Duration) {
	r := &q.req
	flight := int(r.maxSent.Diff(r.compPSN))
	// Not lossSeen: a timeout resends one PSN, not the window, and
	// against a stalled guest it is as often delay as loss; counted, a
	// run of spurious timeouts shrank the loss cap to its floor.
	r.ssthresh = max(min(flight, e.window(q))/2, minCwnd)
	r.cwnd, r.cwndAcc = 1, 0
	r.ackedTo = r.compPSN
	r.afterTimeout, r.recoverTo = true, r.maxSent
	e.Stats.WindowCuts.Add(1)
	e.ccLoss(q, now)
}

// cwndLoss halves the window after a PSN sequence error NAK: a packet
// was lost, the ones after it still arrived.
func (e *Engine) cwndLoss(q *QP) {
	r := &q.req
	flight := int(r.maxSent.Diff(r.compPSN))
	e.lossSeen(q)
	r.ssthresh = max(min(flight, e.window(q))/2, minCwnd) // half of what was in flight, as TCP (RFC 5681)
	r.cwnd, r.cwndAcc = r.ssthresh, 0
	r.ackedTo = r.compPSN
	r.afterTimeout = false
	e.Stats.WindowCuts.Add(1)
}
