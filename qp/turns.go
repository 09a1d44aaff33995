package qp

import (
	"time"

	"github.com/rxego/rxego/bth"
)

// Turns: how the requesters of many QPs share the engine's send path.
//
// A UDP GSO datagram carries the packets of one destination and source
// port (and the Output finds a run by the packets lying back to back in
// the slab), so what the Output can send as one datagram depends on how
// long each QP's run of adjacent packets is in the batch. When every ACK
// of a received batch sent its QP's next few packets at once, a batch
// with several ACKs for each of many QPs interleaved them in short runs;
// where QPs leave from different source ports (a device's default off
// loopback) or go to different peers, each run became a datagram of its
// own. Instead, a QP with something to send joins a round-robin list of
// ready QPs, and the list is run when the engine finishes what it was
// doing (a received batch, a timer pass, a post): each QP in turn sends
// until its window, credits or pacing stop it or its turn's budget
// (turnPackets) is spent, and goes to the back of the list if it could
// send more. Every QP with work gets one turn per round, so none waits
// for more than one round of the others' turns.

// gsoSegments and gsoBytes are the most one UDP GSO datagram carries: 64
// segments (what every kernel with UDP_SEGMENT accepts) and 65,507 bytes
// of UDP payload (an IPv4 datagram's), the limits transport.Coalesce
// applies.
const (
	gsoSegments = 64
	gsoBytes    = 65535 - 20 - 8
)

// turnDatagrams is how many full GSO datagrams of its packets a QP sends
// in one turn while other QPs wait: enough that the turn's GSO runs are
// long, and few enough that sixteen QPs' turns take a few batches, not a
// window each (at MTU 4096 a window of 256 PSNs is 1 MiB).
const turnDatagrams = 4

// turnPackets is the most packets a QP with path MTU mtu sends in one
// turn: turnDatagrams datagrams of full packets (a BTH, mtu bytes of
// payload and the ICRC, as the MIDDLE packets of a long message are), so
// that a turn ends where a datagram does.
func turnPackets(mtu int) int {
	return turnDatagrams * max(1, min(gsoSegments, gsoBytes/(bth.Len+mtu+bth.ICRCLen)))
}

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

// kickPosted is kick for PostSend: inside a batch (Engine.Batch) the
// QP's turn waits for RunBatch, so the packets are built where the batch
// ends, on the goroutine that sends them (a device's shard sender), not
// on the poster's.
func (e *Engine) kickPosted(q *QP) {
	if e.turnsHeld == 0 && e.leaveToBatch() {
		if !q.turnQueued {
			q.turnQueued = true
			e.ready = append(e.ready, q)
		}
		return
	}
	e.kick(q)
}

// leaveToBatch reports whether a batch is open that will send what the
// caller leaves (RunBatch). It marks the work before it looks at the batch
// count a second time, and EndBatch looks at the mark after lowering the
// count, so either the batch's end sees the work or the caller sees the
// batch over and sends itself.
func (e *Engine) leaveToBatch() bool {
	if e.batching.Load() == 0 {
		return false
	}
	// A mark already set is as good as a new one: the EndBatch that
	// clears it (after this look at the count, which it lowers) runs
	// RunBatch, which takes the lock this post holds. Storing it anyway
	// is a locked exchange on every post of a batch, which waits for the
	// post's stores into its cold WQE: 5% of a 10,000-QP client's CPU.
	if !e.posted.Load() {
		e.posted.Store(true)
	}
	return e.batching.Load() > 0
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
	if e.turning || len(e.ready) == 0 {
		return // nothing to run, or the running loop takes the QP in its next round
	}
	e.turning = true
	now, sent := e.cfg.Clock.Now(), 0
	for len(e.ready) > 0 {
		round := e.ready
		e.ready = e.nextRound[:0]
		for _, q := range round {
			q.turnQueued = false
			if sent >= clockPackets {
				now, sent = e.cfg.Clock.Now(), 0
			}
			more, n := e.turn(q, now)
			sent += n
			if more && !q.turnQueued {
				q.turnQueued = true
				e.ready = append(e.ready, q)
			}
		}
		clear(round)
		e.nextRound = round[:0]
	}
	e.turning = false
}

// clockPackets is how many packets the turns send on one reading of the
// clock. Read for every turn, the clock cost 3.5% of a 10,000-QP client's
// CPU (one packet a turn); read every 16 packets, a turn's time is at
// most a few microseconds old, far under anything it times (a
// retransmission timeout, queueDelay, the pacer's gaps), and no older
// than a received batch's own reading is by its last packet.
const clockPackets = 16

// turn runs q's requester for one turn, at time now, and reports whether
// it stopped only because the turn's budget was spent, and how many
// packets it sent (a local operation, LOCAL_INV or a bind, counts as
// one). In SQD it finishes (and retransmits) the messages it had started,
// and starts none.
func (e *Engine) turn(q *QP, now time.Duration) (more bool, sent int) {
	if q.destroyed || q.state != RTS && q.state != SQD || q.req.rnrWait || q.sqSend == q.sqTail {
		return false, 0
	}
	budget := turnPackets(q.mtuOrMax())
	for ; q.sqSend != q.sqTail && (q.state == RTS || q.state == SQD); sent++ {
		if q.state == SQD && !q.wqe(q.sqSend).started {
			break
		}
		if sent == budget {
			return true, sent
		}
		if !e.sendNext(q, now) {
			break
		}
	}
	return false, sent
}
