package perftest

import (
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/app/devstats"
)

// completions is how many completions a run's device generated.
func completions(r *Result) uint64 { return devstats.Map(r.Device)["completions_generated"] }

// TestModes runs perftest's modes between two rxego peers: CQ moderation
// and post lists (counted in the completions the client's device
// generated), --report_gbits, -u, -b, -D and --run_infinitely.
func TestModes(t *testing.T) {
	timeout := uint8(0) // -u 0: no ACK timeout at all
	for _, c := range []struct {
		name string
		lc   loopCase
		// completions the client's device must have generated (0: not checked)
		clientCompletions uint64
		check             func(t *testing.T, srv, cli *Result, sout, cout string)
	}{
		{name: "Q=10", lc: loopCase{test: WriteBW, size: 64, iters: 200, mod: func(c *Config) { c.CQMod = 10 }},
			clientCompletions: 20},
		{name: "l=4", lc: loopCase{test: WriteBW, size: 64, iters: 100, mod: func(c *Config) { c.PostList = 4 }},
			clientCompletions: 25},
		{name: "l=10,Q=5,q=2", lc: loopCase{test: ReadBW, size: 100, iters: 100, qps: 2, mod: func(c *Config) { c.PostList, c.CQMod = 10, 5 }},
			clientCompletions: 40},
		{name: "atomic Q=7", lc: loopCase{test: AtomicBW, atomic: FetchAndAdd, iters: 70, mod: func(c *Config) { c.CQMod = 7 }},
			clientCompletions: 10},
		{name: "report_gbits,u=0", lc: loopCase{test: WriteBW, size: 4096, iters: 20, mod: func(c *Config) { c.ReportGbits, c.QPTimeout = true, &timeout }},
			check: func(t *testing.T, _, _ *Result, sout, cout string) {
				for _, out := range []string{sout, cout} {
					if !strings.Contains(out, "BW average[Gb/sec]") {
						t.Errorf("no Gb/sec header:\n%s", out)
					}
				}
			}},
		{name: "b write", lc: loopCase{test: WriteBW, size: 4096, iters: 50, noPeerChecks: true, mod: func(c *Config) { c.Bidirectional = true }},
			check: checkDuplex},
		{name: "b read all", lc: loopCase{test: ReadBW, iters: 5, all: true, noPeerChecks: true, mod: func(c *Config) { c.Bidirectional = true }},
			check: checkDuplex},
		{name: "D", lc: loopCase{test: WriteBW, size: 1024, iters: 5, noPeerChecks: true,
			mod: func(c *Config) { c.Duration, c.Margin = 1200*time.Millisecond, 300*time.Millisecond }},
			check: func(t *testing.T, srv, cli *Result, sout, cout string) {
				if !strings.Contains(cout, noPeakWarning) || !strings.Contains(sout, noPeakWarning) {
					t.Errorf("no peak warning:\n%s\n%s", sout, cout)
				}
				// 600 ms of sampling on loopback moves more than the 5 -n asks.
				if len(cli.BW) != 1 || cli.BW[0].Iters <= 5 || cli.BW[0].BWPeak != 0 || srv.BW[0].Iters != cli.BW[0].Iters {
					t.Errorf("reports: client %+v server %+v", cli.BW, srv.BW)
				}
			}},
		{name: "run_infinitely", lc: loopCase{test: AtomicBW, atomic: FetchAndAdd, iters: 5, noPeerChecks: true, clientFor: 1100 * time.Millisecond,
			mod: func(c *Config) { c.RunInfinitely, c.Duration = true, 300*time.Millisecond }},
			check: func(t *testing.T, srv, cli *Result, sout, cout string) {
				lines := strings.Count(cout, "\n 8 ")
				if lines < 3 || !strings.Contains(sout, "client ended its endless run") {
					t.Errorf("%d report lines:\n%s\nserver:\n%s", lines, cout, sout)
				}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, cli, sout, cout := runPair(t, c.lc)
			if n := completions(cli); c.clientCompletions != 0 && n != c.clientCompletions {
				t.Errorf("client's device generated %d completions, want %d", n, c.clientCompletions)
			}
			if cli.Mismatches+srv.Mismatches != 0 {
				t.Errorf("mismatches: client %d server %d", cli.Mismatches, srv.Mismatches)
			}
			if c.check != nil {
				c.check(t, srv, cli, sout, cout)
			}
			if testing.Verbose() {
				t.Logf("server:\n%s\nclient:\n%s", sout, cout)
			}
		})
	}
}

// checkDuplex checks a -b run: both titles say so, both sides posted (a
// one-way server generates no completion) and report the same sums.
func checkDuplex(t *testing.T, srv, cli *Result, sout, cout string) {
	t.Helper()
	for _, side := range []struct {
		name string
		r    *Result
		out  string
	}{{"server", srv, sout}, {"client", cli, cout}} {
		if !strings.Contains(side.out, "Bidirectional BW Test") || len(side.r.BW) == 0 {
			t.Errorf("%s:\n%s", side.name, side.out)
		}
		if completions(side.r) == 0 {
			t.Errorf("%s posted nothing", side.name)
		}
	}
	if len(srv.BW) != len(cli.BW) || len(cli.BW) > 0 && srv.BW[0].BWAvg != cli.BW[0].BWAvg {
		t.Errorf("the sums differ: server %+v client %+v", srv.BW, cli.BW)
	}
}

// TestModeRules checks what perftest refuses among the modes.
func TestModeRules(t *testing.T) {
	big := uint8(32)
	for _, bad := range []Config{
		{Test: WriteLat, CQMod: 2}, {Test: SendLat, PostList: 2}, {Test: ReadLat, Duration: 5 * time.Second},
		{Test: WriteBW, Iters: 100, PostList: 3}, {Test: WriteBW, TxDepth: 4, PostList: 8}, {Test: WriteBW, CQMod: 200},
		{Test: WriteBW, PostList: 10, CQMod: 4},
		{Test: WriteBW, Duration: 5 * time.Second, Events: true}, {Test: WriteBW, Duration: 5 * time.Second, All: true},
		{Test: WriteBW, Duration: 4 * time.Second}, {Test: SendBW, Duration: 5 * time.Second},
		{Test: SendBW, Bidirectional: true}, {Test: AtomicBW, Bidirectional: true},
		{Test: WriteBW, RunInfinitely: true, Bidirectional: true}, {Test: WriteBW, QPTimeout: &big},
		{Test: SendLat, Iters: maxLatIters + 1},
	} {
		if _, err := normalise(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	n, err := normalise(Config{Test: WriteBW, Iters: 100000})
	if err != nil || !n.noPeak {
		t.Errorf("-n 100000: noPeak %v, %v", n.noPeak, err)
	}
	n, err = normalise(Config{Test: WriteBW, PostList: 8})
	if err != nil || n.cqMod != 8 {
		t.Errorf("-l 8: cq_mod %d, %v", n.cqMod, err)
	}
}
