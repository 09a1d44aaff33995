package congestion

import (
	"math"
	"testing"
	"time"
)

const us = time.Microsecond

// testParams is a base with round numbers so traces can be computed by
// hand: 10 Gb/s, alpha pinned at 1 (InitialAlpha 1 and an alpha period far
// longer than any trace, so it never decays), every cut clamps RT = RC.
func testParams() Params {
	return Params{
		LineRate:        10 * Gbps,
		MinRate:         1 * Mbps,
		AIRate:          5 * Mbps,
		HAIRate:         50 * Mbps,
		TimeReset:       100 * us,
		ByteReset:       10_000,
		Threshold:       1,
		G:               1.0 / 256,
		AlphaPeriod:     time.Second,
		InitialAlpha:    1,
		AlphaOnCNP:      true,
		GD:              11,
		ClampTargetRate: true,
	}
}

func newTest(t *testing.T, p Params) *DCQCN {
	t.Helper()
	c, err := NewDCQCN(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// want checks current and target rate.
func want(t *testing.T, c *DCQCN, step string, rc, rt uint64) {
	t.Helper()
	s := c.Stats()
	if s.Rate != rc || s.Target != rt || c.Rate() != rc {
		t.Fatalf("%s: RC=%d RT=%d, want RC=%d RT=%d", step, s.Rate, s.Target, rc, rt)
	}
}

func wantNext(t *testing.T, c *DCQCN, step string, at time.Duration, ok bool) {
	t.Helper()
	gotAt, gotOK := c.NextEvent()
	if gotOK != ok || (ok && gotAt != at) {
		t.Fatalf("%s: NextEvent=(%v,%v), want (%v,%v)", step, gotAt, gotOK, at, ok)
	}
}

func TestDCQCNStartsAtLineRateIdle(t *testing.T) {
	c := newTest(t, NVIDIAParams(25*Gbps))
	want(t, c, "new", 25*Gbps, 25*Gbps)
	wantNext(t, c, "new", 0, false)
	c.OnSent(time.Second, 1<<20)
	c.Advance(2 * time.Second)
	want(t, c, "after traffic without CNP", 25*Gbps, 25*Gbps)
	if s := c.Stats(); s.Cuts != 0 || s.FastRecovery+s.AdditiveIncrease+s.HyperIncrease != 0 {
		t.Fatalf("stats changed without CNP: %+v", s)
	}
}

// Trace A: the paper's alpha rule, timer only (byte counter disabled, so no
// hyper increase): decrease, alpha decay, fast recovery, additive increase.
func TestDCQCNTraceTimerOnly(t *testing.T) {
	p := testParams()
	p.ByteReset = 0
	p.TimeReset = 300 * us
	p.AlphaPeriod = 55 * us
	c := newTest(t, p)

	// t=0 first CNP: alpha = InitialAlpha = 1; RT = RC = 10e9;
	// RC = 10e9 * (1 - 1/2) = 5e9; alpha = (255/256)*1 + 1/256 = 1.
	c.OnCNP(0)
	want(t, c, "t=0 cut", 5e9, 10e9)
	wantNext(t, c, "t=0", 300*us, true)

	// t=100us CNP: alpha decayed once (55us boundary): 255/256.
	// RT = RC = 5e9; RC = 5e9 * (1 - 255/512) = 5e9/512*257 = 9765625*257
	// = 2509765625. alpha = (255/256)^2 + 1/256 = 65025/65536 + 256/65536
	// = 65281/65536. The timer restarts: next event at 400us.
	c.OnCNP(100 * us)
	want(t, c, "t=100us cut", 2509765625, 5e9)
	if a := c.Stats().Alpha; a != 65281.0/65536 {
		t.Fatalf("alpha after second cut = %v, want 65281/65536", a)
	}
	wantNext(t, c, "t=100us", 400*us, true)

	// t=400us timer T=1 <= F=1: fast recovery.
	// RC = 2509765625 + ceil((5e9 - 2509765625)/2) = 2509765625 + ceil(2490234375/2)
	//    = 2509765625 + 1245117188 = 3754882813.
	c.Advance(400 * us)
	want(t, c, "t=400us FR", 3754882813, 5e9)

	// t=700us T=2 > F, BC=0 <= F: additive. RT = 5e9 + 5e6 = 5005000000;
	// RC = 3754882813 + ceil(1250117187/2) = 3754882813 + 625058594 = 4379941407.
	c.Advance(700 * us)
	want(t, c, "t=700us AI", 4379941407, 5005000000)

	// t=1000us T=3: additive. RT = 5010000000;
	// RC = 4379941407 + ceil(630058593/2) = 4379941407 + 315029297 = 4694970704.
	c.Advance(1000 * us)
	want(t, c, "t=1000us AI", 4694970704, 5010000000)
	wantNext(t, c, "t=1000us", 1300*us, true)

	// Alpha since its last update at 100us: floor(900/55) = 16 decays.
	wantAlpha := 65281.0 / 65536 * math.Pow(255.0/256, 16)
	s := c.Stats()
	if math.Abs(s.Alpha-wantAlpha) > 1e-12 {
		t.Fatalf("alpha at 1000us = %v, want %v", s.Alpha, wantAlpha)
	}
	if s.CNPs != 2 || s.Cuts != 2 || s.FastRecovery != 1 || s.AdditiveIncrease != 2 || s.HyperIncrease != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// Trace C: byte counter and timer together reach hyper increase.
func TestDCQCNTraceByteCounterHyper(t *testing.T) {
	c := newTest(t, testParams()) // TimeReset 100us, ByteReset 10000 B, F=1

	// t=0: RC = 10e9/2 = 5e9, RT = 10e9. Timer at 100us.
	c.OnCNP(0)
	want(t, c, "t=0 cut", 5e9, 10e9)

	// t=10us 10000 B: BC=1, max(T,BC)=1 <= F: fast recovery.
	// RC = 5e9 + ceil(5e9/2) = 7.5e9.
	c.OnSent(10*us, 10_000)
	want(t, c, "t=10us FR", 7.5e9, 10e9)

	// t=20us CNP: RT = RC = 7.5e9; RC = 3.75e9. Counters reset, timer at 120us.
	c.OnCNP(20 * us)
	want(t, c, "t=20us cut", 3.75e9, 7.5e9)
	wantNext(t, c, "t=20us", 120*us, true)

	// t=30us 25000 B: two byte events, 5000 B left over.
	// BC=1: FR, RC = 3.75e9 + 1.875e9 = 5.625e9.
	// BC=2: max=2 > F, min=T=0: additive, RT = 7.505e9,
	//       RC = 5.625e9 + ceil(1.88e9/2) = 6.565e9.
	c.OnSent(30*us, 25_000)
	want(t, c, "t=30us FR+AI", 6.565e9, 7.505e9)

	// t=120us timer T=1: min(T,BC)=1 <= F: additive. RT = 7.51e9,
	// RC = 6.565e9 + ceil(0.945e9/2) = 6.565e9 + 472500000 = 7.0375e9.
	c.Advance(120 * us)
	want(t, c, "t=120us AI", 7.0375e9, 7.51e9)

	// t=220us T=2: min=2 > F: hyper with i = 2-1 = 1. RT = 7.51e9 + 50e6
	// = 7.56e9; RC = 7.0375e9 + ceil(0.5225e9/2) = 7.0375e9 + 261250000 = 7.29875e9.
	c.Advance(220 * us)
	want(t, c, "t=220us HI", 7.29875e9, 7.56e9)

	// t=230us 5000 B completes 10000: BC=3, min(2,3)=2, i=1. RT = 7.61e9,
	// RC = 7.29875e9 + ceil(0.31125e9/2) = 7.29875e9 + 155625000 = 7.454375e9.
	c.OnSent(230*us, 5_000)
	want(t, c, "t=230us HI", 7.454375e9, 7.61e9)

	// t=320us T=3: min(3,3)=3, i=2. RT = 7.61e9 + 2*50e6 = 7.71e9,
	// RC = 7.454375e9 + ceil(0.255625e9/2) = 7.454375e9 + 127812500 = 7.5821875e9.
	c.Advance(320 * us)
	want(t, c, "t=320us HI i=2", 7.5821875e9, 7.71e9)
	wantNext(t, c, "t=320us", 420*us, true)

	s := c.Stats()
	if s.CNPs != 2 || s.Cuts != 2 || s.FastRecovery != 2 || s.AdditiveIncrease != 2 || s.HyperIncrease != 3 {
		t.Fatalf("stats %+v", s)
	}
}

// Recovery is capped at line rate and then stops all timers.
func TestDCQCNLineRateCap(t *testing.T) {
	p := testParams()
	p.ByteReset = 0
	c := newTest(t, p)
	c.OnCNP(0) // RC = 5e9, RT = 10e9 (= line rate: increases cannot raise it)
	// Each event halves the gap RT-RC rounding the new gap down:
	// 5e9 -> floor(5e9/2^k). 2^32 <= 5e9 < 2^33, so after 32 events the gap
	// is 1 and after 33 it is 0: line rate at 33*100us = 3.3ms.
	c.Advance(3200 * us)
	want(t, c, "after 32 events", 10e9-1, 10e9)
	wantNext(t, c, "after 32 events", 3300*us, true)
	c.Advance(3300 * us)
	want(t, c, "after 33 events", 10e9, 10e9)
	wantNext(t, c, "at line rate", 0, false)
	c.OnSent(3400*us, 1<<20) // not counted at line rate
	c.Advance(time.Second)
	want(t, c, "later", 10e9, 10e9)
	if s := c.Stats(); s.FastRecovery != 1 || s.AdditiveIncrease != 32 {
		t.Fatalf("stats %+v, want 1 FR + 32 AI", s)
	}
}

// A QP silent for longer than maxCatchUp timer periods returns to line rate
// in one bounded call.
func TestDCQCNLongSilenceBounded(t *testing.T) {
	p := testParams()
	p.ByteReset, p.AIRate, p.ClampTargetRate = 0, 1, true
	p.MinRate = 1
	c := newTest(t, p)
	c.OnCNP(0)
	c.OnCNP(1)           // RT = RC = 5e9: only +1 b/s per additive step
	c.Advance(time.Hour) // 36e6 timer periods due
	want(t, c, "after an hour", 10e9, 10e9)
	wantNext(t, c, "after an hour", 0, false)
}

func TestDCQCNMinRateFloor(t *testing.T) {
	p := testParams()
	p.MinRate = 1 * Gbps
	c := newTest(t, p)
	// Alpha is 1: every CNP halves RC. 10e9 -> 5e9 -> 2.5e9 -> 1.25e9 ->
	// 0.625e9, floored to 1e9 -> 0.5e9, floored to 1e9.
	for i, rc := range []uint64{5e9, 2.5e9, 1.25e9, 1e9, 1e9} {
		c.OnCNP(time.Duration(i) * us)
		if c.Rate() != rc {
			t.Fatalf("after CNP %d: RC=%d, want %d", i+1, c.Rate(), rc)
		}
	}
}

// CNPs inside rate_reduce_monitor_period are coalesced into one cut at the
// end of the period.
func TestDCQCNMonitorPeriodCoalesces(t *testing.T) {
	p := testParams()
	p.RateReduceMonitorPeriod = 4 * us
	c := newTest(t, p)

	c.OnCNP(0) // cut: RC = 5e9, RT = 10e9
	want(t, c, "t=0", 5e9, 10e9)
	c.OnCNP(1 * us)
	c.OnCNP(2 * us)
	c.OnCNP(3 * us)
	want(t, c, "t=3us, coalesced", 5e9, 10e9)
	wantNext(t, c, "pending cut", 4*us, true)
	// t=4us: one cut for the three CNPs: RT = RC = 5e9, RC = 2.5e9.
	c.Advance(4 * us)
	want(t, c, "t=4us deferred cut", 2.5e9, 5e9)
	wantNext(t, c, "after deferred cut", 104*us, true)
	// t=9us is 5us after the last cut: immediate cut, RC = 1.25e9.
	c.OnCNP(9 * us)
	want(t, c, "t=9us", 1.25e9, 2.5e9)
	if s := c.Stats(); s.CNPs != 5 || s.Cuts != 3 {
		t.Fatalf("CNPs=%d Cuts=%d, want 5 and 3", s.CNPs, s.Cuts)
	}
}

// NVIDIA's alpha rule: alpha changes only at period boundaries, rising if a
// CNP arrived in the period that ends.
func TestDCQCNAlphaPeriodic(t *testing.T) {
	p := testParams()
	p.AlphaOnCNP = false
	p.AlphaPeriod = 10 * us
	c := newTest(t, p)
	const g = 1.0 / 256

	// First CNP: alpha = 1 (does not count as a CNP in [0,10us)).
	// Cut with alpha 1: RC = 5e9.
	c.OnCNP(0)
	want(t, c, "t=0", 5e9, 10e9)

	// Boundaries at 10 and 20us without CNP: alpha = (255/256)^2 = 65025/65536.
	// The CNP at 25us cuts with that alpha: RT = RC = 5e9,
	// RC = 5e9 * (1 - 65025/131072) = 5e9 * 66047/131072
	//    = 2519493103.02734375 -> 2519493103.
	c.OnCNP(25 * us)
	want(t, c, "t=25us", 2519493103, 5e9)
	a := (1 - g) * (1 - g)
	if got := c.Stats().Alpha; math.Abs(got-a) > 1e-15 {
		t.Fatalf("alpha at 25us = %v, want %v", got, a)
	}

	// Boundary at 30us ends a period with a CNP: alpha = (1-g)a + g.
	c.Advance(30 * us)
	a = (1-g)*a + g
	if got := c.Stats().Alpha; math.Abs(got-a) > 1e-15 {
		t.Fatalf("alpha at 30us = %v, want %v", got, a)
	}
	// Boundaries at 40 and 50us without CNP: two decays.
	c.Advance(59 * us)
	a *= (1 - g) * (1 - g)
	if got := c.Stats().Alpha; math.Abs(got-a) > 1e-15 {
		t.Fatalf("alpha at 59us = %v, want %v", got, a)
	}
}

// Without ClampTargetRate, a cut sets RT = RC only if the rate was raised
// since the previous cut: by the byte counter, or (NVIDIA's default
// ClampTargetRateAfterTimeInc) by the timer too.
func TestDCQCNClampRules(t *testing.T) {
	p := testParams()
	p.ClampTargetRate = false
	p.TimeReset = 300 * us

	// Byte-counter increases only.
	c := newTest(t, p)
	c.OnCNP(0) // RC = 5e9, RT stays 10e9
	// t=300us timer T=1, FR: RC = 5e9 + 2.5e9 = 7.5e9.
	c.Advance(300 * us)
	want(t, c, "t=300us FR", 7.5e9, 10e9)
	// t=310us: only the timer raised the rate: RT stays, RC = 3.75e9.
	c.OnCNP(310 * us)
	want(t, c, "t=310us no clamp", 3.75e9, 10e9)
	// t=320us byte event BC=1, FR: RC = 3.75e9 + ceil(6.25e9/2) = 6.875e9.
	c.OnSent(320*us, 10_000)
	// t=330us: the byte counter raised it: RT = 6.875e9, RC = 3.4375e9.
	c.OnCNP(330 * us)
	want(t, c, "t=330us clamp after byte increase", 3.4375e9, 6.875e9)

	// NVIDIA default: timer increases count too.
	p.ClampTargetRateAfterTimeInc = true
	c = newTest(t, p)
	c.OnCNP(0)
	// t=10us: no increase since the last cut: RT stays, RC = 2.5e9.
	c.OnCNP(10 * us)
	want(t, c, "t=10us no clamp", 2.5e9, 10e9)
	// t=310us timer T=1, FR: RC = 2.5e9 + ceil(7.5e9/2) = 6.25e9.
	c.Advance(310 * us)
	want(t, c, "t=310us FR", 6.25e9, 10e9)
	// t=320us: the timer raised it: RT = 6.25e9, RC = 3.125e9.
	c.OnCNP(320 * us)
	want(t, c, "t=320us clamp after timer increase", 3.125e9, 6.25e9)
}

func TestDCQCNGDAndMinDecreaseFactor(t *testing.T) {
	p := testParams()
	p.GD = 10 // cut by alpha/1: with alpha 1 the rate would drop to 0
	p.MinDecreaseFactor = 25
	c := newTest(t, p)
	c.OnCNP(0) // max(10e9 * 0, 10e9 * 25/100) = 2.5e9
	want(t, c, "GD=10", 2.5e9, 10e9)

	p.GD = 12 // alpha/4: 10e9 * 3/4
	p.MinDecreaseFactor = 0
	c = newTest(t, p)
	c.OnCNP(0)
	want(t, c, "GD=12", 7.5e9, 10e9)
}

func TestDCQCNRateOnFirstCNP(t *testing.T) {
	p := testParams()
	p.RateOnFirstCNP = 2 * Gbps
	c := newTest(t, p)
	c.OnCNP(0) // RC = RT = 2e9 instead of a cut
	want(t, c, "first CNP", 2e9, 2e9)
	c.OnCNP(1 * us) // normal cut: RT = RC = 2e9, RC = 1e9
	want(t, c, "second CNP", 1e9, 2e9)
}

// Time going backwards is treated as the latest time seen.
func TestDCQCNTimeNeverGoesBack(t *testing.T) {
	p := testParams()
	p.RateReduceMonitorPeriod = 4 * us
	c := newTest(t, p)
	c.OnCNP(10 * us)
	c.OnCNP(5 * us) // treated as 10us: inside the monitor period
	want(t, c, "after stale CNP", 5e9, 10e9)
	wantNext(t, c, "pending", 14*us, true)
}

func TestDCQCNIgnoresBadSizes(t *testing.T) {
	c := newTest(t, testParams())
	c.OnCNP(0)
	c.OnSent(1*us, 0)
	c.OnSent(1*us, -50_000)
	want(t, c, "bad sizes", 5e9, 10e9)
}

func TestParamsValidate(t *testing.T) {
	for _, p := range []Params{NVIDIAParams(100 * Gbps), PaperParams(40 * Gbps), testParams()} {
		if err := p.Validate(); err != nil {
			t.Fatalf("preset invalid: %v", err)
		}
	}
	bad := map[string]func(*Params){
		"LineRate":       func(p *Params) { p.LineRate = 0 },
		"MinRate0":       func(p *Params) { p.MinRate = 0 },
		"MinRateHigh":    func(p *Params) { p.MinRate = p.LineRate + 1 },
		"TimeReset":      func(p *Params) { p.TimeReset = -1 },
		"NoIncrease":     func(p *Params) { p.TimeReset, p.ByteReset = 0, 0 },
		"G0":             func(p *Params) { p.G = 0 },
		"GNaN":           func(p *Params) { p.G = math.NaN() },
		"G2":             func(p *Params) { p.G = 2 },
		"AlphaPeriod":    func(p *Params) { p.AlphaPeriod = 0 },
		"InitialAlpha":   func(p *Params) { p.InitialAlpha = 1.5 },
		"Monitor":        func(p *Params) { p.RateReduceMonitorPeriod = -1 },
		"GDLow":          func(p *Params) { p.GD = 9 },
		"GDHigh":         func(p *Params) { p.GD = 32 },
		"MinDecFac":      func(p *Params) { p.MinDecreaseFactor = 101 },
		"RateOnFirstCNP": func(p *Params) { p.RateOnFirstCNP = p.LineRate + 1 },
		"AIRate":         func(p *Params) { p.AIRate = p.LineRate + 1 },
	}
	for name, mutate := range bad {
		p := NVIDIAParams(10 * Gbps)
		mutate(&p)
		if c, err := NewDCQCN(p); err == nil || c != nil {
			t.Errorf("%s: NewDCQCN accepted invalid params", name)
		}
	}
	np := NVIDIANPParams()
	if err := np.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, m := range []func(*NPParams){
		func(p *NPParams) { p.MinTimeBetweenCNPs = -1 },
		func(p *NPParams) { p.CNPDSCP = 64 },
		func(p *NPParams) { p.CNPPriority = 8 },
	} {
		q := np
		m(&q)
		if q.Validate() == nil {
			t.Errorf("invalid NPParams %+v accepted", q)
		}
	}
}

// The presets carry the documented values.
func TestPresets(t *testing.T) {
	n := NVIDIAParams(100 * Gbps)
	if n.TimeReset != 300*us || n.ByteReset != 32767 || n.AIRate != 5e6 || n.HAIRate != 50e6 ||
		n.Threshold != 1 || n.G != 5.0/1024 || n.AlphaPeriod != 1*us || n.InitialAlpha != 1023.0/1024 ||
		n.MinRate != 1e6 || n.RateReduceMonitorPeriod != 4*us || n.GD != 11 || n.MinDecreaseFactor != 50 ||
		n.ClampTargetRate || !n.ClampTargetRateAfterTimeInc || n.AlphaOnCNP {
		t.Errorf("NVIDIA preset %+v", n)
	}
	if np := NVIDIANPParams(); np.MinTimeBetweenCNPs != 4*us || np.CNPDSCP != 48 || np.CNPPriority != 6 {
		t.Errorf("NVIDIA NP preset %+v", np)
	}
	pp := PaperParams(40 * Gbps)
	if pp.G != 1.0/256 || pp.TimeReset != 55*us || pp.AlphaPeriod != 55*us || pp.ByteReset != 10e6 ||
		pp.Threshold != 5 || pp.AIRate != 40e6 || pp.HAIRate != 200e6 || !pp.ClampTargetRate || !pp.AlphaOnCNP {
		t.Errorf("paper preset %+v", pp)
	}
	if PaperNPParams().MinTimeBetweenCNPs != 50*us {
		t.Errorf("paper NP preset %+v", PaperNPParams())
	}
}

func TestNone(t *testing.T) {
	var c Controller = NewNone(25 * Gbps)
	c.OnCNP(0)
	c.OnCNP(1)
	c.OnSent(2, 1500)
	c.Advance(time.Second)
	if _, ok := c.NextEvent(); ok || c.Rate() != 25*Gbps {
		t.Fatalf("None changed: rate %d", c.Rate())
	}
	if s := c.Stats(); s.CNPs != 2 || s.Rate != 25*Gbps || s.Target != 25*Gbps || s.Cuts != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestNVIDIACNPTrainReachesMinRate: with ConnectX's defaults, a train of
// CNPs 50 µs apart (what `rxego probe`'s cnp-rate scenario sends), each
// taken at its own arrival time, drives the rate down to MinRate: alpha
// decays every microsecond between them, but every CNP is a cut. (The
// probe found rxego's engine far slower to react when it took a receive
// batch's CNPs at one time, most of them in one rate-reduce monitor
// period; qp's TestCNPsOfABatchEachCut covers the fix.)
func TestNVIDIACNPTrainReachesMinRate(t *testing.T) {
	p := NVIDIAParams(100 * Gbps)
	c, err := NewDCQCN(p)
	if err != nil {
		t.Fatal(err)
	}
	lowest := c.Rate()
	for i := range 1000 {
		c.OnCNP(time.Duration(i) * 50 * time.Microsecond)
		lowest = min(lowest, c.Rate())
	}
	if st := c.Stats(); st.Cuts != 1000 {
		t.Errorf("%d cuts for 1000 CNPs 50 µs apart, want one each", st.Cuts)
	}
	if lowest != p.MinRate {
		t.Errorf("lowest rate %d bit/s during the train, want MinRate %d", lowest, p.MinRate)
	}
}
