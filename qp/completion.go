package qp

// enterError moves the QP to ERR: timers stop and all outstanding work
// completes with WR_FLUSH_ERR.
func (q *QP) enterError() {
	q.state = Err
	q.errored.Store(true) // before the RQ flush; see PostRecv
	q.e.cancel(q, timerRetransmit)
	q.e.cancel(q, timerRNR)
	if q.cc != nil {
		// Nothing will be sent: the rate timer lapses (ccTimer), and
		// ccAdmit catches the controller up should the QP send again.
		q.e.cancel(q, timerCC)
		q.cc.lapsed = true
	}
	q.flushSQ()
	q.flushRQ()
}

func (q *QP) flushSQ() {
	for q.sqHead != q.sqTail {
		w := &q.sq[q.sqHead%uint64(len(q.sq))]
		if !w.done {
			w.status = WCWRFlushErr
		}
		q.retire(true)
	}
	q.sqSend = q.sqHead
}

// retire takes the head WQE off the send queue and reports its
// completion. The head moves first: a completion that overruns the CQ
// moves the QP to ERR, whose flush must start after this WQE.
func (q *QP) retire(flushed bool) {
	w := q.wqe(q.sqHead)
	q.e.releaseWQE(q, w)
	q.sqHead++
	q.completeSend(w, flushed)
}

func (q *QP) flushRQ() {
	if q.srq != nil {
		return // SRQ WQEs belong to no QP
	}
	for _, w := range q.rq.drain() {
		q.e.Stats.FlushedWorkRequests.Add(1)
		q.pushWC(q.recvCQ, WC{ID: w.id, Status: WCWRFlushErr, Opcode: WCRecv, QPN: q.num})
	}
}

func (q *QP) pushWC(cq *CQ, wc WC) {
	if wc.Status == WCSuccess && wc.Opcode >= WCRecv {
		// On RoCE every packet has an IP header, the GRH's stand-in:
		// rxe's responder (do_complete) flags every successful receive
		// completion, whatever the QP type.
		wc.Flags |= WCWithGRH
	}
	q.e.Stats.CompletionsGenerated.Add(1)
	ok, woke := cq.pushWoke(wc)
	q.e.pushed = true
	if woke {
		q.e.woke = true
	}
	if !ok {
		// A CQ overrun is fatal to the QP, as on an RNIC.
		if q.state != Err {
			q.enterError()
		}
	}
}

// wcOpcodeOf maps a send opcode to its completion opcode.
func wcOpcodeOf(op WROpcode) WCOpcode {
	switch op {
	case WRWrite, WRWriteImm:
		return WCWrite
	case WRRead:
		return WCRead
	case WRCompareSwap:
		return WCCompareSwap
	case WRFetchAdd:
		return WCFetchAdd
	case WRLocalInv:
		return WCLocalInv
	case WRBindMW:
		return WCBindMW
	case WRAtomicWrite:
		return WCAtomicWrite
	case WRFlush:
		return WCFlush
	}
	return WCSend
}

// completeSend generates the completion of a finished send WQE, if one is
// due: always on error, on success only when signaled.
func (q *QP) completeSend(w *sendWQE, flushed bool) {
	if flushed && w.status == WCWRFlushErr {
		q.e.Stats.FlushedWorkRequests.Add(1)
	}
	if w.status == WCSuccess && !w.signaled {
		return
	}
	wc := WC{ID: w.wr.ID, Status: w.status, Opcode: wcOpcodeOf(w.wr.Opcode), QPN: q.num}
	if w.status == WCSuccess {
		switch w.wr.Opcode {
		case WRRead, WRCompareSwap, WRFetchAdd:
			wc.ByteLen = w.length
		}
	}
	q.pushWC(q.sendCQ, wc)
}
