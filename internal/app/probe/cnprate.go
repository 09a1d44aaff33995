package probe

import (
	"fmt"
	"time"
)

// How the peer's rate after CNPs is judged ("expect slower"): from the
// kernel's arrival stamps of its packets on the scenario's QP, the packet
// rate in the window that ends at the last CNP (the train still running,
// so a reaction point has had no quiet time to raise its rate again)
// against the rate in the window just before the first CNP. A clear
// slow-down is a rate of at most 1/slowdownFactor of the one before; a
// window before with fewer than minRatePackets packets is too few to
// judge.
const (
	slowdownFactor = 2
	minRatePackets = 20
)

// windowRate is what the peer sent in one window of a rate comparison.
type windowRate struct {
	packets, bytes int
	span           time.Duration
}

// perMs is the window's packets per millisecond.
func (w windowRate) perMs() float64 {
	return float64(w.packets) / (float64(w.span) / float64(time.Millisecond))
}

// String gives the rate in packets/ms and Mbit/s (the bytes from BTH to
// ICRC).
func (w windowRate) String() string {
	return fmt.Sprintf("%.1f packets/ms (%.1f Mbit/s)", w.perMs(), float64(w.bytes)*8/w.span.Seconds()/1e6)
}

// rateComparison is the peer's rate before a CNP train and at its end.
type rateComparison struct {
	before, after windowRate
	cnps          int
	train         time.Duration // first CNP to last
}

// slowed says whether the rate at the end of the train is clearly lower.
func (c rateComparison) slowed() bool { return c.after.perMs()*slowdownFactor <= c.before.perMs() }

// String is the comparison as a report's observation.
func (c rateComparison) String() string {
	return fmt.Sprintf("%d CNPs over %v; rate %s in the %v before the first CNP, %s in the %v up to the last",
		c.cnps, c.train.Round(100*time.Microsecond), c.before, c.before.span, c.after, c.after.span)
}

// rates compares q's packet rates in the window before its CNP train and
// in the window that ends at the train's last CNP; why says what kept it
// from being judged. A resend from the window before to settle after the
// last CNP (4T, T the peer's ACK timeout) means a packet was lost or an
// ACK timer ran out: a requester that waits for its timer, or restarts
// slowly after it, is slow for reasons of its own, so the rates are not
// compared.
func (q *reqQP) rates(window, settle time.Duration) (rateComparison, string) {
	more := "run the peer's client with more iterations (perftest's -n), and this scenario alone (--only, -q 1)"
	if q.train == nil {
		return rateComparison{}, fmt.Sprintf("the peer's stream ended before the CNPs were due (%v after psn=+%d): %s", q.impair.After, q.impair.At, more)
	}
	sent, err := q.train.times()
	switch {
	case err != nil:
		return rateComparison{}, fmt.Sprintf("the CNP train stopped after %d of %d CNPs: %v", len(sent), q.train.want, err)
	case len(sent) < q.train.want:
		return rateComparison{}, fmt.Sprintf("the run ended after %d of the %d CNPs: %s", len(sent), q.train.want, more)
	}
	first, last := sent[0], sent[len(sent)-1]
	switch {
	case len(q.events) == 0 || q.events[0].at.After(first.Add(-window)):
		return rateComparison{}, fmt.Sprintf("the peer's stream began less than %v before the first CNP", window)
	case !q.events[len(q.events)-1].at.After(last):
		return rateComparison{}, "the peer sent nothing after the last CNP (its stream may have ended inside the window): " + more
	}
	if n := q.resentIn(first.Add(-window), last.Add(settle)); n > 0 {
		naks := 0
		for _, e := range q.naks {
			if !e.at.Before(first.Add(-window)) && e.at.Before(last.Add(settle)) {
				naks++
			}
		}
		return rateComparison{}, fmt.Sprintf("the peer resent %d packets between the window before the CNPs and %v after the last (a loss or an ACK timeout; the probe NAKed %d sequence errors meanwhile): its rate is not judged",
			n, settle.Round(time.Millisecond), naks)
	}
	c := rateComparison{before: q.sentIn(first.Add(-window), first), after: q.sentIn(last.Add(-window), last),
		cnps: len(sent), train: last.Sub(first)}
	if c.before.packets < minRatePackets {
		return rateComparison{}, fmt.Sprintf("too few packets to judge: %d in the %v before the first CNP (at least %d)", c.before.packets, window, minRatePackets)
	}
	if c.train > 0 {
		// A peer that sends not many more packets than it is sent CNPs
		// spends as much on taking the CNPs in as on its stream, and may
		// slow down or stop without any reaction point: rxe in the lab's
		// emulated guest, with none, fell from 4.8 to 1.4 packets/ms
		// under the built-in train (ci28), and from 11.2 to 0 against
		// 10.4 CNPs/ms (ci31). Its rate says nothing either way. An RNIC
		// sends thousands of times more packets than a train's CNPs.
		cnpsPerMs := float64(len(sent)-1) / (float64(c.train) / float64(time.Millisecond))
		if c.before.perMs() < cnpRateMargin*cnpsPerMs {
			return rateComparison{}, fmt.Sprintf("%s: the peer sent %s before the CNPs, fewer than %d times the train's %.1f CNPs/ms; taking them in may slow it by itself, so its rate is not judged",
				TooSlowToJudge, c.before, cnpRateMargin, cnpsPerMs)
		}
	}
	return c, ""
}

// cnpRateMargin is how many times the train's CNP rate a peer's packet
// rate must be, before the CNPs, for cnp-rate to judge it.
const cnpRateMargin = 4

// TooSlowToJudge begins the reason a cnp-rate result is inconclusive when
// the peer sends more slowly than the CNPs come (an emulated rxe does).
const TooSlowToJudge = "too slow to judge"

// resentIn counts the packets the peer sent again from from until to.
func (q *reqQP) resentIn(from, to time.Time) int {
	n := 0
	for _, e := range q.events {
		if e.copy > 1 && !e.at.Before(from) && e.at.Before(to) {
			n++
		}
	}
	return n
}

// sentIn is what the peer sent on q from from until to.
func (q *reqQP) sentIn(from, to time.Time) windowRate {
	w := windowRate{span: to.Sub(from)}
	for _, e := range q.events {
		if !e.at.Before(from) && e.at.Before(to) {
			w.packets++
			w.bytes += e.size
		}
	}
	return w
}
