package qp

import (
	"time"

	"github.com/rxego/rxego/reth"
)

// The requester's guard against responses that contradict what it knows
// (issue 24). Responses are not authenticated: a forged ACK or NAK with an
// in-window PSN makes the requester take PSNs as done that the responder
// never executed, and from then on the responder's real ACKs and NAKs are
// behind the requester's completed PSN. Those false completions cannot be
// prevented, but the QP must not stay wedged silently in RTS: it ends in
// ERR with an error completion instead. See docs/rnic.md.

// maxStalledRetries and the stall time (Config.StallTime, by default
// DefaultStallTime) bound the retransmissions in a row without progress
// when retry_cnt is 7, which rxe (and rxego before) takes as unlimited:
// once there were more than maxStalledRetries of them and the first was
// at least the stall time ago, the next fails the oldest WQE
// with RETRY_EXC_ERR. Both must hold: with a short timeout (timeout 8 is
// about 1 ms) a loaded host can go 64 timeouts without an answer and
// still recover, while with the usual timeout of 14 (67 ms) 64 timeouts
// are 4.3 s. rnr_retry 7 stays unlimited (IBA): an RNR NAK says the
// responder is there.
const maxStalledRetries = 64

// DefaultStallTime is the stall time when Config.StallTime is 0.
const DefaultStallTime = 10 * time.Second

// stallTime is the engine's stall time; ok is false when stalls are not
// bounded (Config.StallTime negative).
func (e *Engine) stallTime() (d time.Duration, ok bool) {
	switch d := e.cfg.StallTime; {
	case d < 0:
		return 0, false
	case d == 0:
		return DefaultStallTime, true
	default:
		return d, true
	}
}

// spendRetry takes one try of the retry budget for a retransmission
// (timeout or sequence-error NAK) and reports whether there was one:
// retry_cnt's budget, and the stall bound above.
func (e *Engine) spendRetry(q *QP) bool {
	r := &q.req
	now := e.cfg.Clock.Now()
	if r.stalls == 0 {
		r.stallSince = now
	}
	r.stalls++
	r.resent = true
	limit, bounded := e.stallTime()
	return spend(&r.retryLeft) && (!bounded || r.stalls <= maxStalledRetries || now-r.stallSince < limit)
}

// contradictedRetries is what is left of the stall bound once a NAK has
// contradicted the requester (see contradicts): as many retries as a
// finite retry_cnt of 7 would allow.
const contradictedRetries = 7

// contradicts notes a NAK behind the requester's completed PSN that
// answers a retransmission no progress followed: the responder may still
// expect a PSN the requester took as acknowledged (after a forged ACK or
// NAK), which no resend can reach. It may also be a delayed duplicate
// overtaken by later responses, so it fails nothing at once: from then
// on, until progress, contradictedRetries more retransmissions (and
// the stall time since the first) are enough for RETRY_EXC_ERR, even with
// retry_cnt 7. It reports
// whether the NAK was taken so (counted in ContradictingResponse); rxe
// drops such a NAK and, with retry_cnt 7, retries for ever.
func (e *Engine) contradicts(q *QP, syn reth.Syndrome) bool {
	r := &q.req
	if !r.resent || q.sqHead == q.sqTail || q.state != RTS && q.state != SQD {
		return false
	}
	if syn.Kind() != reth.KindRNR && (syn.Kind() != reth.KindNAK || syn.Value() != reth.NAKPSNSeqError) {
		return false
	}
	e.Stats.ContradictingResponse.Add(1)
	r.stalls = max(r.stalls, maxStalledRetries-contradictedRetries)
	return true
}
