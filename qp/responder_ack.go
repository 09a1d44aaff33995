package qp

import (
	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/reth"
)

// sendAck sends an ACK or NAK with the given syndrome and PSN.
func (e *Engine) sendAck(q *QP, syn reth.Syndrome, psn bth.PSN) {
	buf, p := e.header(q, bth.RCAck, psn, 0, false, false, q.attr.DestQPN)
	p.AETH().Set(syn, q.resp.msn)
	e.emit(q, buf, q.attr.Dest, e.cfg.DataTOS)
	if syn.Kind() != reth.KindACK {
		e.Stats.NAKsSent.Add(1)
	}
}

// queueAck arranges for an ACK of psn at the end of the batch: one ACK
// answers every AckReq of a batch (coalescing).
func (e *Engine) queueAck(q *QP, psn bth.PSN) {
	rs := &q.resp
	if rs.ackPending {
		e.Stats.AckDeferred.Add(1)
		if psn.After(rs.ackPSN) {
			rs.ackPSN = psn
		}
		return
	}
	rs.ackPending, rs.ackPSN = true, psn
	e.ackList = append(e.ackList, q)
}

func (e *Engine) flushAcks() { e.flushAcksBut(nil) }

// flushAcksBut sends the pending ACKs of every QP but keep, whose ACK
// stays pending.
func (e *Engine) flushAcksBut(keep *QP) {
	kept := false
	for _, q := range e.ackList {
		if q == keep {
			kept = true
			continue
		}
		if q.resp.ackPending && !q.destroyed && q.state != Err {
			e.sendAck(q, reth.ACKSyndrome(reth.CreditsInvalid), q.resp.ackPSN)
		}
		q.resp.ackPending = false
	}
	clear(e.ackList)
	e.ackList = e.ackList[:0]
	if kept {
		e.ackList = append(e.ackList, keep)
	}
}
