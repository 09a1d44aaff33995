package harness

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestCases runs a short version of each kind of case with both sides in
// this process and checks each measured what it should.
func TestCases(t *testing.T) {
	if testing.Short() {
		t.Skip("sockets and timing")
	}
	short := func(c Case) Case {
		c.Warmup, c.Duration = 20*time.Millisecond, 80*time.Millisecond
		return c
	}
	cases := []Case{
		{Kind: TCPBW},
		{Kind: TCPPing},
		{Kind: RsocketBW},
		{Kind: RsocketPP},
		{Kind: UDPBW, Mode: UDPSingle, Size: 1024},
		{Kind: UDPBW, Mode: UDPMmsg, Size: 1024},
		{Kind: UDPBW, Mode: UDPGSO, Size: 4096},
		{Kind: UDPPing},
		{Kind: UDPPing, Busy: true},
		{Kind: RxegoBW, Op: "write", Size: 64 << 10, MTU: 1024, Depth: 8},
		{Kind: RxegoBW, Op: "read", Size: 64 << 10, MTU: 4096, Depth: 8},
		{Kind: RxegoBW, Op: "send", Size: 4 << 10, MTU: 1024, Depth: 8},
		{Kind: RxegoLat, Op: "send", MTU: 1024},
		{Kind: RxegoLat, Op: "atomic", MTU: 1024, Busy: true},
		{Kind: RxegoRate, MTU: 1024, Depth: 128, Batch: 32},
		{Kind: RxegoRate, MTU: 1024, Depth: 128, Busy: true},
		{Kind: RxegoScale, MTU: 4096, Size: 4096, QPs: 100},
		{Kind: TCPBW, QPs: 4},
		{Kind: UDPBW, Mode: UDPGSO, Size: 4096, QPs: 4},
		{Kind: RxegoBW, Op: "write", Size: 64 << 10, MTU: 4096, Depth: 4, QPs: 4},
		{Kind: RxegoBW, Op: "read", Size: 64 << 10, MTU: 1024, Depth: 4, QPs: 4},
		{Kind: RxegoBW, Op: "send", Size: 64 << 10, MTU: 4096, Depth: 4, QPs: 4},
		{Kind: RxegoRate, MTU: 1024, Depth: 128, Batch: 32, QPs: 8},
		{Kind: RxegoRate, MTU: 1024, Depth: 128, Batch: 32, Busy: true, QPs: 8},
	}
	var all []Result
	for _, c := range cases {
		c = short(c)
		t.Run(strings.ReplaceAll(c.Name(), " ", "_"), func(t *testing.T) {
			r, err := runPair(c)
			if err != nil {
				t.Fatal(err)
			}
			if r.Elapsed < c.Duration {
				t.Errorf("measured %v, want at least %v", r.Elapsed, c.Duration)
			}
			switch c.Kind {
			case TCPPing, UDPPing, RxegoLat, RsocketPP:
				if r.Samples == 0 || r.P50 <= 0 || r.P99 < r.P50 {
					t.Errorf("latency: %d samples, p50 %v, p99 %v", r.Samples, r.P50, r.P99)
				}
			default:
				if r.Bytes == 0 {
					t.Error("no bytes moved")
				}
				if r.CPU <= 0 {
					t.Error("no CPU time measured")
				}
			}
			switch c.Kind {
			case RxegoBW, RxegoRate:
				if r.Packets == 0 || r.Counters["client.sent_pkts"] == 0 || r.Counters["server.rcvd_pkts"] == 0 {
					t.Errorf("packets %d, counters %v", r.Packets, r.Counters)
				}
			case RxegoScale:
				if r.MemPerQP <= 0 || r.Counters["client.qps_without_traffic"] != 0 {
					t.Errorf("memory per QP %v, QPs without traffic %d", r.MemPerQP, r.Counters["client.qps_without_traffic"])
				}
			}
			all = append(all, r)
		})
	}
	var b bytes.Buffer
	WriteReport(&b, all, Sched{}, 1)
	for _, want := range []string{"## Yardsticks", "| rsocket stream (rxego) | ", "| rsocket 64 B ping-pong (rxego) | ", "## rxego bandwidth", "| WRITE | 64 KiB | 1024 |", "| WRITE 64 B, depth 128 | 32 | blocking |", "| WRITE 64 B, depth 128 | 64 | busy-poll |", "## Targets",
		"## rxego over several QPs", "| 4 | ", "| READ | 1024 |", "message rate over 8 QPs"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}

// TestSuite checks the default suite covers what the report needs and
// stays within its time budget.
func TestSuite(t *testing.T) {
	cs := Suite(false, nil)
	var budget time.Duration
	kinds := map[Kind]int{}
	for _, c := range cs {
		budget += c.Warmup + c.Duration + 200*time.Millisecond // processes and set-up
		kinds[c.Kind]++
	}
	if budget*3 > 5*time.Minute { // three rounds by default
		t.Errorf("default run takes about %v", budget*3)
	}
	if kinds[RxegoBW] != 18 || kinds[RxegoLat] != 8 || kinds[RxegoRate] != 4 || kinds[RxegoScale] != 1 {
		t.Errorf("rxego cases: %v", kinds)
	}
	// -multi: for 4, 8 and 16 QPs, six rxego rows, TCP and UDP; the rate
	// over 8 QPs.
	extra := map[Kind]int{}
	for _, c := range Suite(false, MultiQPs)[len(cs):] {
		extra[c.Kind]++
	}
	for _, c := range Suite(false, MultiQPs) {
		if c.QPs > 1 && c.Kind != RxegoScale && !strings.Contains(c.Name(), fmt.Sprintf(", %d ", c.QPs)) {
			t.Errorf("multi-QP case named %q", c.Name())
		}
	}
	if n := len(MultiQPs) - 1; extra[RxegoBW] != 6*n || extra[TCPBW] != n || extra[UDPBW] != n || extra[RxegoRate] != 2 {
		t.Errorf("multi-QP cases: %v", extra)
	}
	// -qps 1,2,4,8,16 (the 16-CPU sitting's): four counts above one.
	qps, err := parseQPs("1, 2,4,8,16")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(Suite(false, qps)) - len(cs); n != 4*8+2 {
		t.Errorf("-qps 1,2,4,8,16 adds %d cases, want %d", n, 4*8+2)
	}
	for _, bad := range []string{"", "0", "4,2", "1,1", "x", "1,300"} {
		if _, err := parseQPs(bad); err == nil {
			t.Errorf("-qps %q accepted", bad)
		}
	}
}

// TestMedian checks the report takes the median run of each case and
// skips failed runs.
func TestMedian(t *testing.T) {
	bw := func(gbps float64) Result {
		return Result{Bytes: uint64(gbps * 1e9 / 8), Elapsed: time.Second}
	}
	got := median([]Result{bw(9), bw(1), bw(5)})
	if int(got.Gbps()+0.5) != 5 {
		t.Errorf("median of 9, 1, 5 Gbit/s: %v", got.Gbps())
	}
	if got.Runs != 3 || got.span(1, "%.0f") != "1-9" {
		t.Errorf("range of 9, 1, 5 Gbit/s: %d runs, %s", got.Runs, got.span(1, "%.0f"))
	}
	rate := func(perSec float64) Result {
		return Result{Case: Case{Kind: RxegoRate}, Msgs: uint64(perSec), Bytes: uint64(perSec) * 64, Elapsed: time.Second}
	}
	if got := median([]Result{rate(2.4e6), rate(2.0e6), {Err: "x"}}); got.Runs != 2 || got.span(1e6, "%.1f") != "2.0-2.4" {
		t.Errorf("rate range of 2.4, 2.0 M/s and a failed run: %d runs, %s", got.Runs, got.span(1e6, "%.1f"))
	}
	lat := func(us int) Result { return Result{Samples: 10, P50: time.Duration(us) * time.Microsecond} }
	if got := median([]Result{lat(30), lat(10), {Err: "x"}, lat(20)}); got.P50 != 20*time.Microsecond {
		t.Errorf("median p50 of 30, 10, failed, 20 us: %v", got.P50)
	}
	if got := median([]Result{{Err: "a"}, {Err: "b"}}); got.Err != "a" {
		t.Errorf("all failed: %+v", got)
	}
}

// TestCeiling checks the report's bound on a UDP-socket stack: raw UDP
// GSO/GRO's Gbit/s per CPU of its sending process, and per busy CPU times
// the machine's CPUs, each against TCP; and that merge keeps the client's
// CPU apart.
func TestCeiling(t *testing.T) {
	side := func(role string, gbps float64, cpu time.Duration) Result {
		return Result{Role: role, Bytes: uint64(gbps * 1e9 / 8), Elapsed: time.Second, CPU: cpu}
	}
	tcp := merge(side("client", 20, 800*time.Millisecond), Result{Role: "server", CPU: 700 * time.Millisecond})
	tcp.Case = Case{Kind: TCPBW}
	udp := merge(Result{Role: "server", CPU: 500 * time.Millisecond}, side("client", 30, 1000*time.Millisecond))
	udp.Case = Case{Kind: UDPBW, Mode: UDPGSO, Size: 4096}
	if udp.ClientCPU != time.Second || udp.CPU != 1500*time.Millisecond || udp.Gbps() < 29.9 {
		t.Fatalf("merged UDP result: client CPU %v, CPU %v, %.1f Gbit/s", udp.ClientCPU, udp.CPU, udp.Gbps())
	}
	var b bytes.Buffer
	writeCeiling(&b, results{tcp, udp}, tcp, true)
	// 30 Gbit/s on 1 sending CPU: 1.50x TCP; 20 Gbit/s per busy CPU on
	// every CPU of this machine.
	all := 20 * float64(runtime.NumCPU())
	for _, want := range []string{
		"30.0 Gbit/s per CPU of the sending process (1.50x TCP)",
		fmt.Sprintf("%.1f Gbit/s on all %d CPUs (%.2fx)", all, runtime.NumCPU(), all/20),
		"TCP 20.0 Gbit/s",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("ceiling line lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	writeCeiling(&b, results{tcp}, tcp, true) // no UDP GSO result: nothing to bound with
	if b.Len() != 0 {
		t.Errorf("ceiling without a UDP GSO/GRO result: %q", b.String())
	}
}

// TestBudget checks that a spent -budget starts no case, reports each
// case left out as not run and fails the run, and that the JSON lines
// hold only the runs that happened.
func TestBudget(t *testing.T) {
	jsonPath := t.TempDir() + "/runs.json"
	var out, progress bytes.Buffer
	code := Main([]string{"-budget", "1ns", "-repeat", "2", "-run", "^TCP stream$", "-json", jsonPath}, &out, &progress)
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	if !strings.Contains(progress.String(), "time budget of 1ns spent: round 1 stops before TCP stream") {
		t.Errorf("progress: %s", progress.String())
	}
	if !strings.Contains(out.String(), "| TCP stream | error |") {
		t.Errorf("report lacks the case not run:\n%s", out.String())
	}
	if b, err := os.ReadFile(jsonPath); err != nil || len(b) != 0 {
		t.Errorf("JSON lines of no run: %q, %v", b, err)
	}
}
