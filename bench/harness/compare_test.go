package harness

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompare compares two trees of a real sitting (testdata: a few
// cases of each run's -json lines, two rounds of "before", one of
// "after", and a failed run) and checks the medians, the ratio column
// and issue 29's target ratios (per round), worked out by hand from
// those lines.
func TestCompare(t *testing.T) {
	after := filepath.Join(t.TempDir(), "after-1.json")
	b, err := os.ReadFile("testdata/after-1.json")
	if err != nil {
		t.Fatal(err)
	}
	// A failed run of a case the other tree has: the table says error
	// and gives no ratio.
	b = append(b, []byte(`{"Case":{"Kind":"tcp-pp"},"Role":"client","Err":"peer went away"}`+"\n")...)
	if err := os.WriteFile(after, b, 0o644); err != nil {
		t.Fatal(err)
	}
	beforeTCPPP := filepath.Join(t.TempDir(), "tcppp.json")
	if err := os.WriteFile(beforeTCPPP, []byte(`{"Case":{"Kind":"tcp-pp"},"Role":"client","Elapsed":1000000000,"P50":64000,"P99":94000,"Samples":100}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	code := Compare([]string{"testdata/before-1.json,testdata/before-2.json," + beforeTCPPP, "new=" + after}, &out, &errs)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	report := out.String()
	for _, want := range []string{
		"# rxego-bench compare: before vs new",
		"| case | before | new | new/before |",
		// The median of two runs is the faster (35.14 of 32.61 and
		// 35.14 Gbit/s); after/before 26.14/35.14.
		"| rxego write 64 KiB mtu 4096 | 35.14 (19.94/CPU) [2] | 26.14 (16.12/CPU) [1] | 0.74x |",
		"| TCP 64 B ping-pong | 64.0 us / 94.0 us [1] | error [1] | – |",
		// before's targets are the mean of its two rounds' values (the
		// median of two), each ratio's cases from one round: per CPU
		// 19.815/19.94 and 18.59/19.951 (the medians' ratio would mix
		// round 2's 8 QPs with round 1's one QP: 0.93).
		"| WRITE 64 KiB MTU 4096: per-CPU efficiency, 8 QPs / 1 QP | >= 0.95 | 0.96 | 1.10 |",
		"| WRITE 64 KiB MTU 4096, 1 QP: per CPU / UDP GSO 4 KiB per CPU | >= 0.80 | 0.59 **no** | 0.42 **no** |",
		"| SEND 64 B round trip p50 / UDP ping-pong's, blocking | <= 1.20 | 0.96 | 1.06 |",
		"| SEND 64 B round trip p99 / UDP ping-pong's, blocking | <= 1.50 | 0.88 | 0.88 |",
		"| WRITE 64 B rate, 8 QPs / 1 QP (same wait, post lists) | >= 1.00 | 0.91 **no** | 0.78 **no** |",
		"| WRITE 64 B rate, 8 QPs, M/s | >= 3.00 | 1.85 **no** | 1.59 **no** |",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	// Targets neither tree has the cases for are left out.
	if strings.Contains(report, "READ 64 KiB MTU 4096: per-CPU") || strings.Contains(report, "16 QPs / 8 QPs") {
		t.Errorf("report has targets without cases:\n%s", report)
	}
}

// TestCompareBadInput checks that a missing file, a line that is not a
// result and no arguments each fail with an error naming the problem.
func TestCompareBadInput(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"Case":{"Kind":"tcp-bw"}}`+"\nnot json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage: rxego-bench compare"},
		{[]string{"testdata/no-such.json"}, 1, "no-such.json"},
		{[]string{bad}, 1, "bad.json:2:"},
	} {
		var out, errs bytes.Buffer
		if code := Compare(tc.args, &out, &errs); code != tc.code || !strings.Contains(errs.String(), tc.want) || out.Len() != 0 {
			t.Errorf("compare %v: exit %d, stderr %q, stdout %q; want exit %d and %q", tc.args, code, errs.String(), out.String(), tc.code, tc.want)
		}
	}
}

// TestCompareDiagnostics checks the diagnostics section: rxego's WRITE
// per CPU over UDP GSO cut in a WRITE's runs, and those runs over plain
// GSO, worked out by hand (32, 21 and 16 Gbit/s per busy CPU), and that
// a sitting without the gso-runs case prints no such section.
func TestCompareDiagnostics(t *testing.T) {
	dir := t.TempDir()
	lines := `{"Case":{"Kind":"udp-bw","Mode":"gso","Size":4096},"Role":"client","Elapsed":1000000000,"Bytes":6400000000,"CPU":1600000000}
{"Case":{"Kind":"udp-bw","Mode":"gso-runs","Size":4096},"Role":"client","Elapsed":1000000000,"Bytes":4200000000,"CPU":1600000000}
{"Case":{"Kind":"rxego-bw","Op":"write","Size":65536,"MTU":4096,"Depth":64},"Role":"client","Elapsed":1000000000,"Bytes":3500000000,"CPU":1750000000}
`
	out := compareOne(t, filepath.Join(dir, "run-1.json"), lines)
	for _, want := range []string{
		"## Diagnostics",
		"| WRITE 64 KiB MTU 4096, 1 QP: per CPU / UDP GSO in a WRITE's runs (gso-runs 4 KiB) per CPU | 0.76 |",
		"| UDP GSO in a WRITE's runs / UDP GSO, per CPU (4 KiB) | 0.66 |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	var errs bytes.Buffer
	if code := Compare([]string{"testdata/before-1.json"}, out, &errs); code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	if strings.Contains(out.String(), "Diagnostics") {
		t.Errorf("diagnostics without the gso-runs case:\n%s", out.String())
	}
}

// TestCompare16CPUTargets checks that the 16-CPU targets count only runs
// recorded on 16 CPUs or more, or that record none where -cpus says 16:
// the same runs give the rows on 16 CPUs, and neither row nor value on 2
// or on a count not known.
func TestCompare16CPUTargets(t *testing.T) {
	dir := t.TempDir()
	runs := func(cpus int) string {
		return fmt.Sprintf(`{"Case":{"Kind":"tcp-bw","QPs":8},"Role":"client","Elapsed":1000000000,"Bytes":20000000000,"CPU":8000000000,"CPUs":%[1]d}
{"Case":{"Kind":"udp-bw","Mode":"gso","Size":4096,"QPs":8},"Role":"client","Elapsed":1000000000,"Bytes":16000000000,"CPU":8000000000,"CPUs":%[1]d}
{"Case":{"Kind":"rxego-bw","Op":"write","Size":65536,"MTU":4096,"Depth":8,"QPs":8},"Role":"client","Elapsed":1000000000,"Bytes":8000000000,"CPU":8000000000,"CPUs":%[1]d}
{"Case":{"Kind":"rxego-bw","Op":"write","Size":65536,"MTU":4096,"Depth":4,"QPs":16},"Role":"client","Elapsed":1000000000,"Bytes":10000000000,"CPU":8000000000,"CPUs":%[1]d}
`, cpus)
	}
	for _, c := range []struct {
		cpus  int
		flags []string
		want  bool
	}{{16, nil, true}, {2, nil, false}, {0, nil, false}, {0, []string{"-cpus", "16"}, true}, {0, []string{"-cpus", "2"}, false}, {2, []string{"-cpus", "16"}, false}} {
		out := compareOne(t, filepath.Join(dir, fmt.Sprintf("cpus%d-1.json", c.cpus)), runs(c.cpus), c.flags...)
		for _, row := range []string{
			"| WRITE 64 KiB MTU 4096, 8 QPs / 8 TCP streams (16 CPUs) | >= 1.00 | 0.40 **no** |",
			"| WRITE 64 KiB MTU 4096, 8 QPs / 8 UDP GSO 4 KiB flows (16 CPUs) | >= 0.70 | 0.50 **no** |",
			"| WRITE 64 KiB MTU 4096, 16 QPs / 8 QPs (16 CPUs) | >= 1.00 | 1.25 |",
		} {
			if got := strings.Contains(out.String(), row); got != c.want {
				t.Errorf("runs on %d CPUs, flags %q: row %q present %v, want %v:\n%s", c.cpus, c.flags, row, got, c.want, out.String())
			}
		}
	}
	var out, errs bytes.Buffer
	if code := Compare([]string{"-cpus", "-1", filepath.Join(dir, "cpus0-1.json")}, &out, &errs); code != 2 || !strings.Contains(errs.String(), "-cpus -1") || out.Len() > 0 {
		t.Errorf("-cpus -1: exit %d, stderr %q, stdout %q; want exit 2 naming the flag, nothing printed", code, errs.String(), out.String())
	}
}

// compareOne writes lines (a sitting's JSON runs) to path and returns
// what Compare, given flags, prints for them as one tree.
func compareOne(t *testing.T, path, lines string, flags ...string) *bytes.Buffer {
	t.Helper()
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	if code := Compare(append(flags, "one="+path), &out, &errs); code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	return &out
}

// TestCompareTargetsPerRound checks that a target pairs the runs of one
// round, in a file of -repeat's rounds too. One QP's WRITE measured 20,
// 10 and 19 Gbit/s per CPU in three rounds, eight QPs' 19, 9.5 and 9.5
// (the machine slowed in round 2, and in round 3 for the eight only):
// 0.95, 0.95 and 0.5 per round, median 0.95; the medians' ratio would
// be 9.5/19 = 0.5.
func TestCompareTargetsPerRound(t *testing.T) {
	run := func(qps, gbps int) string {
		return fmt.Sprintf(`{"Case":{"Kind":"rxego-bw","Op":"write","Size":65536,"MTU":4096,"Depth":64,"QPs":%d},"Role":"client","Elapsed":1000000000,"Bytes":%d,"CPU":1000000000}`+"\n", qps, gbps*1e8/8)
	}
	// -repeat 3 writes each round's cases in turn.
	lines := run(1, 200) + run(8, 190) + run(1, 100) + run(8, 95) + run(1, 190) + run(8, 95)
	out := compareOne(t, filepath.Join(t.TempDir(), "rounds.json"), lines)
	// 0.95 exactly, at its bound: three decimals say which side (targetCell).
	want := "| WRITE 64 KiB MTU 4096: per-CPU efficiency, 8 QPs / 1 QP | >= 0.95 | 0.950 |"
	if !strings.Contains(out.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, out.String())
	}
}

// TestCompareRoundsByPath checks that a tree's rounds are its files,
// told apart by path: three sittings' "round.json" in three folders, the
// first without the eight-QP case. Per round the target reads 0.95 in the
// second and third (median 0.95); keyed by base name, the first file's
// one QP (20 Gbit/s per CPU) would pair with the second's eight (9.5),
// and the target would read 0.71.
func TestCompareRoundsByPath(t *testing.T) {
	run := func(qps, gbps int) string {
		return fmt.Sprintf(`{"Case":{"Kind":"rxego-bw","Op":"write","Size":65536,"MTU":4096,"Depth":64,"QPs":%d},"Role":"client","Elapsed":1000000000,"Bytes":%d,"CPU":1000000000}`+"\n", qps, gbps*1e8/8)
	}
	var files []string
	for i, lines := range []string{run(1, 200), run(1, 100) + run(8, 95), run(1, 100) + run(8, 95)} {
		dir := filepath.Join(t.TempDir(), fmt.Sprint(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, "round.json")
		if err := os.WriteFile(f, []byte(lines), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	var out, errs bytes.Buffer
	if code := Compare([]string{"one=" + strings.Join(files, ",")}, &out, &errs); code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	want := "| WRITE 64 KiB MTU 4096: per-CPU efficiency, 8 QPs / 1 QP | >= 0.95 | 0.950 |"
	if !strings.Contains(out.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, out.String())
	}
}

// TestCompareRateFasterWait checks that the 8-QP rate targets take the
// faster wait mode's run (blocking here) and compare it with one QP's in
// that mode.
func TestCompareRateFasterWait(t *testing.T) {
	lines := []string{
		`{"Case":{"Kind":"rxego-rate","MTU":1024,"Depth":128,"Batch":32},"Role":"client","Elapsed":1000000000,"Msgs":2000000}`,
		`{"Case":{"Kind":"rxego-rate","MTU":1024,"Depth":128,"Batch":32,"Busy":true},"Role":"client","Elapsed":1000000000,"Msgs":1500000}`,
		`{"Case":{"Kind":"rxego-rate","MTU":1024,"Depth":128,"Batch":32,"QPs":8},"Role":"client","Elapsed":1000000000,"Msgs":3300000}`,
		`{"Case":{"Kind":"rxego-rate","MTU":1024,"Depth":128,"Batch":32,"QPs":8,"Busy":true},"Role":"client","Elapsed":1000000000,"Msgs":1200000}`,
	}
	f := filepath.Join(t.TempDir(), "rate.json")
	if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errs bytes.Buffer
	if code := Compare([]string{"a=" + f, "b=" + f}, &out, &errs); code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	for _, want := range []string{
		"| WRITE 64 B rate, 8 QPs / 1 QP (same wait, post lists) | >= 1.00 | 1.65 | 1.65 |",
		"| WRITE 64 B rate, 8 QPs, M/s | >= 3.00 | 3.30 | 3.30 |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// TestCompareLowRuns checks the list of runs far under their median: of
// three WRITE runs at 24, 23 and 11 Gbit/s the third (0.48x of the
// median 23) is listed with its file, and neither the two others, nor a
// rate case whose runs lie close, nor a latency case whose slow run is
// a higher figure, nor a case of two runs.
func TestCompareLowRuns(t *testing.T) {
	dir := t.TempDir()
	bw := func(gbps float64) string {
		return fmt.Sprintf(`{"Case":{"Kind":"rxego-bw","Op":"write","Size":65536,"MTU":4096,"Depth":64},"Role":"client","Elapsed":1000000000,"Bytes":%.0f,"CPU":1500000000}`, gbps*1e9/8)
	}
	rate := func(msgs int) string {
		return fmt.Sprintf(`{"Case":{"Kind":"rxego-rate","MTU":1024,"Depth":128,"Batch":32},"Role":"client","Elapsed":1000000000,"Msgs":%d}`, msgs)
	}
	lat := func(p50 int) string {
		return fmt.Sprintf(`{"Case":{"Kind":"udp-pp"},"Role":"client","Elapsed":1000000000,"P50":%d,"P99":200000,"Samples":100}`, p50)
	}
	tcp := `{"Case":{"Kind":"tcp-bw"},"Role":"client","Elapsed":1000000000,"Bytes":3000000000,"CPU":1500000000}`
	rounds := [][]string{
		{bw(24), rate(2000000), lat(50000), tcp},
		{bw(23), rate(1900000), lat(150000)},
		{bw(11), rate(1800000), lat(52000), `{"Case":{"Kind":"tcp-bw"},"Role":"client","Elapsed":1000000000,"Bytes":1000000000,"CPU":1500000000}`},
	}
	var files []string
	for i, lines := range rounds {
		f := filepath.Join(dir, fmt.Sprintf("x-%d.json", i+1))
		if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	var out, errs bytes.Buffer
	if code := Compare([]string{"x=" + strings.Join(files, ",")}, &out, &errs); code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	report := out.String()
	i := strings.Index(report, "## Runs far under their median")
	if i < 0 {
		t.Fatalf("no list of low runs:\n%s", report)
	}
	list := report[i:]
	if want := "| rxego write 64 KiB mtu 4096 | x | x-3.json | 11.00 (7.33/CPU) | 0.48x |"; !strings.Contains(list, want) {
		t.Errorf("list lacks %q:\n%s", want, list)
	}
	if n := strings.Count(list, "\n| ") - 1; n != 1 { // the header row, then the runs
		t.Errorf("%d runs listed, want 1:\n%s", n, list)
	}
	// A sitting with no such run prints no list.
	out.Reset()
	if code := Compare([]string{"x=" + strings.Join(files[:2], ",")}, &out, &errs); code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	if strings.Contains(out.String(), "Runs far under") {
		t.Errorf("a list with two rounds:\n%s", out.String())
	}
}

// TestTargetCell checks that a value next to its bound shows which side
// of it it is on: two decimals, three where two would print the bound.
func TestTargetCell(t *testing.T) {
	for _, c := range []struct {
		v, want float64
		atMost  bool
		out     string
	}{
		{0.947, 0.95, false, "0.947 **no**"},
		{0.953, 0.95, false, "0.953"},
		{0.95, 0.95, false, "0.950"},
		{0.94, 0.95, false, "0.94 **no**"},
		{1.02, 0.95, false, "1.02"},
		{1.204, 1.2, true, "1.204 **no**"},
		{1.196, 1.2, true, "1.196"},
		{1.56, 1.2, true, "1.56 **no**"},
	} {
		if got := targetCell(c.v, c.want, c.atMost); got != c.out {
			t.Errorf("targetCell(%v, %v, atMost %v) = %q, want %q", c.v, c.want, c.atMost, got, c.out)
		}
	}
}
