package qp

import (
	"errors"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/reth"
)

// place puts the payload of a SEND or WRITE packet where it belongs, for
// RC and UC alike, and reports whether it did; when it did not, the
// packet has been refused (refuse, recvFault).
func (e *Engine) place(q *QP, p bth.Packet, psn bth.PSN) bool {
	if p.Info.Op == bth.OpSend {
		return e.placeSend(q, p, psn)
	}
	return e.placeWrite(q, p, psn)
}

// placeSend scatters a SEND packet into the receive WQE checkResource
// claimed, and completes the receive at the last packet.
func (e *Engine) placeSend(q *QP, p bth.Packet, psn bth.PSN) bool {
	rs, info := &q.resp, p.Info
	if info.Has(bth.First) {
		rs.recvOff = 0
		rs.inMsg, rs.msgOp = true, bth.OpSend
	}
	payload := p.Payload()
	if err := e.scatter(q.pd, rs.recv.sgl(), rs.recvOff, payload); err != nil {
		reason := DropOther
		if errors.Is(err, errLength) {
			reason = DropBadLength
		}
		e.recvFault(q, reason, psn)
		return false
	}
	rs.recvOff += uint32(len(payload))
	e.Stats.RcvdBytes.Add(uint64(len(payload)))
	if info.Has(bth.Last) {
		wc := WC{ID: rs.recv.id, Opcode: WCRecv, ByteLen: rs.recvOff, QPN: q.num, SrcQP: q.attr.DestQPN}
		if h := p.ImmDt(); h != nil {
			wc.Imm, wc.Flags = h.Imm(), wc.Flags|WCWithImm
		}
		if h := p.IETH(); h != nil {
			if err := e.cfg.MRs.Invalidate(h.RKey(), q.pd); err != nil {
				e.refuse(q, reth.NAKInvalidRequest, DropBadAccess, psn)
				return false
			}
			wc.InvalidatedRKey, wc.Flags = h.RKey(), wc.Flags|WCWithInv
		}
		rs.haveRecv, rs.inMsg = false, false
		rs.msn++
		q.pushWC(q.recvCQ, wc)
	}
	return true
}

// checkWrite is checkRKey for the first packet of a WRITE: it notes the
// target, checks its length and, unless it is empty, the rkey.
func (e *Engine) checkWrite(q *QP, p bth.Packet) error {
	rs := &q.resp
	h := p.RETH()
	rs.dmaLen, rs.woff, rs.wbuf = h.DMALen(), 0, nil
	if rs.dmaLen > maxMessage {
		return errTooLong
	}
	if rs.dmaLen > 0 { // IBA C9-88: a zero-length WRITE checks no rkey
		buf, err := e.cfg.MRs.RemoteQP(h.RKey(), q.pd, q.id, h.VA(), rs.dmaLen, mr.RemoteWrite)
		if err != nil {
			return err
		}
		rs.wbuf = buf
	}
	return nil
}

// placeWrite copies a WRITE packet into the target checkWrite found; a
// WRITE with immediate completes the receive WQE checkResource claimed.
func (e *Engine) placeWrite(q *QP, p bth.Packet, psn bth.PSN) bool {
	rs, info := &q.resp, p.Info
	payload := p.Payload()
	if info.Has(bth.First) {
		rs.inMsg, rs.msgOp = true, bth.OpWrite
		e.Stats.RDMARecvs.Add(1)
	}
	if uint64(rs.woff)+uint64(len(payload)) > uint64(rs.dmaLen) ||
		info.Has(bth.Last) && rs.woff+uint32(len(payload)) != rs.dmaLen {
		e.refuse(q, reth.NAKInvalidRequest, DropBadLength, psn)
		return false
	}
	copy(rs.wbuf[rs.woff:], payload)
	rs.woff += uint32(len(payload))
	e.Stats.RcvdBytes.Add(uint64(len(payload)))
	if info.Has(bth.Last) {
		rs.inMsg = false
		rs.msn++
		if info.Has(bth.Imm) {
			rs.haveRecv = false
			q.pushWC(q.recvCQ, WC{ID: rs.recv.id, Opcode: WCRecvRDMAImm, ByteLen: rs.dmaLen, Imm: p.ImmDt().Imm(),
				Flags: WCWithImm, QPN: q.num, SrcQP: q.attr.DestQPN})
		}
		rs.wbuf = nil
	}
	return true
}
