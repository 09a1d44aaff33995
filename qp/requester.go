package qp

import (
	"net/netip"
	"time"

	"github.com/rxego/rxego/bth"
)

// requester is the send side of a QP: it turns send WQEs into packets,
// assigns PSNs and rewinds for Go-back-N retries.
type requester struct {
	psn       bth.PSN // next PSN to send
	compPSN   bth.PSN // oldest PSN not yet acknowledged
	off       uint32  // bytes of WQE sqSend already sent
	rdOut     int     // READ/atomic/flush WQEs sent and not completed
	retryLeft uint8
	rnrLeft   uint8
	rnrWait   bool // paused until the RNR timer fires
	noAck     int  // packets sent since the last AckReq
	// gapPSN remembers the compPSN a read-response gap retry was started
	// for, so one gap triggers one retry.
	gapPSN     bth.PSN
	gapPending bool
	// retrying is set by every retry and cleared when a WQE completes
	// (rxe's comp.started_retry): until then a gap in READ responses
	// starts no further retry. A peer that keeps sending its earlier
	// responses (rxe 6.1 does not stop a READ's stream when the request
	// comes again) would otherwise meet each retry's gaps with yet
	// another stream.
	retrying bool
	maxSent  bth.PSN // the PSN after the highest one ever sent
	// stalls counts retransmissions since the last progress, the first
	// of them at stallSince, and resent is set by every retry since then
	// (stall.go).
	stalls     int
	stallSince time.Duration
	resent     bool

	// The congestion window (window.go): cwnd PSNs, 0 while it is open
	// (Config.Window alone limits); ssthresh ends slow start; cwndAcc
	// counts PSNs acknowledged toward the next additive step; ackedTo is
	// the compPSN the window last grew for.
	cwnd, ssthresh, cwndAcc int
	ackedTo                 bth.PSN
	// lossGap averages the PSNs acknowledged between losses (0: none
	// seen yet), lossPSN is compPSN at the last one (lossCap).
	lossGap int
	lossPSN bth.PSN
	// afterTimeout is set by a retransmission timeout until what was
	// sent before it is acknowledged (to recoverTo) or a NAK comes.
	afterTimeout bool
	recoverTo    bth.PSN
	// One round-trip sample at a time (window.go): the PSN of a packet
	// that asked for an ACK, first sent at rttAt; minRTT is the least
	// sample seen; queueing says the last sample was well above it.
	rttArmed bool
	rttPSN   bth.PSN
	rttAt    time.Duration
	minRTT   time.Duration
	queueing bool
}

func (r *requester) init(q *QP) {
	r.psn = bth.PSN(q.attr.SQPSN)
	r.compPSN = r.psn
	r.maxSent = r.psn
	r.ackedTo = r.psn
	r.lossPSN, r.lossGap = r.psn, 0
	r.cwnd, r.ssthresh, r.afterTimeout = 0, 0, false // open until the peer drops something
	if w := q.e.cfg.InitialWindow; w > 0 && w < q.e.cfg.Window {
		r.cwnd, r.ssthresh = w, q.e.cfg.Window // slow start up to the window
	}
	r.refill(q)
}

// refill restores the retry budgets (retry_cnt, rnr_retry): at the start,
// and whenever an acknowledgement shows progress.
func (r *requester) refill(q *QP) {
	r.retryLeft = q.attr.RetryCnt
	r.rnrLeft = q.attr.RNRRetry
	r.stalls, r.resent = 0, false
}

// spend takes one try from a retry budget, where 7 means unlimited, and
// reports whether there was one to take.
func spend(left *uint8) bool {
	if *left == 0 {
		return false
	}
	if *left != 7 {
		*left--
	}
	return true
}

func (q *QP) wqe(i uint64) *sendWQE { return &q.sq[i%uint64(len(q.sq))] }

func (q *QP) maxRdAtomic() int {
	if q.attr.MaxRdAtomic == 0 {
		return 1 // verbs allows 0; treating it as 1 keeps READs from stalling forever
	}
	return int(q.attr.MaxRdAtomic)
}

// sendNext sends the next packet of the WQE at sqSend, returning false
// when the requester must wait (window, credits, fence).
func (e *Engine) sendNext(q *QP, now time.Duration) bool {
	w := q.wqe(q.sqSend)
	r := &q.req
	op := w.wr.Opcode
	if q.typ == RC && int(r.psn.Diff(r.compPSN)) >= e.window(q) {
		return false
	}
	if op == WRLocalInv || op == WRBindMW {
		if !w.started { // a Go-back-N rewind passes it without executing it again
			e.localOp(q, w)
			if q.state == Err {
				return false
			}
		}
		q.sqSend++
		return true
	}
	first := r.off == 0 && (!w.started || w.firstPSN == r.psn)
	if first && q.typ == RC {
		if w.wr.Flags&SendFence != 0 && q.responsesPending(q.sqSend) {
			return false
		}
		if w.needsResponse() && op != WRRead && r.rdOut >= q.maxRdAtomic() && !w.started {
			return false
		}
	}
	mtu := q.mtu
	if q.typ == UD {
		mtu = q.mtuOrMax()
	}
	freshRead := false
	if op == WRRead {
		var ok bool
		if ok, freshRead = e.readAdmit(q, w, mtu); !ok {
			return false
		}
	}
	wire := min(mtu, int(w.length-min(r.off, w.length))) + wireOverhead
	if !e.ccAdmit(q, now, wire) {
		return false
	}
	if !w.started {
		w.started = true
		w.firstPSN = r.psn
		w.npkts = packetsFor(w.length, mtu)
		if w.needsResponse() && op != WRRead {
			w.npkts = 1 // one request, one response
		}
		w.lastPSN = w.firstPSN.Add(w.npkts - 1)
		if w.needsResponse() && op != WRRead {
			r.rdOut++
			w.rdHeld = 1
		}
		if op != WRSend && op != WRSendImm && op != WRSendInv && op != WRRead { // READ: per request (readCount)
			e.Stats.RDMASends.Add(1)
		}
	}
	if freshRead {
		e.readCount(q, w, mtu)
	}
	retrans := r.psn.Before(r.maxSent)
	if w.needsResponse() {
		e.sendRequest(q, w, mtu)
	} else if !e.sendSegment(q, w, mtu) {
		return true // the WQE failed locally; the QP is in ERR
	} else if q.typ == RC && r.noAck == 0 && !retrans && !r.rttArmed {
		r.rttArmed, r.rttPSN, r.rttAt = true, r.psn.Add(-1), now // it asked for an ACK
	}
	if retrans {
		e.Stats.Retransmits.Add(1)
	}
	if r.psn.After(r.maxSent) {
		r.maxSent = r.psn
	}
	e.ccSent(q, now, wire)
	if q.typ == RC && q.timer[timerRetransmit].deadline == 0 && q.attr.Timeout != 0 {
		e.schedule(q, timerRetransmit, now+ackTimeout(q.attr.Timeout))
	}
	return true
}

// responsesPending reports whether a READ or atomic before WQE i still
// waits for its response: what a fence on WQE i waits for. (rdOut will
// not do: after a Go-back-N rewind it also counts those after i, and
// one fenced READ would wait for itself.)
func (q *QP) responsesPending(i uint64) bool {
	for j := q.sqHead; j != i; j++ {
		if w := q.wqe(j); w.needsResponse() && !w.acked {
			return true
		}
	}
	return false
}

// ackTimeout converts the QP timeout attribute: 4.096 us * 2^t.
func ackTimeout(t uint8) time.Duration {
	return time.Duration(4096<<t) * time.Nanosecond
}

// dest returns where q's packets go.
func (q *QP) dest(w *sendWQE) (addrPort netip.AddrPort, qpn uint32) {
	if q.typ == UD {
		return w.wr.AH.Dest, w.wr.RemoteQPN
	}
	return q.attr.Dest, q.attr.DestQPN
}

// sendSegment sends the next packet of a SEND or RDMA WRITE.
func (e *Engine) sendSegment(q *QP, w *sendWQE, mtu int) bool {
	r := &q.req
	n := int(min(uint32(mtu), w.length-r.off))
	firstPkt := r.off == 0
	lastPkt := r.off+uint32(n) == w.length
	op := segmentOpcode(q.typ, w.wr.Opcode, firstPkt, lastPkt)
	ackReq := q.typ == RC && (lastPkt || r.noAck+1 >= e.cfg.AckEvery || e.ackReqDue(q))
	if q.typ == UD {
		ackReq = false
	}
	se := lastPkt && w.wr.Flags&SendSolicited != 0
	dest, dqpn := q.dest(w)
	payload := e.inPlace(q, w, r.off, n)
	buf, p := e.headerFor(q, op, r.psn, n, payload != nil, ackReq, se, dqpn)
	if h := p.RETH(); h != nil {
		h.Set(w.wr.RemoteAddr, w.wr.RKey, w.length)
	}
	if h := p.ImmDt(); h != nil {
		h.SetImm(w.wr.Imm)
	}
	if h := p.IETH(); h != nil {
		h.SetRKey(w.wr.InvalidateRKey)
	}
	if h := p.DETH(); h != nil {
		qkey := w.wr.RemoteQKey
		if qkey&0x80000000 != 0 && qkey != QKeyGSI {
			qkey = q.attr.QKey // IBA: a Q_Key with the high bit set means "use the QP's own"
		}
		h.Set(qkey, q.num)
	}
	if payload == nil {
		if err := e.gather(q, w, r.off, buf[p.Info.HdrLen:p.Info.HdrLen+n]); err != nil {
			e.unbuf(buf)
			e.failWQE(q, w, WCLocProtErr)
			return false
		}
	}
	tos := e.cfg.DataTOS
	if q.typ == UD {
		tos = w.wr.AH.TrafficClass | e.cfg.DataTOS&3
	}
	e.emitScattered(q, buf, payload, dest, tos)
	e.Stats.SentBytes.Add(uint64(n))
	r.psn = r.psn.Next()
	r.off += uint32(n)
	if ackReq {
		r.noAck = 0
	} else {
		r.noAck++
	}
	if lastPkt {
		r.off = 0
		q.sqSend++
		if q.typ != RC {
			// UC and UD have no acknowledgements: the WQE is done once sent.
			w.acked = true
			e.completeAcked(q)
		}
	}
	return true
}

// segmentOpcode picks the opcode of one packet of a message: the WR's
// operation at the packet's place in the message, with the immediate data
// or invalidation on the last packet only. (A UD message is one packet:
// PostSend refuses longer ones.)
func segmentOpcode(t Type, op WROpcode, first, last bool) bth.Opcode {
	i := 0
	if first {
		i = 2
	}
	if last {
		i++
	}
	return wrOpcodes[t.class()][op&(wrOpcodeLimit-1)][i]
}

// wrOpcodes holds what bth.Find gives for every class, send WR opcode and
// place in a message (middle, last, first, only), so that the requester
// looks each packet's opcode up in one step.
var wrOpcodes = func() (t [bth.UD + 1][wrOpcodeLimit][4]bth.Opcode) {
	for c := range t {
		for op := range t[c] {
			for i := range t[c][op] {
				var with bth.Flags
				if i&1 != 0 {
					with = wrWire[op].with
				}
				t[c][op][i], _ = bth.Find(bth.Class(c), wrWire[op].op, position(i&2 != 0, i&1 != 0), with)
			}
		}
	}
	return t
}()

// sendRequest sends the one packet of a READ, atomic, ATOMIC WRITE or
// FLUSH request. The opcode table says which extended headers the opcode
// carries and whether a payload follows; each is filled from w. A READ
// asks only for the bytes not yet received, so a retry restarts at the
// first missing response.
func (e *Engine) sendRequest(q *QP, w *sendWQE, mtu int) {
	r := &q.req
	op := segmentOpcode(RC, w.wr.Opcode, true, true)
	off, length := uint32(0), w.rethLength()
	next := w.npkts // PSN offset of the next request
	if w.wr.Opcode == WRRead {
		k := int(r.psn.Diff(w.firstPSN)) // responses already received
		next = w.readChunkEnd(k)
		off = uint32(min(int64(k)*int64(mtu), int64(w.length)))
		length = uint32(min(int64(next)*int64(mtu), int64(w.length))) - off
	}
	var payload []byte
	if op.Info().Has(bth.Payload) {
		payload = w.wr.AtomicValue[:]
	}
	buf, p := e.header(q, op, r.psn, len(payload), true, false, q.attr.DestQPN)
	copy(buf[p.Info.HdrLen:], payload)
	if h := p.RETH(); h != nil {
		h.Set(w.wr.RemoteAddr+uint64(off), w.wr.RKey, length)
	}
	if h := p.AtomicETH(); h != nil {
		h.Set(w.wr.RemoteAddr, w.wr.RKey, swapAdd(&w.wr), w.wr.CompareAdd)
	}
	if h := p.FETH(); h != nil {
		h.Set(w.wr.FlushLevel, w.wr.FlushType)
	}
	e.emit(q, buf, q.attr.Dest, e.cfg.DataTOS)
	r.noAck = 0
	if next < w.npkts {
		r.psn = w.firstPSN.Add(next) // the next chunk's request follows
		return
	}
	r.psn = w.lastPSN.Next()
	q.sqSend++
}

// rethLength is the length a request's RETH names: the message for a
// READ, the 8 bytes of an ATOMIC WRITE, the range of a FLUSH.
func (w *sendWQE) rethLength() uint32 {
	switch w.wr.Opcode {
	case WRAtomicWrite:
		return uint32(len(w.wr.AtomicValue))
	case WRFlush:
		return w.wr.FlushLength
	}
	return w.length
}

// swapAdd is the AtomicETH swap/add field: the addend of a FetchAdd, the
// swap value of a CompareSwap (whose compare value goes in Compare).
func swapAdd(wr *SendWR) uint64 {
	if wr.Opcode == WRFetchAdd {
		return wr.CompareAdd
	}
	return wr.Swap
}

// localOp executes a LOCAL_INV or BIND_MW work request.
// It takes no PSN: its empty range [psn, psn-1] matches no response, so
// ACKs and NAKs pass it by.
func (e *Engine) localOp(q *QP, w *sendWQE) {
	w.started, w.acked = true, true
	w.firstPSN, w.lastPSN = q.req.psn, q.req.psn.Add(-1)
	if w.wr.Opcode == WRBindMW {
		if err := e.bindMW(q, &w.wr.Bind); err != nil {
			e.failWQE(q, w, WCMWBindErr) // as rxe
			return
		}
	} else if err := e.cfg.MRs.Invalidate(w.wr.InvalidateRKey, q.pd); err != nil {
		e.failWQE(q, w, WCLocQPOpErr) // rxe's status for a failed local operation
		return
	}
	if q.sqHead == q.sqSend {
		e.completeAcked(q)
	}
}

// failWQE completes w with an error and moves the QP to ERR.
func (e *Engine) failWQE(q *QP, w *sendWQE, st WCStatus) {
	w.status = st
	w.done = true
	e.Stats.SendErr.Add(1)
	// Everything before w completes first, in order, then w with its error.
	// Before w, only a local operation can be finished yet not completed
	// (it waits for an earlier request's response); it keeps its success.
	for q.sqHead != q.sqTail {
		x := q.wqe(q.sqHead)
		if x == w {
			q.retire(false)
			break
		}
		if !x.done && !x.acked {
			x.status = WCWRFlushErr
		}
		q.retire(true)
	}
	q.enterError()
}

// retry rewinds the requester to resend from PSN from (Go-back-N) and
// counts the retry.
func (e *Engine) retry(q *QP, from bth.PSN) {
	e.Stats.CompleterRetryErr.Add(1)
	e.rewind(q, from)
}

// rewind moves the requester's send position back to PSN from. It never
// rewinds past what is acknowledged: a NAK that a later response
// overtook names PSNs that are done.
func (e *Engine) rewind(q *QP, from bth.PSN) {
	r := &q.req
	r.rttArmed = false // an ACK may now answer either sending (Karn)
	if from.Before(r.compPSN) {
		from = r.compPSN
	}
	for i := q.sqHead; i != q.sqTail; i++ {
		w := q.wqe(i)
		if !w.started {
			q.sqSend = i
			r.psn = from
			r.off = 0
			return
		}
		if !from.After(w.lastPSN) && !from.Before(w.firstPSN) {
			q.sqSend = i
			r.psn = from
			r.off = 0
			if w.wr.Opcode != WRRead {
				r.off = uint32(int64(from.Diff(w.firstPSN)) * int64(q.mtu))
			}
			return
		}
	}
	q.sqSend = q.sqTail
	r.psn = from
	r.off = 0
}

// retransmitTimeout fires when no ACK arrived within the QP's timeout.
func (e *Engine) retransmitTimeout(q *QP, now time.Duration) {
	r := &q.req
	if q.state != RTS && q.state != SQD || q.sqHead == q.sqTail || !r.compPSN.Before(r.maxSent) {
		return
	}
	if !e.retryOrFail(q, q.wqe(q.sqHead), r.compPSN) {
		return
	}
	e.cwndTimeout(q, now)
	e.schedule(q, timerRetransmit, now+ackTimeout(q.attr.Timeout))
	e.kick(q)
}

// retryOrFail spends one try of the retry budget and goes back to resend
// from PSN from; with the budget spent it fails w with RETRY_EXC_ERR. It
// reports whether it retried.
func (e *Engine) retryOrFail(q *QP, w *sendWQE, from bth.PSN) bool {
	if !e.spendRetry(q) {
		e.Stats.RetryExceededErr.Add(1)
		e.failWQE(q, w, WCRetryExcErr)
		return false
	}
	q.req.retrying = true
	e.retry(q, from)
	return true
}

// rnrTimerExpired ends an RNR pause: the requester goes back to the
// oldest PSN not acknowledged by now (acknowledgements that came during
// the pause count) and sends from there.
func (e *Engine) rnrTimerExpired(q *QP, now time.Duration) {
	r := &q.req
	if !r.rnrWait {
		return
	}
	r.rnrWait = false
	if q.state != Err && r.compPSN.Before(r.maxSent) {
		// In any state that keeps the send queue: the RNR NAK stopped the
		// retransmission timer, so without the rewind nothing would send
		// these PSNs again once the QP can send. Not counted in
		// completer_retry_err (see handleAETH).
		r.resent = true
		e.rewind(q, r.compPSN)
	}
	e.kick(q)
}
