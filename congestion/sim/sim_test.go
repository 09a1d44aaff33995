package sim

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/congestion"
)

const ms = time.Millisecond

// bottleneck returns n flows of line rate 10 Gb/s into a 10 Gb/s bottleneck
// that marks when a queue builds, i.e. when the aggregate exceeds capacity:
// RED from 5 KB to 200 KB with probability rising to 1, decided at dequeue.
// The last flow joins at half time.
func bottleneck(rp congestion.Params, np congestion.NPParams, n int, seed uint64) Config {
	const d = 60 * ms
	flows := make([]Flow, n)
	flows[n-1].Start = d / 2
	return Config{
		Capacity: 10 * congestion.Gbps, RP: rp, NP: np, Flows: flows,
		PacketSize: 1000, Burst: 16 << 10,
		Kmin: 5_000, Kmax: 200_000, Pmax: 1, MarkAtDequeue: true,
		Delay: 2 * time.Microsecond, Duration: d, SampleEvery: 100 * time.Microsecond,
		Seed: seed,
	}
}

// N senders converge to fair shares, the late joiner gets its share, and
// the link stays busy. Fairness is Jain's index over the last quarter (the
// second half of the late joiner's life).
func TestConvergesToFairShare(t *testing.T) {
	presets := map[string]struct {
		rp congestion.Params
		np congestion.NPParams
	}{
		"nvidia": {congestion.NVIDIAParams(10 * congestion.Gbps), congestion.NVIDIANPParams()},
		"paper":  {congestion.PaperParams(10 * congestion.Gbps), congestion.PaperNPParams()},
	}
	for name, p := range presets {
		for n := 2; n <= 4; n++ {
			for seed := uint64(1); seed <= 3; seed++ {
				cfg := bottleneck(p.rp, p.np, n, seed)
				res, err := Run(cfg)
				if err != nil {
					t.Fatal(err)
				}
				d := cfg.Duration
				tp := res.Throughput(d*3/4, d)
				var sum float64
				for _, x := range tp {
					sum += x
				}
				fair := sum / float64(n)
				if j := congestion.Jain(tp); j < 0.9 {
					t.Errorf("%s n=%d seed=%d: Jain %.3f < 0.9, throughputs %.3g", name, n, seed, j, tp)
				}
				if late := tp[n-1] / fair; late < 0.6 {
					t.Errorf("%s n=%d seed=%d: late joiner has %.2f of a fair share", name, n, seed, late)
				}
				if util := sum / float64(cfg.Capacity); util < 0.9 {
					t.Errorf("%s n=%d seed=%d: utilization %.3f < 0.9", name, n, seed, util)
				}
				// Before the late joiner the others had the link; they
				// must have made room (CNPs were sent to everyone).
				for i, c := range res.CNPs {
					if c == 0 {
						t.Errorf("%s n=%d seed=%d: flow %d got no CNP", name, n, seed, i)
					}
				}
			}
		}
	}
}

// Without congestion (one flow, as fast as the link) nothing is marked and
// the flow keeps line rate.
func TestNoCongestionNoCNP(t *testing.T) {
	cfg := bottleneck(congestion.NVIDIAParams(10*congestion.Gbps), congestion.NVIDIANPParams(), 1, 1)
	cfg.Flows[0].Start = 0
	res, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.CNPs[0] != 0 || res.Stats[0].Cuts != 0 {
		t.Fatalf("CNPs %d cuts %d on an uncongested link", res.CNPs[0], res.Stats[0].Cuts)
	}
	tp := res.Throughput(0, cfg.Duration)
	if tp[0] < 0.99*10e9 {
		t.Fatalf("throughput %.4g, want line rate", tp[0])
	}
}

// The time series is complete, ordered and consistent: this is what the
// docs' plots are drawn from.
func TestTimeSeries(t *testing.T) {
	cfg := bottleneck(congestion.PaperParams(10*congestion.Gbps), congestion.PaperNPParams(), 2, 1)
	cfg.Duration, cfg.SampleEvery = 10*ms, ms
	cfg.Flows[1].Start = 5 * ms
	res, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Samples) != 11 {
		t.Fatalf("%d samples, want 11 (0..10ms)", len(res.Samples))
	}
	for i, s := range res.Samples {
		if s.At != time.Duration(i)*ms || len(s.Rate) != 2 || len(s.Alpha) != 2 {
			t.Fatalf("sample %d malformed: %+v", i, s)
		}
		for f := range 2 {
			if s.Rate[f] > s.Target[f] || s.Target[f] > cfg.RP.LineRate || s.Alpha[f] < 0 || s.Alpha[f] > 1 {
				t.Fatalf("sample %d flow %d: rate %d target %d alpha %v", i, f, s.Rate[f], s.Target[f], s.Alpha[f])
			}
			if i > 0 && s.Delivered[f] < res.Samples[i-1].Delivered[f] {
				t.Fatalf("delivered bytes went down at sample %d", i)
			}
		}
		if s.At < 5*ms && (s.Rate[1] != 0 || s.Delivered[1] != 0) {
			t.Fatalf("flow 1 active before its start at sample %d", i)
		}
	}
	last := res.Samples[10]
	if last.Rate[1] == 0 || last.Delivered[1] == 0 {
		t.Fatal("flow 1 never ran")
	}

	var b strings.Builder
	if err := res.WriteCSV(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 12 || lines[0] != "t_us,queue_bytes,rate_bps_0,target_bps_0,alpha_0,delivered_bytes_0,rate_bps_1,target_bps_1,alpha_1,delivered_bytes_1" {
		t.Fatalf("CSV header/rows wrong: %d lines, header %q", len(lines), lines[0])
	}
	wantLast := fmt.Sprintf("10000,%d,%d,%d,%s,%d,%d,%d,%s,%d", last.Queue,
		last.Rate[0], last.Target[0], strconv.FormatFloat(last.Alpha[0], 'g', 6, 64), last.Delivered[0],
		last.Rate[1], last.Target[1], strconv.FormatFloat(last.Alpha[1], 'g', 6, 64), last.Delivered[1])
	if lines[11] != wantLast {
		t.Fatalf("last CSV row %q, want %q", lines[11], wantLast)
	}
}

func TestDeterministic(t *testing.T) {
	cfg := bottleneck(congestion.NVIDIAParams(10*congestion.Gbps), congestion.NVIDIANPParams(), 3, 7)
	cfg.Duration = 10 * ms
	cfg.Flows[2].Start = 5 * ms
	a, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Run(cfg)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two runs of the same config differ")
	}
	cfg.Seed = 8
	c, _ := Run(cfg)
	if reflect.DeepEqual(a.Samples, c.Samples) {
		t.Fatal("the seed has no effect on RED marking")
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	good := bottleneck(congestion.NVIDIAParams(10*congestion.Gbps), congestion.NVIDIANPParams(), 2, 1)
	for name, mutate := range map[string]func(*Config){
		"capacity": func(c *Config) { c.Capacity = 0 },
		"no flows": func(c *Config) { c.Flows = nil },
		"too many": func(c *Config) { c.Flows = make([]Flow, MaxFlows+1) },
		"packet":   func(c *Config) { c.PacketSize = 0 },
		"red":      func(c *Config) { c.Kmin, c.Kmax = 10, 5 },
		"pmax":     func(c *Config) { c.Pmax = 1.5 },
		"delay":    func(c *Config) { c.Delay = -1 },
		"duration": func(c *Config) { c.Duration = 0 },
		"sample":   func(c *Config) { c.SampleEvery = 0 },
		"samples":  func(c *Config) { c.SampleEvery = 1 },
		"start":    func(c *Config) { c.Flows[1].Start = c.Duration },
		"rp":       func(c *Config) { c.RP.G = 0 },
		"np":       func(c *Config) { c.NP.CNPDSCP = 64 },
	} {
		cfg := good
		cfg.Flows = append([]Flow(nil), good.Flows...)
		mutate(&cfg)
		if res, err := Run(cfg); err == nil || res != nil {
			t.Errorf("%s: bad config accepted", name)
		}
	}
}

func TestHeapOrder(t *testing.T) {
	var h eventHeap
	at := []time.Duration{5, 1, 3, 1, 9, 0, 3, 7, 1}
	for i, a := range at {
		h.push(event{at: a, flow: i})
	}
	var got []string
	for h.len() > 0 {
		e := h.pop()
		got = append(got, e.at.String()+"/"+string(rune('0'+e.flow)))
	}
	// Equal times come out in insertion order.
	want := "0s/5 1ns/1 1ns/3 1ns/8 3ns/2 3ns/6 5ns/0 7ns/7 9ns/4"
	if s := strings.Join(got, " "); s != want {
		t.Fatalf("pop order %s, want %s", s, want)
	}
}
