package qp

import "time"

// A QP's peer learns that the QP is gone only when the application tells
// it (an rdma_cm disconnect, a message of its own), and packets it sent
// before may still be on their way, be queued in a slow host or be
// retransmitted once more after the QP is destroyed. Such a packet is
// counted apart from one for a number that never existed
// (DropClosedQP, not DropUnknownQP), and the number is not given to a
// new QP for closedQPHold, so that none of those packets reaches a QP
// they were not meant for. Rxe's QP numbers come from a pool whose
// indexes it hands out cyclically, which spaces reuse similarly.

// closedQPHold is how long a destroyed QP's number stays out of use: well
// beyond a retransmission schedule at the timeouts applications use (7
// retries of perftest's 67 ms are half a second).
const closedQPHold = 10 * time.Second

// quarantine records that QP number n was destroyed now. QP0 and QP1 are
// fixed numbers: they are recorded too (a CM MAD retransmitted to a
// closed connection manager counts as drop_closed_qp) but Create gives
// them out again at once.
func (e *Engine) quarantine(n uint32) {
	now := e.cfg.Clock.Now()
	if e.closedQPs == nil {
		e.closedQPs = map[uint32]time.Duration{}
	}
	// Forget the numbers whose hold is over, oldest first (a number
	// destroyed again since keeps its later entry).
	for len(e.closedOrder) > 0 && now-e.closedOrder[0].at >= closedQPHold {
		c := e.closedOrder[0]
		if e.closedQPs[c.qpn] == c.at {
			delete(e.closedQPs, c.qpn)
		}
		e.closedOrder = e.closedOrder[1:]
	}
	e.closedQPs[n] = now
	e.closedOrder = append(e.closedOrder, closedQP{n, now})
}

// closedQP is one Destroy, in Engine.closedOrder.
type closedQP struct {
	qpn uint32
	at  time.Duration
}

// recentlyClosed reports whether QP number n was destroyed less than
// closedQPHold before now.
func (e *Engine) recentlyClosed(n uint32, now time.Duration) bool {
	at, ok := e.closedQPs[n]
	return ok && now-at < closedQPHold
}
