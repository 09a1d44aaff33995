package congestion

import "time"

// NP is the notification point of one QP: it decides, for each CE-marked
// packet received, whether a CNP must be sent back. It sends at most one
// CNP per MinTimeBetweenCNPs; marks inside that gap are counted and
// dropped, not deferred (the next mark after the gap sends a CNP).
// It is a small value meant to be embedded in the engine's QP state.
type NP struct {
	minGap time.Duration
	last   time.Duration
	sent   bool
	marked uint64
	cnps   uint64
}

// NewNP returns a notification point sending at most one CNP per minGap
// (NPParams.MinTimeBetweenCNPs). A negative minGap is treated as 0.
func NewNP(minGap time.Duration) NP { return NP{minGap: max(minGap, 0)} }

// OnCE records a CE-marked packet received at now and reports whether a CNP
// must be sent for it. A now earlier than the last CNP never sends one.
func (n *NP) OnCE(now time.Duration) (sendCNP bool) {
	n.marked++
	if n.sent && (now < n.last || now-n.last < n.minGap) {
		return false
	}
	n.sent, n.last = true, now
	n.cnps++
	return true
}

// NPStats counts a notification point's work.
type NPStats struct {
	Marked uint64 // CE-marked packets seen
	CNPs   uint64 // CNPs requested
}

// Stats returns the counters.
func (n *NP) Stats() NPStats { return NPStats{Marked: n.marked, CNPs: n.cnps} }
