package qp

import (
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/reth"
)

// The completer: acknowledgements, NAKs, READ responses and atomic
// results coming back to a requester.

// complete handles an ACKNOWLEDGE, READ response or ATOMIC ACKNOWLEDGE
// arriving at q's requester.
func (e *Engine) complete(q *QP, in *InPacket, now time.Duration) {
	p := in.Pkt
	psn := p.BTH().PSN()
	r := &q.req
	if q.state != RTS && q.state != SQD && q.state != SQE {
		e.drop(DropBadState)
		return
	}
	// A response for a PSN never sent, or one already acknowledged, is
	// stale.
	if !psn.Before(r.maxSent) || psn.Before(r.compPSN) && p.Info.Op != bth.OpAck {
		e.drop(DropStaleResponse)
		return
	}
	switch p.Info.Op {
	case bth.OpAck:
		e.handleAETH(q, p.AETH(), psn, now)
	case bth.OpReadResponse:
		e.readResponse(q, in, psn, now)
	case bth.OpAtomicAck:
		e.atomicAck(q, p, psn, now)
	}
	if r.psn.Before(r.compPSN) {
		// A response to the first transmission of PSNs that a Go-back-N
		// rewind set to go again acknowledged past the send position:
		// those PSNs are done, so sending resumes after them rather than
		// from a WQE that has completed (and whose ring slot may already
		// hold a newer WR). Ignoring such a response instead can livelock
		// a paced requester whose resends are slower than its timeout.
		e.rewind(q, r.compPSN)
	}
	e.kick(q)
}

// handleAETH interprets an ACK or NAK carrying PSN psn.
func (e *Engine) handleAETH(q *QP, a reth.AETH, psn bth.PSN, now time.Duration) {
	r := &q.req
	syn := a.Syndrome()
	if syn.Kind() != reth.KindACK && psn.Before(r.compPSN) {
		// A (RNR) NAK for PSNs already acknowledged is a delayed
		// duplicate: acting on it would rewind the requester to PSNs
		// the responder has consumed. (It may also show a responder
		// left behind by a forged response: see contradicts.)
		e.contradicts(q, syn)
		e.drop(DropStaleResponse)
		return
	}
	switch syn.Kind() {
	case reth.KindACK:
		if psn.Before(r.compPSN) {
			e.drop(DropDuplicate) // an old ACK: nothing new acknowledged
			return
		}
		e.acknowledge(q, psn, now)
	case reth.KindRNR:
		e.Stats.RcvdRNRErr.Add(1)
		e.acknowledge(q, psn.Add(-1), now)
		if q.state != RTS && q.state != SQD {
			return
		}
		if !spend(&r.rnrLeft) {
			e.Stats.RetryRNRExceededErr.Add(1)
			// The retry budget is the oldest WQE's (rxe fails the WQE its
			// completer is on): a READ or atomic still waiting before the
			// NAKed PSN must not complete flushed ahead of the error.
			e.failWQE(q, q.wqe(q.sqHead), WCRNRRetryExcErr)
			return
		}
		// The rewind waits for the timer (rnrTimerExpired), as rxe's
		// req_retry does: responses that overtook this NAK may yet
		// acknowledge the PSNs it names, and the retry must start from
		// what is acknowledged then.
		r.rnrWait = true
		e.cancel(q, timerRetransmit)
		e.schedule(q, timerRNR, now+RNRWait(syn.Value(), e.cfg.RNRTick))
	case reth.KindNAK:
		e.acknowledge(q, psn.Add(-1), now)
		if q.state != RTS && q.state != SQD {
			return
		}
		switch syn.Value() {
		case reth.NAKPSNSeqError:
			e.Stats.RcvdSeqErr.Add(1)
			if e.retryOrFail(q, q.wqe(q.sqHead), psn) { // the oldest WQE's budget, as for RNR above
				e.cwndLoss(q)
			}
		case reth.NAKInvalidRequest:
			e.failWQE(q, e.wqeAt(q, psn), WCRemInvReqErr)
		case reth.NAKRemoteAccess:
			e.failWQE(q, e.wqeAt(q, psn), WCRemAccessErr)
		default: // remote operational error, and (as rxe) any other code
			e.failWQE(q, e.wqeAt(q, psn), WCRemOpErr)
		}
	default:
		e.drop(DropOther)
	}
}

// wqeAt returns the WQE whose PSN range holds psn (or the oldest).
func (e *Engine) wqeAt(q *QP, psn bth.PSN) *sendWQE {
	for i := q.sqHead; i != q.sqTail; i++ {
		w := q.wqe(i)
		if w.started && !psn.Before(w.firstPSN) && !psn.After(w.lastPSN) {
			return w
		}
	}
	return q.wqe(q.sqHead)
}

// acknowledge marks every PSN up to and including psn as acknowledged and
// completes what that finishes. An ACK that passes a READ or atomic still
// waiting for its response means the response was lost: the requester
// retries from there (rxe's implicit NAK).
func (e *Engine) acknowledge(q *QP, psn bth.PSN, now time.Duration) {
	r := &q.req
	progress := false
	for i := q.sqHead; i != q.sqTail; i++ {
		w := q.wqe(i)
		if !w.started || psn.Before(w.firstPSN) {
			break
		}
		if w.needsResponse() {
			if w.acked {
				continue
			}
			if psn.After(w.lastPSN) && (!r.gapPending || r.gapPSN != r.compPSN) {
				// acknowledged past a response that never came
				r.gapPending, r.gapPSN, r.retrying = true, r.compPSN, true
				e.retry(q, r.compPSN)
			}
			break
		}
		if psn.Before(w.lastPSN) {
			// part of a multi-packet message
			if psn.Next().After(r.compPSN) {
				r.compPSN = psn.Next()
				progress = true
			}
			break
		}
		if !w.acked {
			w.acked = true
			progress = true
		}
		if w.lastPSN.Next().After(r.compPSN) {
			r.compPSN = w.lastPSN.Next()
		}
	}
	if progress {
		e.progress(q, now)
	}
	e.completeAcked(q)
}

// responderAlive re-arms the retransmit timer when responses the
// requester cannot use (duplicates, responses past a gap, responses to
// finished READs) still arrive: the responder is at work, most likely on
// a stream from before a retry, and a timeout now would start one more
// stream behind it (rxe likewise re-arms its timer while a long READ's
// responses come). The retry budget is not reset.
func (e *Engine) responderAlive(q *QP, now time.Duration) {
	r := &q.req
	if q.timer[timerRetransmit].deadline != 0 && r.compPSN.Before(r.maxSent) && q.attr.Timeout != 0 {
		e.schedule(q, timerRetransmit, now+ackTimeout(q.attr.Timeout))
	}
}

// progress resets the retry budgets and the retransmit timer after an
// acknowledgement moved the window.
func (e *Engine) progress(q *QP, now time.Duration) {
	r := &q.req
	r.refill(q)
	r.gapPending = false
	e.cwndOpen(q, now)
	if r.compPSN.Before(r.maxSent) && q.attr.Timeout != 0 {
		e.schedule(q, timerRetransmit, now+ackTimeout(q.attr.Timeout))
	} else {
		e.cancel(q, timerRetransmit)
	}
}

// completeAcked completes WQEs from the head, in order, while they are done.
func (e *Engine) completeAcked(q *QP) {
	for q.sqHead != q.sqTail {
		w := q.wqe(q.sqHead)
		if !w.acked {
			return
		}
		q.req.retrying = false
		w.done = true
		q.retire(false)
	}
}

// readResponse places the payload of an RDMA READ response (or the empty
// READ RESPONSE ONLY that answers FLUSH and ATOMIC WRITE).
func (e *Engine) readResponse(q *QP, in *InPacket, psn bth.PSN, now time.Duration) {
	r := &q.req
	p := in.Pkt
	if psn.Before(r.compPSN) {
		e.drop(DropDuplicate)
		e.responderAlive(q, now)
		return
	}
	if psn.After(r.compPSN) {
		// The response implicitly acknowledges the requests before its
		// READ, whose coalesced ACK may well come after it.
		e.acknowledge(q, psn.Add(-1), now)
	}
	if psn.After(r.compPSN) {
		// A response is missing: ask again from the first one not received,
		// once per gap, and not while an earlier retry is under way.
		if !r.retrying && (!r.gapPending || r.gapPSN != r.compPSN) {
			r.gapPending, r.gapPSN, r.retrying = true, r.compPSN, true
			e.Stats.RcvdSeqErr.Add(1)
			e.retry(q, r.compPSN)
			e.cwndLoss(q) // a response was lost: as a sequence NAK
		}
		e.drop(DropOutOfSequence)
		e.responderAlive(q, now)
		return
	}
	w := e.wqeAt(q, psn)
	if !w.started || !w.needsResponse() || w.acked {
		e.drop(DropStaleResponse)
		e.responderAlive(q, now)
		return
	}
	// The response implicitly acknowledges everything before it.
	e.acknowledge(q, psn.Add(-1), now)
	if w.wr.Opcode != WRRead {
		if p.Info.Opcode != bth.RCReadResponseOnly || len(p.Payload()) != 0 {
			e.failWQE(q, w, WCBadRespErr)
			return
		}
		e.finishResponse(q, w, psn, now)
		return
	}
	payload := p.Payload()
	k := psn.Diff(w.firstPSN)
	off := uint32(int64(k) * int64(q.mtu))
	last := p.Info.Has(bth.Last)
	wantLen := min(uint32(q.mtu), w.length-min(off, w.length))
	chunkEnd := w.readChunkEnd(int(k)) == int(k)+1 // the last response to its request
	if uint32(len(payload)) != wantLen || last != chunkEnd {
		e.failWQE(q, w, WCBadRespErr)
		return
	}
	if err := e.scatter(q.pd, w.sgl, off, payload); err != nil {
		e.failWQE(q, w, WCLocProtErr)
		return
	}
	e.Stats.RcvdBytes.Add(uint64(len(payload)))
	r.compPSN = psn.Next()
	r.gapPending = false
	if chunkEnd {
		e.readChunkDone(q, w, int(k))
	}
	if psn == w.lastPSN {
		e.finishResponse(q, w, psn, now)
	} else {
		e.progress(q, now)
	}
}

func (e *Engine) finishResponse(q *QP, w *sendWQE, psn bth.PSN, now time.Duration) {
	w.acked = true
	if psn.Next().After(q.req.compPSN) {
		q.req.compPSN = psn.Next()
	}
	e.progress(q, now)
	e.completeAcked(q)
}

func (e *Engine) atomicAck(q *QP, p bth.Packet, psn bth.PSN, now time.Duration) {
	r := &q.req
	if psn != r.compPSN {
		if psn.After(r.compPSN) {
			e.acknowledge(q, psn.Add(-1), now)
		}
		if psn != r.compPSN {
			e.drop(DropStaleResponse)
			return
		}
	}
	w := e.wqeAt(q, psn)
	if !w.started || w.firstPSN != psn || (w.wr.Opcode != WRCompareSwap && w.wr.Opcode != WRFetchAdd) || w.acked {
		e.drop(DropStaleResponse)
		return
	}
	e.acknowledge(q, psn.Add(-1), now)
	var v [8]byte
	putUint64Native(v[:], p.AtomicAckETH().Orig())
	if err := e.scatter(q.pd, w.sgl, 0, v[:]); err != nil {
		e.failWQE(q, w, WCLocProtErr)
		return
	}
	e.finishResponse(q, w, psn, now)
}
