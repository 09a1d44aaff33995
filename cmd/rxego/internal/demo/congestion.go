package demo

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rxego/rxego/cmd/rxego/internal/progress"
	"github.com/rxego/rxego/congestion"
	"github.com/rxego/rxego/qp"
)

// The congestion scenario's shape.
const (
	ccLineRate  = 10 * congestion.Gbps // DCQCN's line rate in the demo
	ccMsg       = 4 << 10              // bytes per WRITE
	ccDepth     = 8                    // WRITEs in flight
	ccSample    = 200 * time.Microsecond
	ccChartRows = 16
)

// Defaults of Options.CongestionMark and CongestionRecoverMax.
const (
	// DefaultCongestionMark is how long the switch marks packets.
	DefaultCongestionMark = 10 * time.Millisecond
	// DefaultCongestionRecoverMax bounds the recovery phase.
	DefaultCongestionRecoverMax = 3 * time.Second
)

// demoCongestion is the DCQCN configuration of the demo's devices: the
// DCQCN paper's parameters for a 10 Gb/s port. NVIDIA's defaults let
// alpha decay within microseconds, so on a loopback link, where CNPs come
// in bursts a few hundred microseconds apart, each cut is a few percent
// and the rate hardly moves; the paper's show the reaction plainly.
func demoCongestion() *qp.CongestionConfig {
	return &qp.CongestionConfig{RP: congestion.PaperParams(ccLineRate), NP: congestion.PaperNPParams()}
}

// rateSample is Alice's QP's DCQCN state at one moment.
type rateSample struct {
	at   time.Time
	rate uint64
	cnps uint64
}

// congestion streams WRITEs from Alice to Bob while a "switch" marks them
// CE, then with the marking off: Bob's notification point answers marks
// with CNPs, Alice's reaction point cuts her rate, and once the CNPs stop
// her rate climbs back.
func (t *Tour) congestion() error {
	a, b := t.a, t.b
	cs0, ok := a.qp.CongestionStats()
	if !ok {
		return errors.New("DCQCN is off")
	}
	cnpSent0 := b.dev.Stats().CNPsSent
	t.say("%s streams %d KiB RDMA WRITEs to %s, %d at a time. DCQCN runs on both: data packets are", a.name, ccMsg>>10, b.name, ccDepth)
	t.say("ECN-capable (ECT(0)), %s's rate starts at the line rate (%s).", a.name, gbps(cs0.Rate))
	markFor, recoverMax := t.opts.CongestionMark, t.opts.CongestionRecoverMax
	if markFor <= 0 {
		markFor = DefaultCongestionMark
	}
	if recoverMax <= 0 {
		recoverMax = DefaultCongestionRecoverMax
	}
	t.say("First a congested switch marks every packet Congestion Experienced (CE) for %v;", markFor)
	t.say("%s answers marks with Congestion Notification Packets (CNPs), at most one per %v;", b.name, congestion.PaperNPParams().MinTimeBetweenCNPs)
	t.say("each CNP makes %s cut her rate. Then the marking stops and the rate recovers.", a.name)

	var mu sync.Mutex
	samples := []rateSample{{time.Now(), cs0.Rate, cs0.CNPsRcvd}}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(ccSample)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			if cs, ok := a.qp.CongestionStats(); ok {
				mu.Lock()
				samples = append(samples, rateSample{time.Now(), cs.Rate, cs.CNPsRcvd})
				mu.Unlock()
			}
		}
	}()
	sent := 0
	phase := "marking"
	rep := progress.Start(t.opts.Progress, t.opts.Progress != nil, func() string {
		cs, _ := a.qp.CongestionStats()
		return fmt.Sprintf("congestion: %s, %d WRITEs, rate %s", phase, sent, gbps(cs.Rate))
	})
	start := time.Now()
	t.marking.marking.Store(true)
	t.annotate("the switch starts marking CE")
	err := t.stream(&sent, func() bool { return time.Since(start) > markFor })
	t.marking.marking.Store(false)
	t.annotate("the switch stops marking")
	// Samples taken here too, so the chart has the end of each phase even
	// when the sampler seldom runs on a busy machine.
	sample := func() uint64 {
		cs, _ := a.qp.CongestionStats()
		mu.Lock()
		samples = append(samples, rateSample{time.Now(), cs.Rate, cs.CNPsRcvd})
		mu.Unlock()
		return cs.Rate
	}
	var low uint64
	if err == nil {
		low = sample()
		phase = "recovering"
		deadline := time.Now().Add(recoverMax)
		err = t.stream(&sent, func() bool {
			cs, _ := a.qp.CongestionStats()
			return cs.Rate >= cs0.Rate*9/10 || time.Now().After(deadline)
		})
	}
	rep.Stop()
	close(stop)
	<-done
	sample()
	slices.SortFunc(samples, func(x, y rateSample) int { return x.at.Compare(y.at) })
	if err != nil {
		return err
	}
	cs, _ := a.qp.CongestionStats()
	cnps := b.dev.Stats().CNPsSent - cnpSent0
	t.annotateRates(samples)
	t.say("%s sent %d CNPs; %s's reaction point handled %d and cut her rate %d times, down to %s.",
		b.name, cnps, a.name, cs.CNPsRcvd-cs0.CNPsRcvd, cs.RateCuts-cs0.RateCuts, gbps(minRate(samples, low)))
	if cnps == 0 || cs.RateCuts == cs0.RateCuts {
		return fmt.Errorf("no congestion reaction: %d CNPs, %d cuts", cnps, cs.RateCuts-cs0.RateCuts)
	}
	t.say("With the marks gone, the rate climbed back (fast recovery towards the target, then additive and")
	t.say("hyper increase every %v): %s, %s after the marking began; %d WRITEs in all.", demoCongestion().RP.TimeReset,
		gbps(cs.Rate), time.Since(start).Round(100*time.Microsecond), sent)
	t.chart(samples)
	t.say("\nThe ladder below is %s's capture: a packet's time is when her device sent it or took it in. Received", a.name)
	t.say("packets are taken in batches, so CNPs that %s sent at least %v apart can share one time there.", b.name,
		congestion.PaperNPParams().MinTimeBetweenCNPs)
	return nil
}

// stream keeps ccDepth WRITEs in flight until enough reports true (it is
// asked before each WRITE), then waits for the ones in flight.
func (t *Tour) stream(sent *int, enough func() bool) error {
	a, b := t.a, t.b
	inflight := 0
	for {
		for inflight < ccDepth && !enough() {
			off := (*sent % 2) * ccMsg
			if err := a.qp.PostSend(writeWR(a, b, 100, off, 32<<10+off, ccMsg)); err != nil {
				return err
			}
			inflight++
			*sent++
		}
		if inflight == 0 {
			return nil
		}
		if _, err := wait(a); err != nil {
			return err
		}
		inflight--
	}
}

// annotateRates marks the ladder where the rate first fell, where it was
// lowest and where it was back.
func (t *Tour) annotateRates(s []rateSample) {
	if len(s) < 2 {
		return
	}
	lo := 0
	for i := range s {
		if s[i].rate < s[lo].rate {
			lo = i
		}
	}
	if i := firstCut(s); i > 0 {
		t.notes = append(t.notes, note{s[i].at, fmt.Sprintf("alice's rate cut: %s -> %s", gbps(s[i-1].rate), gbps(s[i].rate))})
	}
	t.notes = append(t.notes, note{s[lo].at, "alice's rate at its lowest: " + gbps(s[lo].rate)})
	t.notes = append(t.notes, note{s[len(s)-1].at, "alice's rate back to " + gbps(s[len(s)-1].rate)})
}

// firstCut returns the index of the first sample lower than the one
// before it, or 0 when the rate never fell.
func firstCut(s []rateSample) int {
	for i := 1; i < len(s); i++ {
		if s[i].rate < s[i-1].rate {
			return i
		}
	}
	return 0
}

// chart prints Alice's rate over time as a bar chart of ccChartRows rows.
func (t *Tour) chart(s []rateSample) {
	if len(s) == 0 {
		return
	}
	start, span := s[0].at, s[len(s)-1].at.Sub(s[0].at)
	// The ladder below may elide the rows its notes sit on (a long
	// capture), so the first cut is told here too.
	if i := firstCut(s); i > 0 {
		t.say("\n%s's rate cut: %s -> %s, %.1f ms after the first sample.", t.a.name,
			gbps(s[i-1].rate), gbps(s[i].rate), float64(s[i].at.Sub(start))/float64(time.Millisecond))
	}
	t.say("\n%s's DCQCN rate over time (lowest sample in each slice):", t.a.name)
	j := 0
	for r := 0; r < ccChartRows && j < len(s); r++ {
		end := start.Add(span * time.Duration(r+1) / ccChartRows)
		lo, any := s[j].rate, false
		for ; j < len(s) && (!s[j].at.After(end) || r == ccChartRows-1); j++ {
			lo, any = min(lo, s[j].rate), true
		}
		if !any {
			continue
		}
		bar := int(lo * 50 / ccLineRate)
		t.say("  %8.1f ms  %10s  %s", float64(end.Sub(start))/float64(time.Millisecond), gbps(lo), strings.Repeat("#", max(bar, 1)))
	}
}

// minRate is the lowest sampled rate, or fallback without samples.
func minRate(s []rateSample, fallback uint64) uint64 {
	lo := fallback
	for _, x := range s {
		lo = min(lo, x.rate)
	}
	return lo
}

// gbps formats a rate in bits/s for people.
func gbps(r uint64) string {
	switch {
	case r >= congestion.Gbps:
		return fmt.Sprintf("%.2f Gb/s", float64(r)/float64(congestion.Gbps))
	default:
		return fmt.Sprintf("%.1f Mb/s", float64(r)/float64(congestion.Mbps))
	}
}
