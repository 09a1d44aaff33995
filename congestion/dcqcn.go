package congestion

import (
	"math"
	"time"
)

// maxCatchUp bounds the increase events one call may run. More can only be
// due after a very long silence (65536 timer periods, about 20 s with
// NVIDIA's defaults) or a huge OnSent; the QP is then treated as fully
// recovered and returns to line rate.
const maxCatchUp = 1 << 16

// DCQCN is the DCQCN reaction point of one QP. Create it with NewDCQCN.
type DCQCN struct {
	p   Params
	now time.Duration // latest time seen

	rc, rt uint64 // current and target rate

	started     bool          // a CNP has been seen: alpha is live
	alpha       float64       // valid at alphaAt
	alphaAt     time.Duration // last alpha update boundary
	cnpInPeriod bool          // NVIDIA rule: a CNP arrived since alphaAt

	cutDone    bool
	lastCut    time.Duration
	pendingCut bool // a CNP arrived within the monitor period of lastCut

	timerOn   bool
	nextTimer time.Duration
	t, bc     uint64 // timer and byte-counter events since the last cut
	byteAcc   uint64 // bytes towards the next byte-counter event

	st Stats
}

// NewDCQCN returns a reaction point at line rate, or the error of
// p.Validate.
func NewDCQCN(p Params) (*DCQCN, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &DCQCN{p: p, rc: p.LineRate, rt: p.LineRate}, nil
}

// Params returns the parameters the controller was created with.
func (c *DCQCN) Params() Params { return c.p }

// Rate returns the current rate RC in bits/s.
func (c *DCQCN) Rate() uint64 { return c.rc }

// Stats returns the state and counters as of the last call.
func (c *DCQCN) Stats() Stats {
	s := c.st
	s.Rate, s.Target = c.rc, c.rt
	s.Alpha, _, _ = c.alphaState(c.now)
	return s
}

// NextEvent returns the earlier of a deferred cut and the next
// rate-increase timer event. Alpha needs no event: it is brought up to date
// lazily whenever it is used.
func (c *DCQCN) NextEvent() (time.Duration, bool) {
	if c.pendingCut {
		at := c.lastCut + c.p.RateReduceMonitorPeriod
		if c.timerOn && c.nextTimer < at {
			return c.nextTimer, true
		}
		return at, true
	}
	if c.timerOn {
		return c.nextTimer, true
	}
	return 0, false
}

// Advance runs the deferred cut and timer events due at or before now.
func (c *DCQCN) Advance(now time.Duration) { c.advance(now) }

// advance clamps now to the latest time seen, runs due events in time order
// and returns the clamped time.
func (c *DCQCN) advance(now time.Duration) time.Duration {
	if now < c.now {
		now = c.now
	}
	c.now = now
	for n := 0; ; n++ {
		at, ok := c.NextEvent()
		if !ok || at > now {
			return now
		}
		if n == maxCatchUp {
			c.recover()
			return now
		}
		if c.pendingCut && at == c.lastCut+c.p.RateReduceMonitorPeriod {
			c.cut(at)
		} else {
			c.t++
			c.nextTimer = at + c.p.TimeReset
			c.increase()
		}
	}
}

// OnCNP handles a CNP: the first one starts alpha; a cut happens now if the
// monitor period since the last cut has passed, else once at its end.
func (c *DCQCN) OnCNP(now time.Duration) {
	now = c.advance(now)
	c.st.CNPs++
	if !c.started {
		// The first CNP sets alpha and does not itself count as a CNP
		// in the alpha period, as in NVIDIA's model.
		c.started = true
		c.alpha, c.alphaAt = c.p.InitialAlpha, now
		if r := c.p.RateOnFirstCNP; r > 0 {
			c.rc, c.rt = max(r, c.p.MinRate), max(r, c.p.MinRate)
			c.afterCut(now)
			return
		}
	} else {
		c.updateAlpha(now)
		if !c.p.AlphaOnCNP {
			c.cnpInPeriod = true
		}
	}
	if c.pendingCut {
		return
	}
	if !c.cutDone || now-c.lastCut >= c.p.RateReduceMonitorPeriod {
		c.cut(now)
		return
	}
	c.pendingCut = true
}

// OnSent feeds the byte counter. Bytes sent at line rate are not counted:
// the counter only matters while the rate is being recovered.
func (c *DCQCN) OnSent(now time.Duration, bytes int) {
	c.advance(now)
	if bytes <= 0 || c.p.ByteReset == 0 || c.rc >= c.p.LineRate {
		return
	}
	c.byteAcc += uint64(bytes)
	for n := 0; c.byteAcc >= c.p.ByteReset; n++ {
		if n == maxCatchUp {
			c.recover()
			return
		}
		c.byteAcc -= c.p.ByteReset
		c.bc++
		c.increase()
		if c.rc >= c.p.LineRate {
			return
		}
	}
}

// cut is the rate decrease: RT = RC (per the clamp rules), then
// RC = RC * (1 - alpha/2^(GD-10)), bounded by MinDecreaseFactor and MinRate.
func (c *DCQCN) cut(at time.Duration) {
	c.updateAlpha(at)
	// RT follows RC always (paper), after any increase since the last
	// cut (NVIDIA default), or only after byte-counter increases, as in
	// the DCQCN authors' ns-3 model of the NIC.
	if c.p.ClampTargetRate || c.bc > 0 || (c.p.ClampTargetRateAfterTimeInc && c.t > 0) {
		c.rt = c.rc
	}
	dec := math.Ldexp(c.alpha, 10-int(c.p.GD))
	nr := uint64(float64(c.rc) * (1 - dec))
	if floor := c.rc * uint64(c.p.MinDecreaseFactor) / 100; nr < floor {
		nr = floor
	}
	c.rc = max(nr, c.p.MinRate)
	if c.p.AlphaOnCNP {
		c.alpha = (1-c.p.G)*c.alpha + c.p.G
		c.alphaAt = at
	}
	c.afterCut(at)
}

// afterCut resets the increase machinery after any rate decrease.
func (c *DCQCN) afterCut(at time.Duration) {
	c.st.Cuts++
	c.cutDone, c.lastCut, c.pendingCut = true, at, false
	c.t, c.bc, c.byteAcc = 0, 0, 0
	c.timerOn = c.rc < c.p.LineRate && c.p.TimeReset > 0
	c.nextTimer = at + c.p.TimeReset
}

// increase runs one rate-increase event after c.t or c.bc was incremented.
// A disabled counter stays at 0, so with one counter disabled there is no
// hyper increase.
func (c *DCQCN) increase() {
	lo, hi := min(c.t, c.bc), max(c.t, c.bc)
	f := uint64(c.p.Threshold)
	switch {
	case hi <= f:
		c.st.FastRecovery++
	case lo > f:
		c.st.HyperIncrease++
		c.rt = addCapped(c.rt, lo-f, c.p.HAIRate, c.p.LineRate)
	default:
		c.st.AdditiveIncrease++
		c.rt = addCapped(c.rt, 1, c.p.AIRate, c.p.LineRate)
	}
	// Round up so RC reaches RT exactly instead of stalling one below.
	c.rc += (c.rt - c.rc + 1) / 2
	if c.rc >= c.p.LineRate {
		c.recover()
	}
}

// recover puts the QP back at line rate with no timer running.
func (c *DCQCN) recover() {
	c.rc, c.rt = c.p.LineRate, c.p.LineRate
	c.timerOn, c.byteAcc = false, 0
}

// addCapped returns min(r + n*step, limit) without overflowing.
func addCapped(r, n, step, limit uint64) uint64 {
	if r >= limit {
		return limit
	}
	if step != 0 && n > (limit-r)/step {
		return limit
	}
	return r + n*step
}

// updateAlpha brings alpha up to date at now.
func (c *DCQCN) updateAlpha(now time.Duration) {
	c.alpha, c.alphaAt, c.cnpInPeriod = c.alphaState(now)
}

// alphaState computes, without changing c, alpha, its update boundary and the
// CNP flag after every AlphaPeriod boundary up to now. The first boundary
// raises alpha if a CNP arrived in its period (NVIDIA rule); every other
// boundary decays it, which also is the paper rule's "no CNP for K".
func (c *DCQCN) alphaState(now time.Duration) (float64, time.Duration, bool) {
	if !c.started || now < c.alphaAt+c.p.AlphaPeriod {
		return c.alpha, c.alphaAt, c.cnpInPeriod
	}
	n := int64((now - c.alphaAt) / c.p.AlphaPeriod)
	a, g, decays := c.alpha, c.p.G, n
	if c.cnpInPeriod {
		a = (1-g)*a + g
		decays--
	}
	if decays > 0 {
		a *= math.Pow(1-g, float64(decays))
	}
	return a, c.alphaAt + time.Duration(n)*c.p.AlphaPeriod, false
}
