package qp

// The responder is the receive side of a QP, split by concern:
//
//   - responder.go: its state, dispatch by QP type, responder resources,
//     and how a refused request is answered (NAK on RC, drop on UC);
//   - responder_rc.go: the RC pipeline in rxe's named steps (checkPSN,
//     checkOpSeq, checkOpValid, checkLength, checkResource, checkRKey,
//     execute) and duplicates;
//   - responder_place.go: placing SEND and WRITE payloads, shared by RC
//     and UC;
//   - responder_uc.go, responder_ud.go: what differs for UC and UD;
//   - responder_read.go: the READ response stream and its pacing;
//   - responder_ack.go: ACKs and their coalescing.

import (
	"errors"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/reth"
)

// responder is the receive side of a QP.
type responder struct {
	ePSN    bth.PSN // next PSN expected
	msn     uint32
	nakSent bool // a sequence-error NAK was sent for the current gap
	// ackPending: an ACK of ackPSN is owed (next to ePSN: every request
	// reads both, and with thousands of QPs each line is a cache miss).
	ackPending bool
	ackPSN     bth.PSN

	inMsg    bool // a multi-packet message is in progress
	msgOp    bth.Op
	recv     recvWQE // the receive WQE a SEND is filling
	haveRecv bool
	recvOff  uint32
	wbuf     []byte // the target of an RDMA WRITE
	woff     uint32
	dmaLen   uint32
	ucDrop   bool // UC: dropping the rest of a damaged message

	res      []resource // READ/atomic results kept for duplicates
	resNext  int
	resSlots int // len(res) once allocated

	rd readStream // a long READ response going out
	rp readPace   // the pace of READ responses, once a requester lost some
}

// resource remembers an executed READ, atomic, ATOMIC WRITE or FLUSH so a
// duplicate request is answered without executing it again (IBA C9-105).
type resource struct {
	op       bth.Op
	firstPSN bth.PSN
	lastPSN  bth.PSN
	va       uint64
	rkey     uint32
	length   uint32
	orig     uint64
	valid    bool
	batch    uint64 // the input batch that brought the request (Engine.inputs)
}

func (rs *responder) init(q *QP) {
	rs.ePSN = bth.PSN(q.attr.RQPSN)
	n := int(q.attr.MaxDestRdAtomic)
	if n == 0 {
		n = 1
	}
	// At least 16 slots, so duplicates of recent operations stay answerable
	// even when the peer runs with a small max_dest_rd_atomic. They are
	// allocated by the first READ or atomic: many QPs never see one.
	rs.res, rs.resNext, rs.resSlots = nil, 0, max(n, 16)
}

func (rs *responder) saveResource(r resource) {
	r.valid = true
	if rs.res == nil {
		rs.res = make([]resource, rs.resSlots)
	}
	rs.res[rs.resNext] = r
	rs.resNext = (rs.resNext + 1) % len(rs.res)
}

func (rs *responder) findResource(psn bth.PSN) *resource {
	for i := range rs.res {
		r := &rs.res[i]
		if r.valid && !psn.Before(r.firstPSN) && !psn.After(r.lastPSN) {
			return r
		}
	}
	return nil
}

// receive dispatches one received packet.
func (e *Engine) receive(in *InPacket, now time.Duration) {
	p := in.Pkt
	e.Stats.RcvdPkts.Add(1)
	b := p.BTH()
	if b.PKey()&0x7fff != 0x7fff {
		e.drop(DropBadPKey)
		return
	}
	q := e.qps.get(b.DestQP())
	if q == nil {
		if e.recentlyClosed(b.DestQP(), now) {
			e.drop(DropClosedQP)
		} else {
			e.drop(DropUnknownQP)
		}
		return
	}
	// A connected QP hears only its peer: a CNP or a CE mark from anyone
	// else must not slow it down, nor make it send CNPs to a stranger.
	if q.typ != UD && q.attr.Dest.IsValid() && q.attr.Dest.Addr() != in.Src.Addr() {
		e.drop(DropWrongSource)
		return
	}
	if p.Info.Class == bth.CNP {
		e.ccCNP(q, e.arrival(now), now)
		return
	}
	if p.Info.Class != q.typ.class() {
		e.drop(DropWrongOpcode)
		return
	}
	if in.TOS&3 == 3 {
		src := q.attr.DestQPN
		if d := p.DETH(); d != nil {
			src = d.SrcQP()
		}
		e.ccMarked(q, in, src, now)
	}
	if p.Info.Flags&bth.Response != 0 {
		e.complete(q, in, now)
		return
	}
	if q.state != RTR && q.state != RTS && q.state != SQD && q.state != SQE {
		e.drop(DropBadState) // rxe drops requests that arrive before RTR
		return
	}
	switch q.typ {
	case RC:
		e.respondRC(q, in, now)
	case UC:
		e.respondUC(q, in)
	case UD:
		e.respondUD(q, in)
	}
}

// usesResource reports whether a request takes a responder resource
// (max_dest_rd_atomic): it is answered by a response, not an ACK.
func usesResource(op bth.Op) bool {
	switch op {
	case bth.OpReadRequest, bth.OpCompareSwap, bth.OpFetchAdd, bth.OpAtomicWrite, bth.OpFlush:
		return true
	}
	return false
}

// allows reports whether the QP's access flags permit a remote operation.
func (q *QP) allows(op bth.Op) bool {
	a := q.attr.AccessFlags
	switch op {
	case bth.OpWrite, bth.OpAtomicWrite:
		return a&mr.RemoteWrite != 0
	case bth.OpReadRequest:
		return a&mr.RemoteRead != 0
	case bth.OpCompareSwap, bth.OpFetchAdd:
		return a&mr.RemoteAtomic != 0
	}
	return true
}

// maxMessage is the longest message (2^31 bytes, as rxe advertises);
// a longer RDMA length is an invalid request (rxe's check_length).
const maxMessage = 1 << 31

// classCError NAKs a request the responder cannot execute and moves the
// QP to ERR, as rxe does for invalid requests and access violations (class
// C) and for a receive WQE it cannot use (class A, NAK remote operational
// error); the request is counted as dropped for reason.
func (e *Engine) classCError(q *QP, code uint8, reason DropReason, psn bth.PSN) {
	switch code {
	case reth.NAKRemoteAccess:
		e.Stats.RemoteAccessNAKs.Add(1)
	case reth.NAKInvalidRequest:
		e.Stats.InvalidRequestNAKs.Add(1)
	}
	e.drop(reason)
	q.resp.stopRead()
	e.sendAck(q, reth.NAKSyndrome(code), psn)
	if q.resp.haveRecv {
		// The WQE a failed SEND or WRITE with immediate had taken
		// completes with the error, as in rxe.
		st := WCRemInvReqErr
		switch code {
		case reth.NAKRemoteAccess:
			st = WCRemAccessErr
		case reth.NAKRemoteOp:
			st = WCLocQPOpErr // rxe's class A: the receive was at fault
		}
		q.resp.haveRecv = false
		q.pushWC(q.recvCQ, WC{ID: q.resp.recv.id, Status: st, Opcode: WCRecv, QPN: q.num})
	}
	q.enterError()
}

// accessError refuses (refuse) a request whose key, bounds or alignment
// check failed with err (from package mr): a misaligned atomic is an
// invalid request, anything else a remote access error.
func (e *Engine) accessError(q *QP, err error, psn bth.PSN) {
	switch {
	case errors.Is(err, mr.ErrMisaligned):
		e.refuse(q, reth.NAKInvalidRequest, DropMisaligned, psn)
	case errors.Is(err, mr.ErrOutOfBounds):
		e.refuse(q, reth.NAKRemoteAccess, DropOutOfBounds, psn)
	default:
		e.refuse(q, reth.NAKRemoteAccess, DropBadAccess, psn)
	}
}

// refuse answers a request that fails a check. RC NAKs it with code and
// moves the QP to ERR (classCError); UC, which has no NAKs, drops the
// packet and the rest of its message (rxe's drop_msg).
func (e *Engine) refuse(q *QP, code uint8, reason DropReason, psn bth.PSN) {
	if q.typ == UC {
		q.resp.ucDrop, q.resp.inMsg = true, false
		e.drop(reason)
		return
	}
	e.classCError(q, code, reason, psn)
}

// noRecv answers a SEND or WRITE with immediate that finds no receive
// WQE. RC sends an RNR NAK: the requester waits its RNR timer and sends
// the packet again, finding the responder as it was. UC drops the message.
func (e *Engine) noRecv(q *QP, psn bth.PSN) {
	if q.typ == UC {
		e.refuse(q, 0, DropNoRecvWQE, psn)
		return
	}
	e.Stats.SendRNRErr.Add(1)
	e.drop(DropNoRecvWQE)
	e.sendAck(q, reth.RNRSyndrome(q.attr.MinRNRTimer), psn)
}

// recvFault answers a SEND its receive WQE cannot take: a message longer
// than the receive, or a receive buffer that fails its lkey check. rxe's
// copy_data fails with -EINVAL for both, which send_data_in reports as a
// malformed WQE: RC NAKs remote operational error (class A; the receive
// completes LOC_QP_OP_ERR, 6.1 and 6.12 alike). UC completes the receive
// LOC_LEN_ERR and drops the rest of the message.
func (e *Engine) recvFault(q *QP, reason DropReason, psn bth.PSN) {
	rs := &q.resp
	if q.typ == UC {
		rs.haveRecv, rs.inMsg, rs.ucDrop = false, false, true
		q.pushWC(q.recvCQ, WC{ID: rs.recv.id, Status: WCLocLenErr, Opcode: WCRecv, QPN: q.num})
		return
	}
	e.classCError(q, reth.NAKRemoteOp, reason, psn)
}
