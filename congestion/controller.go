package congestion

import "time"

// Controller decides the send rate of one QP. It is a passive,
// single-goroutine state machine: it has no timers of its own, the engine
// tells it the time on every call (a time.Duration since the engine's
// epoch, non-decreasing; an earlier time is treated as the latest one seen)
// and asks it, through NextEvent, when it next needs to be woken.
type Controller interface {
	// OnCNP reports that a CNP for this QP arrived at now.
	OnCNP(now time.Duration)
	// OnSent reports that bytes were sent at now.
	OnSent(now time.Duration, bytes int)
	// Advance runs every timer event due at or before now.
	Advance(now time.Duration)
	// NextEvent returns when Advance must next be called for the rate to
	// change on time; ok is false when no event is pending.
	NextEvent() (at time.Duration, ok bool)
	// Rate returns the current rate in bits/s as of the last call.
	Rate() uint64
	// Stats returns counters and state for metrics.
	Stats() Stats
}

// Stats is a snapshot of a controller for metrics.
type Stats struct {
	Rate   uint64  // current rate RC, bits/s
	Target uint64  // target rate RT, bits/s
	Alpha  float64 // congestion estimate, as of the last call

	CNPs uint64 // CNPs received
	Cuts uint64 // rate decreases (coalesced CNPs count once)

	FastRecovery     uint64 // increase events in fast recovery
	AdditiveIncrease uint64 // increase events in additive increase
	HyperIncrease    uint64 // increase events in hyper increase
}

// None is the controller used when congestion control is off: the QP
// always runs at line rate. It still counts CNPs, so that a peer sending
// them is visible in metrics.
type None struct {
	rate uint64
	cnps uint64
}

// NewNone returns a controller fixed at lineRate bits/s.
func NewNone(lineRate uint64) *None { return &None{rate: lineRate} }

// OnCNP counts the CNP and otherwise ignores it.
func (n *None) OnCNP(time.Duration) { n.cnps++ }

// OnSent does nothing.
func (n *None) OnSent(time.Duration, int) {}

// Advance does nothing.
func (n *None) Advance(time.Duration) {}

// NextEvent reports that no event is ever pending.
func (n *None) NextEvent() (time.Duration, bool) { return 0, false }

// Rate returns the line rate.
func (n *None) Rate() uint64 { return n.rate }

// Stats returns the line rate and the CNP count.
func (n *None) Stats() Stats { return Stats{Rate: n.rate, Target: n.rate, CNPs: n.cnps} }

var (
	_ Controller = (*None)(nil)
	_ Controller = (*DCQCN)(nil)
)
