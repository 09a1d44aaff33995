package qp

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/reth"
)

// respondRC runs an RC request through the responder's steps, named and
// ordered as in rxe's rxe_resp.c: checkPSN, then checkRequest's checks,
// then execute. Each check either passes the packet on or has answered it
// (NAK, RNR NAK, duplicate reply or drop); execute carries out what passed
// and acknowledges it.
func (e *Engine) respondRC(q *QP, in *InPacket, now time.Duration) {
	p := in.Pkt
	psn := p.BTH().PSN()
	if e.checkPSN(q, p, psn, now) && e.checkRequest(q, p, psn) {
		e.execute(q, p, psn, now)
	}
}

// checkRequest runs the checks after the PSN's, which RC and UC share:
// checkOpSeq, checkOpValid, checkLength, checkResource, checkRKey.
func (e *Engine) checkRequest(q *QP, p bth.Packet, psn bth.PSN) bool {
	return e.checkOpSeq(q, p.Info, psn) &&
		e.checkOpValid(q, p.Info, psn) &&
		e.checkLength(q, p, psn) &&
		e.checkResource(q, p, psn) &&
		e.checkRKey(q, p, psn)
}

// checkPSN (rxe's check_psn) passes the request with the expected PSN. A
// later one means requests were lost: one sequence-error NAK per gap. An
// earlier one is a duplicate, answered without executing it again. While
// a long READ response goes out, a READ in sequence queues behind it;
// anything else would have to wait behind it, so it is dropped, and the
// requester resends it after the NAK that follows the responses.
func (e *Engine) checkPSN(q *QP, p bth.Packet, psn bth.PSN, now time.Duration) bool {
	rs := &q.resp
	d := psn.Diff(rs.ePSN)
	switch {
	case d >= 0 && rs.rd.active:
		if d == 0 && e.queueRead(q, p, psn) {
			return false
		}
		rs.rd.nakAfter = true
		e.drop(DropBusy)
	case d > 0:
		e.Stats.OutOfSeqRequest.Add(1)
		if !rs.nakSent {
			rs.nakSent = true
			e.sendAck(q, reth.NAKSyndrome(reth.NAKPSNSeqError), rs.ePSN)
		}
		e.drop(DropOutOfSequence)
	case d < 0:
		e.Stats.DuplicateRequest.Add(1)
		e.duplicate(q, p, psn, now)
	default:
		return true
	}
	return false
}

// checkOpSeq (rxe's check_op_seq): a message in progress takes MIDDLE or
// LAST of its own kind; otherwise only FIRST or ONLY may come. On UC a
// FIRST or ONLY gives up whatever message came before it, and the rest of
// a damaged message is dropped.
func (e *Engine) checkOpSeq(q *QP, info *bth.Info, psn bth.PSN) bool {
	rs := &q.resp
	if q.typ == UC && info.Has(bth.First) {
		rs.ucDrop, rs.inMsg = false, false
	}
	inSeq := info.Has(bth.First)
	if rs.inMsg {
		inSeq = info.Op == rs.msgOp && !info.Has(bth.First)
	}
	if !inSeq || rs.ucDrop {
		e.refuse(q, reth.NAKInvalidRequest, DropWrongOpcode, psn)
		return false
	}
	return true
}

// checkOpValid (rxe's check_op_valid): the QP's access flags permit the
// operation.
func (e *Engine) checkOpValid(q *QP, info *bth.Info, psn bth.PSN) bool {
	if !q.allows(info.Op) {
		e.refuse(q, reth.NAKInvalidRequest, DropBadAccess, psn)
		return false
	}
	return true
}

// checkLength (rxe's check_length): a payload fits the path MTU, and a
// SEND or WRITE packet that does not end its message fills it. (The
// 2^31-byte limit of a READ or WRITE is checked with its rkey, after the
// receive WQE a WRITE with immediate needs, as before.)
func (e *Engine) checkLength(q *QP, p bth.Packet, psn bth.PSN) bool {
	info, n := p.Info, len(p.Payload())
	if n > q.mtu || (info.Op == bth.OpSend || info.Op == bth.OpWrite) && !info.Has(bth.Last) && n != q.mtu {
		e.refuse(q, reth.NAKInvalidRequest, DropBadLength, psn)
		return false
	}
	return true
}

// checkResource (rxe's check_resource): READ, atomics, ATOMIC WRITE and
// FLUSH need responder resources; with max_dest_rd_atomic 0 they are
// refused with an Invalid Request NAK, as rxe refuses READ and atomics
// (RESPST_ERR_TOO_MANY_RDMA_ATM_REQ). The first packet of a SEND and a
// WRITE with immediate need a receive WQE: without one the packet is
// refused before anything changes (rxe checks resources before the rkey),
// so its retry finds the responder as it was.
func (e *Engine) checkResource(q *QP, p bth.Packet, psn bth.PSN) bool {
	rs, info := &q.resp, p.Info
	if usesResource(info.Op) && q.attr.MaxDestRdAtomic == 0 {
		e.refuse(q, reth.NAKInvalidRequest, DropOther, psn)
		return false
	}
	needRecv := info.Op == bth.OpSend && info.Has(bth.First) || info.Op == bth.OpWrite && info.Has(bth.Imm)
	if needRecv && !rs.haveRecv {
		w, ok := q.takeRecv()
		if !ok {
			e.noRecv(q, psn)
			return false
		}
		rs.recv, rs.haveRecv = w, true
	}
	return true
}

// checkRKey (rxe's check_rkey): the first packet of a WRITE and a READ
// name remote memory, which must be at most 2^31 bytes and which the rkey
// must grant; the WRITE's target is kept for the packets that follow.
// Atomics, ATOMIC WRITE and FLUSH check theirs as they execute: for the
// atomics the check yields the word they work on.
func (e *Engine) checkRKey(q *QP, p bth.Packet, psn bth.PSN) bool {
	var err error
	switch {
	case p.Info.Op == bth.OpWrite && p.Info.Has(bth.First):
		err = e.checkWrite(q, p)
	case p.Info.Op == bth.OpReadRequest:
		err = e.checkRead(q, p)
	}
	switch {
	case err == nil:
		return true
	case errors.Is(err, errTooLong):
		e.refuse(q, reth.NAKInvalidRequest, DropBadLength, psn)
	default:
		e.accessError(q, err, psn)
	}
	return false
}

// execute carries out a request that passed every check and answers it:
// an ACK when asked for, READ responses, an atomic's result.
func (e *Engine) execute(q *QP, p bth.Packet, psn bth.PSN, now time.Duration) {
	switch p.Info.Op {
	case bth.OpSend, bth.OpWrite:
		if e.place(q, p, psn) {
			e.advance(q, p, psn)
		}
	case bth.OpReadRequest:
		r := e.takeRead(q, p, psn)
		e.sendReadResponses(q, r.psn, r.va, r.rkey, r.n, now)
	case bth.OpCompareSwap, bth.OpFetchAdd:
		e.recvAtomic(q, p, psn)
	case bth.OpAtomicWrite, bth.OpFlush:
		e.recvAtomicWriteOrFlush(q, p, psn)
	}
}

// advance moves past an executed request packet and acknowledges it when
// the requester asked.
func (e *Engine) advance(q *QP, p bth.Packet, psn bth.PSN) {
	rs := &q.resp
	rs.ePSN = psn.Next()
	rs.nakSent = false
	if p.BTH().AckReq() {
		e.queueAck(q, psn)
	}
}

func (e *Engine) recvAtomic(q *QP, p bth.Packet, psn bth.PSN) {
	rs := &q.resp
	a := p.AtomicETH()
	w, err := e.cfg.MRs.Atomic64QP(a.RKey(), q.pd, q.id, a.VA(), mr.RemoteAtomic)
	if err != nil {
		e.accessError(q, err, psn)
		return
	}
	var orig uint64
	if p.Info.Op == bth.OpCompareSwap {
		orig = w.CompareSwap(a.Compare(), a.SwapAdd())
	} else {
		orig = w.FetchAdd(a.SwapAdd())
	}
	e.Stats.RDMARecvs.Add(1)
	rs.saveResource(resource{op: p.Info.Op, firstPSN: psn, lastPSN: psn, orig: orig})
	rs.msn++
	rs.ePSN = psn.Next()
	rs.nakSent = false
	e.sendAtomicAck(q, psn, orig)
}

func (e *Engine) sendAtomicAck(q *QP, psn bth.PSN, orig uint64) {
	buf, p := e.header(q, bth.RCAtomicAck, psn, 0, false, false, q.attr.DestQPN)
	p.AETH().Set(reth.ACKSyndrome(reth.CreditsInvalid), q.resp.msn)
	p.AtomicAckETH().SetOrig(orig)
	e.emit(q, buf, q.attr.Dest, e.cfg.DataTOS)
}

// recvAtomicWriteOrFlush executes an ATOMIC WRITE or a FLUSH; both are
// answered with an empty READ RESPONSE ONLY, as rxe does.
func (e *Engine) recvAtomicWriteOrFlush(q *QP, p bth.Packet, psn bth.PSN) {
	rs := &q.resp
	h := p.RETH()
	if p.Info.Op == bth.OpAtomicWrite {
		w, err := e.cfg.MRs.Atomic64QP(h.RKey(), q.pd, q.id, h.VA(), mr.RemoteWrite)
		if err != nil {
			e.accessError(q, err, psn)
			return
		}
		// The payload's bytes land in memory as they are (rxe memcpy's them).
		w.Store(binary.NativeEndian.Uint64(p.Payload()))
	} else if h.DMALen() > 0 {
		// Go memory is always globally visible; the check is what matters.
		if _, err := e.cfg.MRs.RemoteQP(h.RKey(), q.pd, q.id, h.VA(), h.DMALen(), mr.RemoteWrite); err != nil {
			e.accessError(q, err, psn)
			return
		}
	}
	e.Stats.RDMARecvs.Add(1)
	rs.saveResource(resource{op: p.Info.Op, firstPSN: psn, lastPSN: psn})
	rs.msn++
	rs.ePSN = psn.Next()
	rs.nakSent = false
	e.sendEmptyReadResponse(q, psn)
}

func (e *Engine) sendEmptyReadResponse(q *QP, psn bth.PSN) {
	buf, p := e.header(q, bth.RCReadResponseOnly, psn, 0, false, false, q.attr.DestQPN)
	p.AETH().Set(reth.ACKSyndrome(reth.CreditsInvalid), q.resp.msn)
	e.emit(q, buf, q.attr.Dest, e.cfg.DataTOS)
}

// duplicate answers a request whose PSN is before the expected one
// (IBA C9-105): SEND and WRITE are acknowledged again, READs replayed from
// memory, atomics answered from the saved result without executing again.
func (e *Engine) duplicate(q *QP, p bth.Packet, psn bth.PSN, now time.Duration) {
	rs := &q.resp
	switch p.Info.Op {
	case bth.OpSend, bth.OpWrite:
		e.queueAck(q, rs.ePSN.Add(-1))
	case bth.OpReadRequest:
		r := rs.findResource(psn)
		if r == nil || r.op != bth.OpReadRequest || rs.rd.toSend(psn) {
			e.drop(DropDuplicate) // unknown, or its responses are still to go
			return
		}
		h := p.RETH()
		va, n := h.VA(), h.DMALen()
		// The retry asks for the tail of the original range, from the
		// response PSN it names, with the same rkey (as rxe requires).
		skip := uint64(psn.Diff(r.firstPSN)) * uint64(q.mtu)
		if h.RKey() != r.rkey || va != r.va+skip || uint64(n)+skip != uint64(r.length) && !(r.length == 0 && n == 0) {
			e.drop(DropDuplicate)
			return
		}
		if r.batch == e.inputs {
			// It came in the batch that brought the READ itself: the
			// requester asked again before a response could reach it
			// (both sat in this socket past its timer), so the
			// responses just sent are not lost. Replayed, they would
			// go twice, and the copy would be taken for a loss that
			// slows the QP's READs for a while (readPace.lost).
			e.drop(DropDuplicate)
			return
		}
		if rd := &rs.rd; rd.active && !psn.Before(rd.psn.Add(rd.npk)) {
			// A READ after the one going out, which a restart took off
			// the queue: it joins the queue again (the requester resends
			// the READs after a lost response in order).
			if len(rd.pending)+1 >= max(rs.resSlots, 1) {
				e.drop(DropDuplicate)
				return
			}
			rd.pending = append(rd.pending, readReq{psn: psn, va: va, rkey: r.rkey, n: n, npk: packetsFor(n, q.mtu), msn: rs.msn})
			return
		}
		// The requester asks again: responses from psn on were lost.
		rs.rp.lost(psn, now, q.mtu)
		e.sendReadResponses(q, psn, va, r.rkey, n, now)
	case bth.OpCompareSwap, bth.OpFetchAdd:
		r := rs.findResource(psn)
		if r == nil || r.op != p.Info.Op || r.firstPSN != psn {
			e.drop(DropDuplicate)
			return
		}
		e.sendAtomicAck(q, psn, r.orig)
	case bth.OpAtomicWrite, bth.OpFlush:
		r := rs.findResource(psn)
		if r == nil || r.op != p.Info.Op {
			e.drop(DropDuplicate)
			return
		}
		e.sendEmptyReadResponse(q, psn)
	default:
		e.drop(DropDuplicate)
	}
}
