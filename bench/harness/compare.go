package harness

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Compare is "rxego-bench compare [-cpus N] TREE...": each TREE is the
// -json output of one tree's runs (files separated by commas, every round
// of a sitting; "name=files" labels it, else the first file's name less
// its "-N.json" round suffix does). It prints a markdown table of each
// case's median per tree with every later tree's ratio to the first, then
// the targets of issue 29 for each tree. -cpus gives the CPU count of
// runs that record none (harnesses older than Result.CPUs); without it
// such runs are judged against no 16-CPU target.
func Compare(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cpus := fs.Int("cpus", 0, "the CPU count of runs that record none (older harnesses); 0: unknown, and such runs count for no 16-CPU target")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: rxego-bench compare [-cpus N] [name=]before.json[,more.json] [name=]after.json[,more.json] ...\n\nPrints each case's median per tree (the -json files of its rounds), the ratio of each later tree to the first, and issue 29's target ratios.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 || *cpus < 0 {
		if *cpus < 0 {
			fmt.Fprintf(stderr, "rxego-bench compare: -cpus %d: a CPU count is 1 or more (0: unknown)\n", *cpus)
		}
		fs.Usage()
		return 2
	}
	var trees []tree
	for _, a := range fs.Args() {
		t, err := loadTree(a)
		if err != nil {
			fmt.Fprintln(stderr, "rxego-bench compare:", err)
			return 1
		}
		t.assumeCPUs(*cpus)
		trees = append(trees, t)
	}
	writeComparison(stdout, trees)
	return 0
}

// tree is one source tree's runs of a sitting, by case name.
type tree struct {
	name  string
	runs  map[string][]Result
	from  map[string][]string // the file each run came from (its path as given), beside runs
	order []string            // case names in the order first seen
}

// roundSuffix is the "-N.json" (or ".json") a sitting's file names end in.
var roundSuffix = regexp.MustCompile(`(-\d+)?\.json$`)

// loadTree reads "[name=]file[,file...]".
func loadTree(arg string) (tree, error) {
	name, files, labelled := strings.Cut(arg, "=")
	if !labelled {
		files = arg
		name = roundSuffix.ReplaceAllString(filepath.Base(strings.Split(arg, ",")[0]), "")
	}
	t := tree{name: name, runs: map[string][]Result{}, from: map[string][]string{}}
	for _, f := range strings.Split(files, ",") {
		if err := t.read(f); err != nil {
			return t, err
		}
	}
	if len(t.order) == 0 {
		return t, fmt.Errorf("%s: no results", files)
	}
	return t, nil
}

// read adds the results of one -json file (a JSON object a line).
func (t *tree) read(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<24)
	for line := 1; sc.Scan(); line++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var r Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("%s:%d: %w", path, line, err)
		}
		if r.Case.Kind == "" {
			return fmt.Errorf("%s:%d: a result without a case", path, line)
		}
		n := r.Case.Name()
		if _, seen := t.runs[n]; !seen {
			t.order = append(t.order, n)
		}
		t.runs[n] = append(t.runs[n], r)
		t.from[n] = append(t.from[n], path)
	}
	return sc.Err()
}

// assumeCPUs records n as the CPU count of every run that records none
// (n 0: leaves them unknown).
func (t tree) assumeCPUs(n int) {
	for _, rs := range t.runs {
		for i := range rs {
			if rs[i].CPUs == 0 {
				rs[i].CPUs = n
			}
		}
	}
}

// results is the tree's median result of each case (see median).
func (t tree) results() results {
	var rs results
	for _, n := range t.order {
		rs = append(rs, median(t.runs[n]))
	}
	return rs
}

// rounds is the tree's runs grouped by round: the k-th run of each case
// in one file (a sitting's round, or the k-th of -repeat's rounds within
// one run of the harness) is in that file's round k. A round holds the
// cases one binary measured minutes apart, so a ratio of two of them
// moves less with the machine's speed than a ratio of their medians over
// the sitting does.
func (t tree) rounds() []results {
	type key struct {
		file string
		k    int
	}
	var keys []key
	byRound := map[key]results{}
	for _, n := range t.order {
		seen := map[string]int{}
		for i, r := range t.runs[n] {
			f := t.from[n][i]
			k := key{f, seen[f]}
			seen[f]++
			if _, ok := byRound[k]; !ok {
				keys = append(keys, k)
			}
			if r.Err == "" {
				byRound[k] = append(byRound[k], r)
			}
		}
	}
	var rs []results
	for _, k := range keys {
		rs = append(rs, byRound[k])
	}
	return rs
}

// targetValue is a target's value in a tree: the median of its value in
// each round that has it, where two rounds or more do; else its value
// from the cases' medians.
func (t tree) targetValue(value func(results) (float64, bool)) (float64, bool) {
	var vs []float64
	for _, rs := range t.rounds() {
		if v, ok := value(rs); ok {
			vs = append(vs, v)
		}
	}
	if len(vs) < 2 {
		return value(t.results())
	}
	slices.Sort(vs)
	if len(vs)%2 == 0 {
		return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2, true
	}
	return vs[len(vs)/2], true
}

// cell formats a median result for the comparison table: Gbit/s and
// Gbit/s per busy CPU, M messages/s, or latency p50 / p99.
func cell(r Result) string {
	switch {
	case r.Err != "":
		return "error"
	case r.Samples > 0:
		return fmt.Sprintf("%s / %s", us(r.P50), us(r.P99))
	case r.Case.Kind == RxegoRate:
		return fmt.Sprintf("%.2f M/s", r.Rate()/1e6)
	case r.Bytes > 0 && r.CPU > 0:
		return fmt.Sprintf("%.2f (%.2f/CPU)", r.Gbps(), r.Gbps()/r.Cores())
	case r.Bytes > 0:
		return fmt.Sprintf("%.2f", r.Gbps())
	}
	return "–"
}

func writeComparison(w io.Writer, trees []tree) {
	var names []string
	for _, t := range trees {
		names = append(names, t.name)
	}
	fmt.Fprintf(w, "# rxego-bench compare: %s\n\n", strings.Join(names, " vs "))
	fmt.Fprintln(w, "Medians of each tree's runs (how many in square brackets). Bandwidth: Gbit/s (Gbit/s per busy CPU, both processes); rate: M messages/s; latency: p50 / p99. A ratio is the later tree's figure over the first's (for latency, p50's: below 1 is faster).")
	fmt.Fprintln(w)
	head := "| case |"
	rule := "|---|"
	for _, n := range names {
		head += " " + n + " |"
		rule += "---:|"
	}
	for _, n := range names[1:] {
		head += " " + n + "/" + names[0] + " |"
		rule += "---:|"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, rule)
	meds := make([]map[string]Result, len(trees))
	for i, t := range trees {
		meds[i] = map[string]Result{}
		for _, r := range t.results() {
			meds[i][r.Case.Name()] = r
		}
	}
	var cases []string
	for _, t := range trees {
		for _, n := range t.order {
			if !slices.Contains(cases, n) {
				cases = append(cases, n)
			}
		}
	}
	for _, c := range cases {
		row := "| " + c + " |"
		for i, t := range trees {
			r, ok := meds[i][c]
			if !ok {
				row += " – |"
				continue
			}
			row += fmt.Sprintf(" %s [%d] |", cell(r), len(t.runs[c]))
		}
		first, ok := meds[0][c]
		for i := range trees[1:] {
			r, rok := meds[i+1][c]
			if !ok || !rok || first.Err != "" || r.Err != "" {
				row += " – |"
				continue
			}
			row += " " + ratio(r.figure(), first.figure()) + " |"
		}
		fmt.Fprintln(w, row)
	}
	fmt.Fprintln(w)
	writeTargets(w, trees)
	writeLowRuns(w, trees)
}

// lowRunShare is how far under its case's median, in its own tree, a
// bandwidth or rate run must fall to be listed: the collapsed runs of
// docs/performance.md ("Runs that collapse") move about half.
const lowRunShare = 0.65

// writeLowRuns lists, for cases with three runs or more in a tree, the
// bandwidth and rate runs under lowRunShare of that tree's median, with
// the file each came from: a cluster of them pulls a sitting of few
// rounds down, and the reader should see it before reading a ratio.
func writeLowRuns(w io.Writer, trees []tree) {
	var rows []string
	for _, t := range trees {
		for _, c := range t.order {
			runs := t.runs[c]
			if len(runs) < 3 {
				continue
			}
			med := median(runs)
			m := med.figure()
			if med.Err != "" || med.Samples > 0 || m <= 0 { // latency: lower is better, not listed
				continue
			}
			for i, r := range runs {
				if r.Err == "" && r.figure() < lowRunShare*m {
					rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s | %.2fx |", c, t.name, filepath.Base(t.from[c][i]), cell(r), r.figure()/m))
				}
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## Runs far under their median\n\n| case | tree | run | figure | of the tree's median |\n|---|---|---|---:|---:|\n%s\n\n", strings.Join(rows, "\n"))
	fmt.Fprintf(w, "Bandwidth and rate runs under %.2fx their case's median in their tree (cases of three runs or more): runs that collapsed, most likely (docs/performance.md, \"Runs that collapse\"). A sitting of few rounds that holds several reads those rows low.\n", lowRunShare)
}

// target is one of issue 29's ratios: its value in a tree's medians, or
// false when that tree lacks a case it needs.
type target struct {
	name   string
	want   float64
	atMost bool
	value  func(rs results) (float64, bool)
}

// perCPU is a bandwidth result's Gbit/s per busy CPU, both processes.
func perCPU(r Result, ok bool) (float64, bool) {
	if !ok || r.CPU <= 0 || r.Elapsed <= 0 || r.Bytes == 0 {
		return 0, false
	}
	return r.Gbps() / r.Cores(), true
}

// quotient is a/b when both are there.
func quotient(a float64, aok bool, b float64, bok bool) (float64, bool) {
	if !aok || !bok || b <= 0 {
		return 0, false
	}
	return a / b, true
}

// issue29Targets are the ratios issue 29 asks of a quiet sitting.
func issue29Targets() []target {
	var ts []target
	for _, op := range []string{"write", "read", "send"} {
		for _, mtu := range []int{4096, 1024} {
			for _, n := range []int{8, 16} {
				ts = append(ts, target{
					name: fmt.Sprintf("%s 64 KiB MTU %d: per-CPU efficiency, %d QPs / 1 QP", strings.ToUpper(op), mtu, n),
					want: 0.95,
					value: func(rs results) (float64, bool) {
						many, mok := perCPU(rs.rxBWN(op, 64<<10, mtu, n))
						one, ook := perCPU(rs.rxBW(op, 64<<10, mtu))
						return quotient(many, mok, one, ook)
					},
				})
			}
		}
	}
	for _, mtu := range []struct {
		mtu  int
		want float64
	}{{4096, 0.8}, {1024, 0.75}} {
		ts = append(ts, target{
			name: fmt.Sprintf("WRITE 64 KiB MTU %d, 1 QP: per CPU / UDP GSO %s per CPU", mtu.mtu, sizeName(mtu.mtu)),
			want: mtu.want,
			value: func(rs results) (float64, bool) {
				rx, rok := perCPU(rs.rxBW("write", 64<<10, mtu.mtu))
				u, uok := perCPU(rs.udpBW(UDPGSO, mtu.mtu))
				return quotient(rx, rok, u, uok)
			},
		})
	}
	for _, busy := range []bool{false, true} {
		for _, op := range []string{"send", "write", "read", "atomic"} {
			for _, p := range []struct {
				name string
				want float64
				of   func(Result) time.Duration
			}{{"p50", 1.2, func(r Result) time.Duration { return r.P50 }}, {"p99", 1.5, func(r Result) time.Duration { return r.P99 }}} {
				ts = append(ts, target{
					name: fmt.Sprintf("%s 64 B round trip %s / UDP ping-pong's, %s", strings.ToUpper(op), p.name, wait(busy)),
					want: p.want, atMost: true,
					value: func(rs results) (float64, bool) {
						r, rok := rs.rxLat(op, busy)
						u, uok := rs.udpPing(busy)
						return quotient(float64(p.of(r)), rok, float64(p.of(u)), uok)
					},
				})
			}
		}
	}
	// The rate over several QPs (the faster wait mode's, as the target
	// allows) against one QP's in the same wait mode and post lists.
	rateN := func(rs results, n int) (Result, bool) {
		var many Result
		found := false
		for _, r := range rs {
			if r.Case.Kind == RxegoRate && r.Case.QPs == n && r.Err == "" && (!found || r.Rate() > many.Rate()) {
				many, found = r, true
			}
		}
		return many, found
	}
	ts = append(ts, target{
		name: "WRITE 64 B rate, 8 QPs / 1 QP (same wait, post lists)", want: 1,
		value: func(rs results) (float64, bool) {
			many, ok := rateN(rs, 8)
			one, ook := rs.find(func(c Case) bool {
				return ok && c.Kind == RxegoRate && c.QPs <= 1 && c.Busy == many.Case.Busy && c.rateBatch() == many.Case.rateBatch() && c.Depth == many.Case.Depth
			})
			return quotient(many.Rate(), ok, one.Rate(), ook)
		},
	}, target{
		name: "WRITE 64 B rate, 8 QPs, M/s", want: 3,
		value: func(rs results) (float64, bool) {
			r, ok := rateN(rs, 8)
			return r.Rate() / 1e6, ok
		},
	})
	// The 16-CPU machine's: one device pair against eight TCP streams
	// and eight UDP GSO flows; 16 QPs against 8. Runs recorded on fewer
	// CPUs do not count (onCPUs).
	ts = append(ts, target{
		name: "WRITE 64 KiB MTU 4096, 8 QPs / 8 TCP streams (16 CPUs)", want: 1,
		value: func(rs results) (float64, bool) {
			r, ok := rs.rxBWN("write", 64<<10, 4096, 8)
			t, tok := rs.tcpN(8)
			return quotient(r.Gbps(), onCPUs(r, ok, 16), t.Gbps(), tok)
		},
	}, target{
		name: "WRITE 64 KiB MTU 4096, 8 QPs / 8 UDP GSO 4 KiB flows (16 CPUs)", want: 0.7,
		value: func(rs results) (float64, bool) {
			r, ok := rs.rxBWN("write", 64<<10, 4096, 8)
			u, uok := rs.udpBWN(UDPGSO, 4096, 8)
			return quotient(r.Gbps(), onCPUs(r, ok, 16), u.Gbps(), uok)
		},
	}, target{
		name: "WRITE 64 KiB MTU 4096, 16 QPs / 8 QPs (16 CPUs)", want: 1,
		value: func(rs results) (float64, bool) {
			a, aok := rs.rxBWN("write", 64<<10, 4096, 16)
			b, bok := rs.rxBWN("write", 64<<10, 4096, 8)
			return quotient(a.Gbps(), onCPUs(a, aok, 16), b.Gbps(), bok)
		},
	})
	return ts
}

// onCPUs reports whether r is there and ran on at least n CPUs: a 16-CPU
// target means nothing for a sitting on 2, nor for runs whose CPU count
// is not known (older than Result.CPUs, unless compare's -cpus gave it).
func onCPUs(r Result, ok bool, n int) bool {
	return ok && r.CPUs >= n
}

// targetCell formats a target's value v against its bound want, marking
// a value that misses it. Two decimals, or three where two would print
// the bound itself (0.947 against 0.95 must not read "0.95 **no**").
func targetCell(v, want float64, atMost bool) string {
	f := "%.2f"
	if fmt.Sprintf(f, v) == fmt.Sprintf(f, want) {
		f = "%.3f"
	}
	if (atMost && v > want) || (!atMost && v < want) {
		f += " **no**"
	}
	return fmt.Sprintf(f, v)
}

// writeTargets prints each target's value in every tree, and whether
// each tree meets it.
func writeTargets(w io.Writer, trees []tree) {
	fmt.Fprintln(w, "## Issue 29's targets")
	fmt.Fprintln(w)
	writeTableHead(w, "| target | want |", "|---|---:|", trees)
	for _, tg := range issue29Targets() {
		bound := ">="
		if tg.atMost {
			bound = "<="
		}
		cells, any := ratioCells(trees, tg.value, func(v float64) string { return targetCell(v, tg.want, tg.atMost) })
		if any {
			fmt.Fprintf(w, "| %s | %s %.2f |%s\n", tg.name, bound, tg.want, cells)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Targets no tree measured are left out, and the 16-CPU ones where the runs were on fewer CPUs or recorded no CPU count (-cpus gives one). Per-CPU efficiency is Gbit/s per busy CPU of both processes. A target's value is the median of its value in each round (both cases of a ratio from the same round, minutes apart), where two rounds or more have it; else it comes from each case's median run.")
	writeDiagnostics(w, trees)
}

// writeTableHead prints a table's header: head and rule (its leading
// columns), then a column per tree.
func writeTableHead(w io.Writer, head, rule string, trees []tree) {
	for _, t := range trees {
		head += " " + t.name + " |"
		rule += "---:|"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, rule)
}

// ratioCells is a row's cells, one per tree: cell of the tree's value
// (targetValue), or – where the tree lacks it. any reports whether some
// tree has it.
func ratioCells(trees []tree, value func(results) (float64, bool), cell func(float64) string) (cells string, any bool) {
	for _, t := range trees {
		v, ok := t.targetValue(value)
		if !ok {
			cells += " – |"
			continue
		}
		any = true
		cells += " " + cell(v) + " |"
	}
	return cells, any
}

// diagnostic is a ratio the report shows beside issue 29's targets, with
// no bound: it says where a target's gap comes from.
type diagnostic struct {
	name  string
	value func(rs results) (float64, bool)
}

func diagnostics() []diagnostic {
	return []diagnostic{{
		name: "WRITE 64 KiB MTU 4096, 1 QP: per CPU / UDP GSO in a WRITE's runs (gso-runs 4 KiB) per CPU",
		value: func(rs results) (float64, bool) {
			rx, rok := perCPU(rs.rxBW("write", 64<<10, 4096))
			u, uok := perCPU(rs.udpBW(UDPGSORuns, 4096))
			return quotient(rx, rok, u, uok)
		},
	}, {
		name: "UDP GSO in a WRITE's runs / UDP GSO, per CPU (4 KiB)",
		value: func(rs results) (float64, bool) {
			r, rok := perCPU(rs.udpBW(UDPGSORuns, 4096))
			u, uok := perCPU(rs.udpBW(UDPGSO, 4096))
			return quotient(r, rok, u, uok)
		},
	}}
}

// writeDiagnostics prints the diagnostics some tree measured.
func writeDiagnostics(w io.Writer, trees []tree) {
	var rows []string
	for _, d := range diagnostics() {
		if cells, any := ratioCells(trees, d.value, func(v float64) string { return fmt.Sprintf("%.2f", v) }); any {
			rows = append(rows, "| "+d.name+" |"+cells)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "## Diagnostics")
	fmt.Fprintln(w)
	writeTableHead(w, "| ratio |", "|---|", trees)
	for _, r := range rows {
		fmt.Fprintln(w, r)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "No bounds: where the per-CPU target's gap comes from (docs/performance.md, \"Why a WRITE costs more than a UDP GSO send\").")
}
