package qp

import (
	"errors"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/congestion"
	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/reth"
)

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
// joins the queue again. One that came in the same receive batch as the
// READ itself crossed its responses and is dropped too (duplicate).
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

// errTooLong is the verdict of checkRead and checkWrite on a READ or
// WRITE longer than maxMessage.
var errTooLong = errors.New("qp: READ or WRITE longer than 2^31 bytes")

// checkRead checks a READ request's length and its access to the
// target memory, returning the MR check's error or errTooLong.
func (e *Engine) checkRead(q *QP, p bth.Packet) error {
	h := p.RETH()
	n := h.DMALen()
	if n > maxMessage {
		return errTooLong
	}
	if n > 0 {
		if _, err := e.cfg.MRs.RemoteQP(h.RKey(), q.pd, q.id, h.VA(), n, mr.RemoteRead); err != nil {
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
	rs.saveResource(resource{op: bth.OpReadRequest, firstPSN: psn, lastPSN: psn.Add(r.npk - 1), va: r.va, rkey: r.rkey, length: r.n,
		batch: e.inputs})
	rs.msn++
	r.msn = rs.msn
	rs.ePSN = psn.Add(r.npk)
	rs.nakSent = false
	return r
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
		src, err = e.cfg.MRs.RemoteQP(rd.rkey, q.pd, q.id, rd.va+uint64(from), min(uint32(end-rd.next)*mtu, rd.n-from), mr.RemoteRead)
		if err != nil {
			e.accessError(q, err, rd.psn.Add(rd.next))
			return
		}
	}
	for i := rd.next; i < end; i++ {
		off := uint32(i)*mtu - from
		k := int(min(mtu, rd.n-min(uint32(i)*mtu, rd.n)))
		op, _ := bth.Find(bth.RC, bth.OpReadResponse, position(i == 0, i == rd.npk-1), 0)
		// A response's payload is sent from the MR where the Output
		// takes it so (ZeroCopyMinPayload): consecutive responses' payloads
		// lie back to back in src, so they still make GSO runs.
		var payload []byte
		if e.scatters && k >= ZeroCopyMinPayload {
			payload = src[off : off+uint32(k)]
		}
		buf, p := e.headerFor(q, op, rd.psn.Add(i), k, payload != nil, false, false, q.attr.DestQPN)
		if a := p.AETH(); a != nil {
			a.Set(reth.ACKSyndrome(reth.CreditsInvalid), rd.msn)
		}
		if payload == nil {
			copy(buf[p.Info.HdrLen:], src[off:off+uint32(k)])
		}
		e.emitScattered(q, buf, payload, q.attr.Dest, e.cfg.DataTOS)
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
