package qp

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/congestion"
	"github.com/rxego/rxego/internal/iphdr"
	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/reth"
)

// responder is the receive side of a QP.
type responder struct {
	ePSN    bth.PSN // next PSN expected
	msn     uint32
	nakSent bool // a sequence-error NAK was sent for the current gap

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

	ackPending bool
	ackPSN     bth.PSN

	rd readStream // a long READ response going out
	rp readPace   // the pace of READ responses, once a requester lost some
}

// readPace paces a QP's READ responses. READ responses are not
// acknowledged, so a responder learns that they overran the requester
// only when it asks again (the re-issued READ names the first response it
// lacks). Unpaced, a long READ response leaves as fast as the engine runs
// (readBurst packets a turn); a slow peer (rxe in a TCG guest: about 40%
// of the packets of ib_read_bw -a arrived) drops most of it and asks
// again and again. So each re-issued READ sets a rate: what arrived since
// the stream (re)started over the time it took, less a quarter, and at
// most half the rate before (at least minReadRate). Every readPaceStep of
// paced sending the rate grows: by a quarter up to the rate that last
// lost packets, by 1/128 beyond it (doubling in about 90 ms: a requester
// learns of a loss only a round trip and a queue later, and every
// response sent meanwhile is sent again); past DefaultLineRate the
// responses go unpaced again. rxe's responder has the same need met by its own
// slowness (one packet per state-machine pass, its transmit queue pushing
// back).
type readPace struct {
	pacer congestion.Pacer
	rate  uint64        // bits/s; 0: unpaced
	t0    time.Duration // when the responses from psn0 began
	psn0  bth.PSN
	step  time.Duration // when the rate last changed
	ceil  uint64        // the rate that last lost packets
}

// minReadRate is the slowest a READ response is paced; readPaceStep is
// how often a paced rate grows without a loss (by a quarter it doubles in
// about 3 ms, so an estimate that came out low costs little).
const (
	minReadRate  = 10 * congestion.Mbps
	readPaceStep = time.Millisecond
)

// start notes that responses from psn begin now.
func (rp *readPace) start(psn bth.PSN, now time.Duration) { rp.t0, rp.psn0 = now, psn }

// wake returns when a paced stream should next send: once half a burst
// may leave, so that packets go out several to a system call.
func (rp *readPace) wake(now time.Duration) time.Duration {
	return now + rp.pacer.Delay(now) + time.Duration(uint64(congestion.DefaultBurst/2)*8e9/rp.rate) + 1
}

// lost adjusts the pace to a requester that asks again from psn, having
// received the responses before it.
func (rp *readPace) lost(psn bth.PSN, now time.Duration, mtu int) {
	var est uint64
	if got, dt := psn.Diff(rp.psn0), now-rp.t0; got > 0 && dt > 0 {
		est = uint64(got) * uint64(mtu+wireOverhead) * 8 * uint64(time.Second) / uint64(dt) * 3 / 4
	}
	r := est
	switch {
	case rp.rate != 0 && (est == 0 || est > rp.rate/2):
		r = rp.rate / 2
	case rp.rate == 0 && est == 0:
		r = congestion.Gbps
	}
	rp.ceil = max(rp.rate, est*4/3)
	if rp.ceil == 0 {
		rp.ceil = 2 * congestion.Gbps
	}
	rp.setRate(max(r, minReadRate), now)
}

// grow speeds a paced stream up every readPaceStep.
func (rp *readPace) grow(now time.Duration) {
	if rp.rate == 0 || now-rp.step < readPaceStep {
		return
	}
	if rp.rate < rp.ceil*7/8 {
		rp.setRate(min(rp.rate+rp.rate/4, rp.ceil*7/8), now)
	} else {
		rp.setRate(rp.rate+rp.rate/128, now)
	}
}

func (rp *readPace) setRate(r uint64, now time.Duration) {
	if r >= DefaultLineRate {
		rp.rate = 0
		return
	}
	if rp.rate == 0 {
		rp.pacer = congestion.NewPacer(DefaultLineRate, congestion.DefaultBurst)
	}
	rp.rate, rp.step = r, now
	rp.pacer.SetRate(now, r)
}

// readBurst is the most READ response packets a QP sends per engine turn.
// A READ may ask for 2^31 bytes: two million packets at MTU 1024. Sent in
// one go they would hold the engine, and every other QP with it, for
// seconds; sent a burst per turn, the engine serves everything else in
// between, as rxe's responder task yields between packets.
const readBurst = 256

// readStream is a READ response the responder sends a burst at a time. A
// QP has at most one going out. READ requests that arrive meanwhile, in
// sequence, are accepted and queued (pending) up to the responder's
// resources, and their responses follow in PSN order, as rxe's responder
// takes queued requests one after another: a requester that keeps several
// long READs outstanding (perftest's ib_read_bw) is not made to resend
// them. Other requests (and READs beyond the queue) are dropped and
// answered, once the responses are out, with a sequence-error NAK for the
// first of them, so the requester resends them: their ACKs must not pass
// the READ responses. A duplicate READ for a range already sent restarts
// the stream where the requester asks (rxe does the same), so duplicates
// cannot multiply the traffic; one for a range still to be sent is
// dropped, and one for a later READ the restart dropped from the queue
// joins the queue again.
type readStream struct {
	active   bool
	psn      bth.PSN // PSN of the first response
	va       uint64  // address of the first byte
	rkey     uint32
	n        uint32 // bytes in all
	npk      int    // packets in all
	next     int    // index of the next packet to send
	msn      uint32 // MSN the responses carry
	nakAfter bool   // new requests were dropped meanwhile
	pending  []readReq
}

// readReq is an accepted READ request whose responses wait for the
// stream before it.
type readReq struct {
	psn  bth.PSN // PSN of its first response
	va   uint64
	rkey uint32
	n    uint32
	npk  int
	msn  uint32
}

// toSend reports whether the response with PSN psn is still to be sent:
// at or after the stream's next packet, or in a queued READ.
func (rd *readStream) toSend(psn bth.PSN) bool {
	if !rd.active {
		return false
	}
	if !psn.Before(rd.psn.Add(rd.next)) && psn.Before(rd.psn.Add(rd.npk)) {
		return true
	}
	for _, r := range rd.pending {
		if !psn.Before(r.psn) && psn.Before(r.psn.Add(r.npk)) {
			return true
		}
	}
	return false
}

// queueRead accepts a READ request that arrives, in sequence, while q's
// READ stream goes out, and queues its responses behind it. It reports
// false, leaving the request to be dropped and resent, for anything else:
// another opcode, a full queue, or a READ that would fail its checks (the
// NAK for it must not pass the responses before it).
func (e *Engine) queueRead(q *QP, p bth.Packet, psn bth.PSN) bool {
	rs := &q.resp
	if p.Info.Op != bth.OpReadRequest || rs.inMsg || !q.allows(bth.OpReadRequest) ||
		q.attr.MaxDestRdAtomic == 0 || len(rs.rd.pending)+1 >= max(rs.resSlots, 1) {
		return false
	}
	if e.checkRead(q, p) != nil {
		return false
	}
	rs.rd.pending = append(rs.rd.pending, e.takeRead(q, p, psn))
	return true
}

// errReadTooLong is checkRead's verdict on a READ longer than 2^31 bytes.
var errReadTooLong = errors.New("qp: READ longer than 2^31 bytes")

// checkRead checks a READ request's length and its access to the
// target memory, returning the MR check's error or errReadTooLong.
func (e *Engine) checkRead(q *QP, p bth.Packet) error {
	h := p.RETH()
	n := h.DMALen()
	if n > maxMessage {
		return errReadTooLong
	}
	if n > 0 {
		if _, err := e.cfg.MRs.RemoteQP(h.RKey(), q.pd, q.num, h.VA(), n, mr.RemoteRead); err != nil {
			return err
		}
	}
	return nil
}

// takeRead executes a checked READ request: it keeps the READ as a
// responder resource for duplicates, moves the expected PSN past its
// responses and counts the message, and returns the responses to send.
func (e *Engine) takeRead(q *QP, p bth.Packet, psn bth.PSN) readReq {
	rs := &q.resp
	h := p.RETH()
	r := readReq{psn: psn, va: h.VA(), rkey: h.RKey(), n: h.DMALen()}
	r.npk = packetsFor(r.n, q.mtu)
	e.Stats.RDMARecvs.Add(1)
	rs.saveResource(resource{op: bth.OpReadRequest, firstPSN: psn, lastPSN: psn.Add(r.npk - 1), va: r.va, rkey: r.rkey, length: r.n})
	rs.msn++
	r.msn = rs.msn
	rs.ePSN = psn.Add(r.npk)
	rs.nakSent = false
	return r
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
	q, ok := e.qps[b.DestQP()]
	if !ok {
		e.drop(DropUnknownQP)
		return
	}
	// A connected QP hears only its peer: a CNP or a CE mark from anyone
	// else must not slow it down, nor make it send CNPs to a stranger.
	if q.typ != UD && q.attr.Dest.IsValid() && q.attr.Dest.Addr() != in.Src.Addr() {
		e.drop(DropWrongSource)
		return
	}
	if p.Info.Class == bth.CNP {
		e.ccCNP(q, now)
		return
	}
	if !classMatches(q.typ, p.Info.Class) {
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

func classMatches(t Type, c bth.Class) bool {
	switch t {
	case RC:
		return c == bth.RC
	case UC:
		return c == bth.UC
	case UD:
		return c == bth.UD
	}
	return false
}

// sendAck sends an ACK or NAK with the given syndrome and PSN.
func (e *Engine) sendAck(q *QP, syn reth.Syndrome, psn bth.PSN) {
	buf, p := e.header(q, bth.RCAck, psn, 0, false, false, q.attr.DestQPN)
	p.AETH().Set(syn, q.resp.msn)
	e.emit(buf, q.attr.Dest, e.cfg.DataTOS)
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

// accessError refuses a request whose key, bounds or alignment check
// failed with err (from package mr): a misaligned atomic is an invalid
// request, anything else a remote access error.
func (e *Engine) accessError(q *QP, err error, psn bth.PSN) {
	switch {
	case errors.Is(err, mr.ErrMisaligned):
		e.classCError(q, reth.NAKInvalidRequest, DropMisaligned, psn)
	case errors.Is(err, mr.ErrOutOfBounds):
		e.classCError(q, reth.NAKRemoteAccess, DropOutOfBounds, psn)
	default:
		e.classCError(q, reth.NAKRemoteAccess, DropBadAccess, psn)
	}
}

func (e *Engine) respondRC(q *QP, in *InPacket, now time.Duration) {
	p := in.Pkt
	rs := &q.resp
	psn := p.BTH().PSN()
	d := psn.Diff(rs.ePSN)
	if d >= 0 && rs.rd.active {
		// A long READ response is going out. A READ in sequence queues
		// behind it; anything else would have to wait behind it, and the
		// requester resends it after the NAK.
		if d == 0 && e.queueRead(q, p, psn) {
			return
		}
		rs.rd.nakAfter = true
		e.drop(DropBusy)
		return
	}
	if d > 0 {
		e.Stats.OutOfSeqRequest.Add(1)
		if !rs.nakSent {
			rs.nakSent = true
			e.sendAck(q, reth.NAKSyndrome(reth.NAKPSNSeqError), rs.ePSN)
		}
		e.drop(DropOutOfSequence)
		return
	} else if d < 0 {
		e.Stats.DuplicateRequest.Add(1)
		e.duplicate(q, p, psn, now)
		return
	}
	in2 := p.Info
	// Opcode sequence: a message in progress takes MIDDLE or LAST of its
	// own kind; otherwise only FIRST or ONLY may come.
	if rs.inMsg {
		if in2.Op != rs.msgOp || in2.Has(bth.First) {
			e.classCError(q, reth.NAKInvalidRequest, DropWrongOpcode, psn)
			return
		}
	} else if !in2.Has(bth.First) {
		e.classCError(q, reth.NAKInvalidRequest, DropWrongOpcode, psn)
		return
	}
	if !q.allows(in2.Op) {
		e.classCError(q, reth.NAKInvalidRequest, DropBadAccess, psn)
		return
	}
	payload := p.Payload()
	if len(payload) > q.mtu || (in2.Op == bth.OpSend || in2.Op == bth.OpWrite) && !in2.Has(bth.Last) && len(payload) != q.mtu {
		e.classCError(q, reth.NAKInvalidRequest, DropBadLength, psn)
		return
	}
	if usesResource(in2.Op) && q.attr.MaxDestRdAtomic == 0 {
		// No responder resources: READ, atomics, ATOMIC WRITE and FLUSH
		// are refused with an Invalid Request NAK, as rxe refuses READ and
		// atomics (RESPST_ERR_TOO_MANY_RDMA_ATM_REQ).
		e.classCError(q, reth.NAKInvalidRequest, DropOther, psn)
		return
	}
	switch in2.Op {
	case bth.OpSend:
		e.recvSend(q, p, psn)
	case bth.OpWrite:
		e.recvWrite(q, p, psn)
	case bth.OpReadRequest:
		e.recvRead(q, p, psn, now)
	case bth.OpCompareSwap, bth.OpFetchAdd:
		e.recvAtomic(q, p, psn)
	case bth.OpAtomicWrite, bth.OpFlush:
		e.recvAtomicWriteOrFlush(q, p, psn)
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

func (e *Engine) recvSend(q *QP, p bth.Packet, psn bth.PSN) {
	rs := &q.resp
	in := p.Info
	if in.Has(bth.First) {
		if !rs.haveRecv {
			w, ok := q.takeRecv()
			if !ok {
				e.rnrNAK(q, psn)
				return
			}
			rs.recv, rs.haveRecv = w, true
		}
		rs.recvOff = 0
		rs.inMsg, rs.msgOp = true, bth.OpSend
	}
	payload := p.Payload()
	if err := e.scatter(q.pd, rs.recv.sgl(), rs.recvOff, payload); err != nil {
		// A message longer than the receive, or a receive buffer that
		// fails its lkey check: rxe's copy_data fails with -EINVAL for
		// both, which send_data_in reports as a malformed WQE (class A):
		// NAK remote operational error, the receive completes
		// LOC_QP_OP_ERR (6.1 and 6.12 alike).
		reason := DropOther
		if errors.Is(err, errLength) {
			reason = DropBadLength
		}
		e.classCError(q, reth.NAKRemoteOp, reason, psn)
		return
	}
	rs.recvOff += uint32(len(payload))
	e.Stats.RcvdBytes.Add(uint64(len(payload)))
	if in.Has(bth.Last) {
		wc := WC{ID: rs.recv.id, Opcode: WCRecv, ByteLen: rs.recvOff, QPN: q.num, SrcQP: q.attr.DestQPN}
		if h := p.ImmDt(); h != nil {
			wc.Imm, wc.Flags = h.Imm(), wc.Flags|WCWithImm
		}
		if h := p.IETH(); h != nil {
			if err := e.cfg.MRs.Invalidate(h.RKey(), q.pd); err != nil {
				e.classCError(q, reth.NAKInvalidRequest, DropBadAccess, psn)
				return
			}
			wc.InvalidatedRKey, wc.Flags = h.RKey(), wc.Flags|WCWithInv
		}
		rs.haveRecv, rs.inMsg = false, false
		rs.msn++
		q.pushWC(q.recvCQ, wc)
	}
	e.advance(q, p, psn)
}

// rnrNAK refuses a SEND or WRITE with immediate that finds no receive
// WQE with an RNR NAK: the requester waits its RNR timer and sends the
// packet again, finding the responder as it was.
func (e *Engine) rnrNAK(q *QP, psn bth.PSN) {
	e.Stats.SendRNRErr.Add(1)
	e.drop(DropNoRecvWQE)
	e.sendAck(q, reth.RNRSyndrome(q.attr.MinRNRTimer), psn)
}

func (e *Engine) recvWrite(q *QP, p bth.Packet, psn bth.PSN) {
	rs := &q.resp
	in := p.Info
	payload := p.Payload()
	if in.Has(bth.Imm) {
		// WRITE with immediate consumes a receive WQE at its last packet.
		// Without one the packet is refused before anything changes (as
		// rxe checks resources before the rkey), so its retry finds the
		// responder as it was.
		w, ok := q.takeRecv()
		if !ok {
			e.rnrNAK(q, psn)
			return
		}
		rs.recv, rs.haveRecv = w, true
	}
	if in.Has(bth.First) {
		h := p.RETH()
		rs.dmaLen, rs.woff, rs.wbuf = h.DMALen(), 0, nil
		if rs.dmaLen > maxMessage {
			e.classCError(q, reth.NAKInvalidRequest, DropBadLength, psn)
			return
		}
		if rs.dmaLen > 0 { // IBA C9-88: a zero-length WRITE checks no rkey
			buf, err := e.cfg.MRs.RemoteQP(h.RKey(), q.pd, q.num, h.VA(), rs.dmaLen, mr.RemoteWrite)
			if err != nil {
				e.accessError(q, err, psn)
				return
			}
			rs.wbuf = buf
		}
		rs.inMsg, rs.msgOp = true, bth.OpWrite
		e.Stats.RDMARecvs.Add(1)
	}
	if uint64(rs.woff)+uint64(len(payload)) > uint64(rs.dmaLen) ||
		in.Has(bth.Last) && rs.woff+uint32(len(payload)) != rs.dmaLen {
		e.classCError(q, reth.NAKInvalidRequest, DropBadLength, psn)
		return
	}
	copy(rs.wbuf[rs.woff:], payload)
	rs.woff += uint32(len(payload))
	e.Stats.RcvdBytes.Add(uint64(len(payload)))
	if in.Has(bth.Last) {
		rs.inMsg = false
		rs.msn++
		if in.Has(bth.Imm) {
			rs.haveRecv = false
			q.pushWC(q.recvCQ, WC{ID: rs.recv.id, Opcode: WCRecvRDMAImm, ByteLen: rs.dmaLen, Imm: p.ImmDt().Imm(),
				Flags: WCWithImm, QPN: q.num, SrcQP: q.attr.DestQPN})
		}
		rs.wbuf = nil
	}
	e.advance(q, p, psn)
}

func (e *Engine) recvRead(q *QP, p bth.Packet, psn bth.PSN, now time.Duration) {
	if err := e.checkRead(q, p); errors.Is(err, errReadTooLong) {
		e.classCError(q, reth.NAKInvalidRequest, DropBadLength, psn)
		return
	} else if err != nil {
		e.accessError(q, err, psn)
		return
	}
	r := e.takeRead(q, p, psn)
	e.sendReadResponses(q, r.psn, r.va, r.rkey, r.n, now)
}

// sendReadResponses answers a READ for n bytes at va with PSNs from psn:
// the first burst now, the rest on later engine turns. It replaces any
// READ response still going out, and its queue.
func (e *Engine) sendReadResponses(q *QP, psn bth.PSN, va uint64, rkey uint32, n uint32, now time.Duration) {
	rs := &q.resp
	rs.rd = readStream{active: true, psn: psn, va: va, rkey: rkey, n: n, npk: packetsFor(n, q.mtu), msn: rs.msn,
		nakAfter: rs.rd.nakAfter, pending: rs.rd.pending[:0]}
	rs.rp.start(psn, now)
	e.continueRead(q, now)
}

// stopRead ends q's READ stream and drops its queue.
func (rs *responder) stopRead() {
	rs.rd.active = false
	rs.rd.pending = rs.rd.pending[:0]
}

// continueRead sends the next burst of q's READ response. When packets
// remain it arms the READ timer for the next turn, just after now (the
// engine then lets go in between); when none do, it NAKs the first request
// it refused meanwhile.
func (e *Engine) continueRead(q *QP, now time.Duration) {
	rs := &q.resp
	rd := &rs.rd
	if !rd.active || q.state != RTR && q.state != RTS && q.state != SQD && q.state != SQE {
		rs.stopRead()
		return
	}
	mtu := uint32(q.mtu)
	from := uint32(rd.next) * mtu
	end := min(rd.next+readBurst, rd.npk)
	if rp := &rs.rp; rp.rate != 0 {
		// Paced: as many packets as the pacer lets go now.
		rp.grow(now)
		lim := rd.next
		for lim < end {
			k := int(min(mtu, rd.n-min(uint32(lim)*mtu, rd.n)))
			if ok, _ := rp.pacer.Admit(now, k+wireOverhead); !ok {
				break
			}
			lim++
		}
		if lim == rd.next {
			e.schedule(q, timerRead, rp.wake(now))
			return
		}
		end = lim
	}
	var src []byte
	if rd.n > 0 {
		// Checked at every burst: the MR may have gone since the last one.
		var err error
		src, err = e.cfg.MRs.RemoteQP(rd.rkey, q.pd, q.num, rd.va+uint64(from), min(uint32(end-rd.next)*mtu, rd.n-from), mr.RemoteRead)
		if err != nil {
			e.accessError(q, err, rd.psn.Add(rd.next))
			return
		}
	}
	for i := rd.next; i < end; i++ {
		off := uint32(i)*mtu - from
		k := int(min(mtu, rd.n-min(uint32(i)*mtu, rd.n)))
		op, _ := bth.Find(bth.RC, bth.OpReadResponse, position(i == 0, i == rd.npk-1), 0)
		buf, p := e.header(q, op, rd.psn.Add(i), k, false, false, q.attr.DestQPN)
		if a := p.AETH(); a != nil {
			a.Set(reth.ACKSyndrome(reth.CreditsInvalid), rd.msn)
		}
		copy(buf[p.Info.HdrLen:], src[off:off+uint32(k)])
		e.emit(buf, q.attr.Dest, e.cfg.DataTOS)
		e.Stats.SentBytes.Add(uint64(k))
	}
	rd.next = end
	if rd.next < rd.npk {
		at := now + 1
		if rs.rp.rate != 0 {
			at = rs.rp.wake(now)
		}
		e.schedule(q, timerRead, at)
		return
	}
	if len(rd.pending) > 0 {
		// The next queued READ, on the next turn.
		r := rd.pending[0]
		rd.pending = append(rd.pending[:0], rd.pending[1:]...)
		rd.psn, rd.va, rd.rkey, rd.n, rd.npk, rd.next, rd.msn = r.psn, r.va, r.rkey, r.n, r.npk, 0, r.msn
		e.schedule(q, timerRead, now+1)
		return
	}
	rd.active = false
	if rd.nakAfter {
		rd.nakAfter = false
		rs.nakSent = true
		e.sendAck(q, reth.NAKSyndrome(reth.NAKPSNSeqError), rs.ePSN)
	}
}

func (e *Engine) recvAtomic(q *QP, p bth.Packet, psn bth.PSN) {
	rs := &q.resp
	a := p.AtomicETH()
	w, err := e.cfg.MRs.Atomic64QP(a.RKey(), q.pd, q.num, a.VA(), mr.RemoteAtomic)
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
	e.emit(buf, q.attr.Dest, e.cfg.DataTOS)
}

// recvAtomicWriteOrFlush executes an ATOMIC WRITE or a FLUSH; both are
// answered with an empty READ RESPONSE ONLY, as rxe does.
func (e *Engine) recvAtomicWriteOrFlush(q *QP, p bth.Packet, psn bth.PSN) {
	rs := &q.resp
	h := p.RETH()
	if p.Info.Op == bth.OpAtomicWrite {
		w, err := e.cfg.MRs.Atomic64QP(h.RKey(), q.pd, q.num, h.VA(), mr.RemoteWrite)
		if err != nil {
			e.accessError(q, err, psn)
			return
		}
		// The payload's bytes land in memory as they are (rxe memcpy's them).
		w.Store(binary.NativeEndian.Uint64(p.Payload()))
	} else if h.DMALen() > 0 {
		// Go memory is always globally visible; the check is what matters.
		if _, err := e.cfg.MRs.RemoteQP(h.RKey(), q.pd, q.num, h.VA(), h.DMALen(), mr.RemoteWrite); err != nil {
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
	e.emit(buf, q.attr.Dest, e.cfg.DataTOS)
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

// maxMessage is the longest message (2^31 bytes, as rxe advertises);
// a longer RDMA length is an invalid request (rxe's check_length).
const maxMessage = 1 << 31

// ucDupWindow is how far behind the expected PSN a UC packet counts as a
// duplicate.
const ucDupWindow = 1 << 16

// respondUC runs the UC responder: PSN gaps drop the damaged message, no
// acknowledgements, no RNR.
func (e *Engine) respondUC(q *QP, in *InPacket) {
	p := in.Pkt
	rs := &q.resp
	psn := p.BTH().PSN()
	info := p.Info
	if d := rs.ePSN.Diff(psn); d > 0 && d <= ucDupWindow {
		// A PSN just behind is a duplicate (or a straggler the next
		// message overtook): taking it as a new message would deliver a
		// message twice. rxe starts a message at any first packet; rxego
		// drops what it has recently passed, which UC allows (it may
		// lose, never repeat). Far older PSNs still start a message, so
		// a peer that starts over at another PSN is heard, as by rxe.
		e.Stats.DuplicateRequest.Add(1)
		e.drop(DropDuplicate)
		return
	}
	if psn != rs.ePSN {
		e.Stats.OutOfSeqRequest.Add(1)
		rs.inMsg = false
		if !info.Has(bth.First) {
			rs.ucDrop = true
			rs.ePSN = psn.Next()
			e.drop(DropOutOfSequence)
			return
		}
		rs.ePSN = psn
	}
	rs.ePSN = psn.Next()
	if info.Has(bth.First) {
		rs.ucDrop, rs.inMsg = false, false
	} else if rs.ucDrop || !rs.inMsg || info.Op != rs.msgOp {
		rs.ucDrop = true
		e.drop(DropWrongOpcode)
		return
	}
	payload := p.Payload()
	if len(payload) > q.mtu || !info.Has(bth.Last) && len(payload) != q.mtu {
		rs.ucDrop, rs.inMsg = true, false
		e.drop(DropBadLength)
		return
	}
	switch info.Op {
	case bth.OpSend:
		if info.Has(bth.First) {
			if !rs.haveRecv {
				w, ok := q.takeRecv()
				if !ok {
					rs.ucDrop = true
					e.drop(DropNoRecvWQE)
					return
				}
				rs.recv, rs.haveRecv = w, true
			}
			rs.recvOff, rs.inMsg, rs.msgOp = 0, true, bth.OpSend
		}
		if err := e.scatter(q.pd, rs.recv.sgl(), rs.recvOff, payload); err != nil {
			rs.haveRecv, rs.inMsg, rs.ucDrop = false, false, true
			q.pushWC(q.recvCQ, WC{ID: rs.recv.id, Status: WCLocLenErr, Opcode: WCRecv, QPN: q.num})
			return
		}
		rs.recvOff += uint32(len(payload))
		if info.Has(bth.Last) {
			wc := WC{ID: rs.recv.id, Opcode: WCRecv, ByteLen: rs.recvOff, QPN: q.num, SrcQP: q.attr.DestQPN}
			if h := p.ImmDt(); h != nil {
				wc.Imm, wc.Flags = h.Imm(), WCWithImm
			}
			rs.haveRecv, rs.inMsg = false, false
			q.pushWC(q.recvCQ, wc)
		}
	case bth.OpWrite:
		if info.Has(bth.First) {
			h := p.RETH()
			rs.dmaLen, rs.woff, rs.wbuf = h.DMALen(), 0, nil
			if rs.dmaLen > 0 {
				buf, err := e.cfg.MRs.RemoteQP(h.RKey(), q.pd, q.num, h.VA(), rs.dmaLen, mr.RemoteWrite)
				if err != nil || !q.allows(bth.OpWrite) {
					rs.ucDrop = true
					reason := DropBadAccess
					if errors.Is(err, mr.ErrOutOfBounds) {
						reason = DropOutOfBounds
					}
					e.drop(reason)
					return
				}
				rs.wbuf = buf
			}
			rs.inMsg, rs.msgOp = true, bth.OpWrite
		}
		if uint64(rs.woff)+uint64(len(payload)) > uint64(rs.dmaLen) {
			rs.ucDrop, rs.inMsg = true, false
			e.drop(DropBadLength)
			return
		}
		var rw recvWQE
		if info.Has(bth.Imm) {
			w, ok := q.takeRecv()
			if !ok {
				rs.ucDrop, rs.inMsg = true, false
				e.drop(DropNoRecvWQE)
				return
			}
			rw = w
		}
		copy(rs.wbuf[rs.woff:], payload)
		rs.woff += uint32(len(payload))
		if info.Has(bth.Last) {
			rs.inMsg = false
			if info.Has(bth.Imm) {
				q.pushWC(q.recvCQ, WC{ID: rw.id, Opcode: WCRecvRDMAImm, ByteLen: rs.dmaLen, Imm: p.ImmDt().Imm(),
					Flags: WCWithImm, QPN: q.num, SrcQP: q.attr.DestQPN})
			}
		}
	}
	e.Stats.RcvdBytes.Add(uint64(len(payload)))
}

// GRHLen is the space a UD receive buffer reserves for the GRH.
const GRHLen = 40

// respondUD delivers a UD datagram into the next receive WQE, after the
// 40 bytes verbs reserves for the GRH: for RoCEv2 over IPv4 that space
// holds 20 zero bytes and then the IPv4 header, over IPv6 the IPv6 header.
func (e *Engine) respondUD(q *QP, in *InPacket) {
	p := in.Pkt
	d := p.DETH()
	if d.QKey() != q.attr.QKey {
		e.drop(DropBadQKey)
		return
	}
	payload := p.Payload()
	if len(payload) > q.mtuOrMax() {
		e.drop(DropBadLength)
		return
	}
	w, ok := q.takeRecv()
	if !ok {
		e.drop(DropNoRecvWQE)
		return
	}
	var grh [GRHLen]byte
	fillGRH(grh[:], in)
	err := e.scatter(q.pd, w.sgl(), 0, grh[:])
	if err == nil {
		err = e.scatter(q.pd, w.sgl(), GRHLen, payload)
	}
	if err != nil {
		q.pushWC(q.recvCQ, WC{ID: w.id, Status: WCLocLenErr, Opcode: WCRecv, QPN: q.num})
		return
	}
	wc := WC{ID: w.id, Opcode: WCRecv, ByteLen: uint32(GRHLen + len(payload)), QPN: q.num,
		SrcQP: d.SrcQP(), Flags: WCWithGRH, Src: in.Src}
	if h := p.ImmDt(); h != nil {
		wc.Imm, wc.Flags = h.Imm(), wc.Flags|WCWithImm
	}
	e.Stats.RcvdBytes.Add(uint64(len(payload)))
	q.pushWC(q.recvCQ, wc)
}

// fillGRH synthesizes the IP header a UD receiver finds in its GRH space;
// a UDP socket does not show the real one, so the fields the kernel would
// vary (ID, checksum) are left zero.
func fillGRH(g []byte, in *InPacket) {
	roceLen := len(in.Pkt.Raw)
	src, dst := in.Src.Addr(), in.Dest
	if src.Is4() || src.Is4In6() {
		f := iphdr.IPv4Fields{TOS: in.TOS, TotalLength: uint16(iphdr.IPv4Len + iphdr.UDPLen + roceLen),
			DF: true, TTL: 64, Protocol: iphdr.ProtoUDP, Src: src.Unmap().As4()}
		if dst.IsValid() {
			f.Dst = dst.Unmap().As4()
		}
		iphdr.IPv4(g[GRHLen-iphdr.IPv4Len:]).Encode(&f) // the last 20 bytes, as verbs puts it
		return
	}
	f := iphdr.IPv6Fields{TrafficClass: in.TOS, PayloadLength: uint16(iphdr.UDPLen + roceLen),
		NextHeader: iphdr.ProtoUDP, HopLimit: 64, Src: src.As16()}
	if dst.IsValid() {
		f.Dst = dst.As16()
	}
	iphdr.IPv6(g).Encode(&f)
}
