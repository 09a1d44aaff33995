package qp

// Turns: how the requesters of many QPs share the engine's send path.
//
// A UDP GSO datagram carries one QP's packets only (one destination, one
// UDP header, and the Output finds a run by the packets lying back to
// back in the slab), so what the Output can send in one system call
// depends on how long each QP's run of adjacent packets is in the batch.
// When every ACK of a received batch sent its QP's next few packets at
// once, a batch with ACKs for eight QPs interleaved them in short runs,
// and the system calls per byte grew with the QP count. Instead, a QP
// with something to send joins a round-robin list of ready QPs, and the
// list is run when the engine finishes what it was doing (a received
// batch, a timer pass, a post): each QP in turn sends until its window,
// credits or pacing stop it or its turn's budget (turnBytes) is spent,
// and goes to the back of the list if it could send more. Every QP with
// work gets one turn per round, so none waits for more than one round
// of the others' turns.

// turnBytes is the most bytes (BTH through ICRC) a QP sends in one turn
// while other QPs wait: four full UDP GSO datagrams (the kernel takes at
// most 64 segments and 64 KiB in one), enough that the short datagram at
// the turn's end is one in five or more, and little enough that sixteen
// QPs' turns take a few batches, not a window each (at MTU 4096 a window
// of 256 PSNs is 1 MiB).
const turnBytes = 4 * (64 << 10)

// kick lets q's requester send what it can: at once, or, while the
// engine is taking in a batch or running timers (turnsHeld), when that
// ends (runTurns), together with every other QP that got something to
// send meanwhile.
func (e *Engine) kick(q *QP) {
	if !q.turnQueued {
		q.turnQueued = true
		e.ready = append(e.ready, q)
	}
	if e.turnsHeld == 0 {
		e.runTurns()
	}
}

// holdTurns defers kicks until the matching releaseTurns, which runs
// them.
func (e *Engine) holdTurns() { e.turnsHeld++ }

// releaseTurns ends a holdTurns and, at the outermost, runs the turns of
// the QPs kicked meanwhile.
func (e *Engine) releaseTurns() {
	e.turnsHeld--
	if e.turnsHeld == 0 {
		e.runTurns()
	}
}

// runTurns gives every ready QP turns, round by round, until none can
// send more. A QP kicked during a round (a turn's packet can complete a
// local operation, which kicks nothing today, but a later change might)
// gets its turn in the next.
func (e *Engine) runTurns() {
	if e.turning {
		return // the running loop takes the QP in its next round
	}
	e.turning = true
	for len(e.ready) > 0 {
		round := e.ready
		e.ready = e.nextRound[:0]
		for _, q := range round {
			q.turnQueued = false
			if e.turn(q) && !q.turnQueued {
				q.turnQueued = true
				e.ready = append(e.ready, q)
			}
		}
		clear(round)
		e.nextRound = round[:0]
	}
	e.turning = false
}

// turn runs q's requester for one turn and reports whether it stopped
// only because the turn's budget was spent. In SQD it finishes (and
// retransmits) the messages it had started, and starts none.
func (e *Engine) turn(q *QP) (more bool) {
	if q.destroyed || q.state != RTS && q.state != SQD || q.req.rnrWait || q.sqSend == q.sqTail {
		return false
	}
	now := e.cfg.Clock.Now()
	start := e.emitted
	for q.sqSend != q.sqTail && (q.state == RTS || q.state == SQD) {
		if q.state == SQD && !q.wqe(q.sqSend).started {
			break
		}
		if e.emitted-start+uint64(q.mtuOrMax()+maxHeaders) > turnBytes {
			return true
		}
		if !e.sendNext(q, now) {
			break
		}
	}
	return false
}

// maxHeaders bounds a request packet's bytes beyond its payload: the
// longest header set, pad and ICRC (MaxPacket less the largest payload).
const maxHeaders = MaxPacket - 4096
