package qp

// READs the requester's own socket can take (issue 23). A READ work
// request is sent as READ requests of at most Config.ReadChunk bytes
// each: request j asks for chunk j of the message (its own RETH address
// and length, its own PSN range, the next request's PSN following the
// last response PSN of this one), and the work request completes, with
// one completion, when the last chunk's last response arrives. Each
// request counts against max_rd_atomic while its responses are due, as
// the responder holds a READ resource per request (max_dest_rd_atomic).
// A new chunk is requested only while the engine's READ responses in
// flight, in bytes, stay within Config.ReadBudget (at least one chunk is
// always allowed), which the device sizes from its socket's receive
// buffer: responses arrive as fast as the responder can send them, and
// beyond that budget they would overflow the socket and be lost, and
// each retry would ask for them again. A retry asks from the first
// missing response to the end of that chunk, then for the later chunks
// it had asked for, whose responses were discarded behind the gap.

// DefaultReadChunk is the most bytes one READ request asks for when
// Config.ReadChunk is 0. Smaller requests waste less when a response is
// lost: the responder goes on sending the rest of the request's responses,
// all discarded behind the gap (rxe 6.1 even after the request comes
// again).
const DefaultReadChunk = 64 << 10

// readChunkPkts is how many response PSNs one READ request of q covers.
func (e *Engine) readChunkPkts(mtu int) int {
	return max(e.cfg.ReadChunk/mtu, 1)
}

// readChunkEnd returns the PSN offset, from w's first response, after the
// chunk that offset k lies in.
func (w *sendWQE) readChunkEnd(k int) int {
	return min((k/w.chunkPkts+1)*w.chunkPkts, w.npkts)
}

// readChunkBytes is the length of the chunk at PSN offset k.
func (w *sendWQE) readChunkBytes(k, mtu int) int {
	start := k / w.chunkPkts * w.chunkPkts * mtu
	return int(min(uint64(w.readChunkEnd(k)*mtu), uint64(w.length))) - min(start, int(w.length))
}

// readAdmit reports whether the READ request at the requester's send
// position may go now, and whether it asks for a chunk not asked for
// before (which then must be counted: readCount). A re-sent request
// always may. A new one waits for max_rd_atomic and for the engine's
// budget; waiting for the budget, q is woken when responses free it.
func (e *Engine) readAdmit(q *QP, w *sendWQE, mtu int) (ok, fresh bool) {
	k := 0
	if w.started {
		k = int(q.req.psn.Diff(w.firstPSN))
	} else {
		// Requests no longer than the congestion window: the window
		// bounds the responses in flight (sendNext), so what a lost one
		// costs shrinks with it.
		// Half the window: the next request goes while the responses
		// to this one still come, and the loss of this one's last
		// response shows as a gap in the next one's instead of waiting
		// for the retransmission timeout.
		w.chunkPkts = min(e.readChunkPkts(mtu), max(e.window(q)/2, 1))
		w.npkts = packetsFor(w.length, mtu)
	}
	if k/w.chunkPkts < w.reqSent {
		return true, false
	}
	// The responses a request asks for count against the window as they
	// come (sendNext checks only where the request starts): a request
	// whose chunk would run past the window waits, unless nothing is in
	// flight (the chunk is then at most the window it started with).
	if r := &q.req; r.psn != r.compPSN && int(r.psn.Diff(r.compPSN))+w.readChunkEnd(k)-k > e.window(q) {
		return false, true
	}
	if q.req.rdOut >= q.maxRdAtomic() {
		return false, true
	}
	if n := w.readChunkBytes(k, mtu); e.cfg.ReadBudget > 0 && e.readOut > 0 && e.readOut+n > e.cfg.ReadBudget {
		if !q.readWaiting {
			q.readWaiting = true
			e.readWait = append(e.readWait, q)
		}
		e.Stats.ReadBudgetWaits.Add(1)
		return false, true
	}
	return true, true
}

// readCount counts the new request for the chunk at the send position.
func (e *Engine) readCount(q *QP, w *sendWQE, mtu int) {
	k := int(q.req.psn.Diff(w.firstPSN))
	n := w.readChunkBytes(k, mtu)
	w.reqSent = k/w.chunkPkts + 1
	w.rdHeld++
	w.budgetHeld += n
	q.req.rdOut++
	e.readOut += n
	e.Stats.RDMASends.Add(1)
}

// readChunkDone releases what the request for the chunk ending at PSN
// offset k+1 held, once its last response is placed.
func (e *Engine) readChunkDone(q *QP, w *sendWQE, k int) {
	if w.rdHeld == 0 {
		return
	}
	n := w.readChunkBytes(k, q.mtu)
	w.rdHeld--
	q.req.rdOut--
	// A chunk complete in order ends the retry that was under way (as a
	// completed WQE does, see requester.retrying): a gap in a later chunk
	// is asked for again at once rather than after a timeout. What a
	// peer still sends of an earlier stream is at most a chunk.
	q.req.retrying = false
	w.budgetHeld -= n
	e.readRelease(n)
}

// releaseWQE lets go of what w still holds of max_rd_atomic and the
// READ budget: when it completes, fails, is flushed or discarded.
func (e *Engine) releaseWQE(q *QP, w *sendWQE) {
	q.req.rdOut -= w.rdHeld
	w.rdHeld = 0
	if n := w.budgetHeld; n > 0 {
		w.budgetHeld = 0
		e.readRelease(n)
	}
}

// releaseAll is releaseWQE for every WQE on q's send queue.
func (e *Engine) releaseAll(q *QP) {
	for i := q.sqHead; i != q.sqTail; i++ {
		e.releaseWQE(q, q.wqe(i))
	}
}

// readRelease gives n bytes back to the READ budget and wakes the QPs
// that wait for room. Inside an input batch or a timer run (turns held)
// a kick only queues their turns, which run when the batch ends, on the
// goroutine that took the responses in: their requests leave with the
// batch's other packets. Outside them (a reset, a destroy or a flush
// the application's call makes, in the middle of its own work) they are
// woken through their timer, not here.
func (e *Engine) readRelease(n int) {
	e.readOut -= n
	if len(e.readWait) == 0 {
		return
	}
	now := e.cfg.Clock.Now()
	for _, q := range e.readWait {
		q.readWaiting = false
		switch {
		case q.destroyed: // nothing to wake
		case e.turnsHeld > 0:
			e.kick(q)
		default:
			e.schedule(q, timerReadRoom, now)
		}
	}
	clear(e.readWait)
	e.readWait = e.readWait[:0]
}
