package harness

import (
	"context"
	"runtime/trace"
	"slices"
	"time"
)

// window times a measurement: a warm-up, then the measured interval,
// whose start it announces to the other side (peer.markStart).
type window struct {
	c     Case
	p     *peer
	start time.Time // the measured interval's start, once it began
	on    bool
	begin time.Time
}

func (p *peer) newWindow() *window { return &window{c: p.c, p: p, begin: time.Now()} }

// tick reports the phase at now: false, false while warming up; true,
// false while measuring; done when the interval is over. The first tick
// in the measured interval sets the start.
func (w *window) tick(now time.Time) (measuring, done bool) {
	if !w.on {
		if now.Sub(w.begin) < w.c.Warmup {
			return false, false
		}
		w.on, w.start = true, now
		w.p.markStart()
	}
	return true, now.Sub(w.start) >= w.c.Duration
}

// elapsed is the measured time up to now.
func (w *window) elapsed(now time.Time) time.Duration { return now.Sub(w.start) }

// percentiles returns the 50th and 99th percentile of samples (sorted in
// place).
func percentiles(s []time.Duration) (p50, p99 time.Duration) {
	if len(s) == 0 {
		return 0, 0
	}
	slices.Sort(s)
	return s[len(s)/2], s[min(len(s)-1, len(s)*99/100)]
}

// roundTrips runs round after round until the measurement window closes,
// timing those inside it, and returns their latency percentiles and the
// CPU time spent: the loop every latency case shares.
func (p *peer) roundTrips(round func() error) (Result, error) {
	samples := make([]time.Duration, 0, 1<<20)
	w := p.newWindow()
	var res Result
	for {
		t0 := time.Now()
		if err := round(); err != nil {
			return res, err
		}
		now := time.Now()
		res.Rounds++
		measuring, done := w.tick(now)
		if trace.IsEnabled() {
			trace.Log(context.Background(), "round trip", "") // counted by bench/roundtrips.sh
		}
		if measuring && len(samples) < cap(samples) {
			samples = append(samples, now.Sub(t0))
		}
		if done {
			res.Elapsed = w.elapsed(now)
			res.CPU = p.cpu()
			break
		}
	}
	res.Samples = len(samples)
	res.P50, res.P99 = percentiles(samples)
	return res, nil
}
