// Package workloads is the bench harness for the AI workloads of
// package examples at full size: the KV-cache hand-off (DeepSeek-V3
// shape, 244 MiB), the shared prefix cache (122 MiB, 3 readers) and the
// 4-rank ring all-reduce (64 MiB a rank), each over rxego and over TCP
// in the same round, every rank its own process on loopback, in rounds,
// reporting each row's median and range as markdown. It runs as
// "rxego-bench workloads".
package workloads

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rxego/rxego/bench/harness"
	"github.com/rxego/rxego/examples/allreduce"
	"github.com/rxego/rxego/examples/kvcache"
	"github.com/rxego/rxego/examples/prefixcache"
	"github.com/rxego/rxego/internal/app/job"
)

// Main is "rxego-bench workloads [flags]"; "rxego-bench workloads rank
// NAME ..." is a rank process.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 1 && args[0] == "rank" {
		return rankMain(args[1], args[2:])
	}
	if len(args) > 2 && args[0] == "nice-rank" {
		n, err := strconv.Atoi(args[1])
		if err == nil {
			err = harness.Renice(n)
		}
		if err != nil {
			fmt.Fprintln(stderr, "rxego-bench workloads: rank at nice", args[1]+":", err)
			return 1
		}
		return rankMain(args[2], args[3:])
	}
	fs := flag.NewFlagSet("rxego-bench workloads", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rounds := fs.Int("repeat", 5, "rounds; each row reports its median and range")
	quick := fs.Bool("quick", false, "small sizes (a smoke run)")
	only := fs.String("run", "kvcache,prefix,allreduce", "workloads to run, comma-separated")
	nice := fs.Bool("nice", false, "run every thread of every rank process (and of this one) at nice -20, as rxego-bench -nice does for its peers, so other load on the machine disturbs less (needs root)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rxego-bench workloads: unexpected arguments %q\n", fs.Args())
		return 2
	}
	rankNice := 0
	if *nice {
		if err := harness.Renice(niceValue); err != nil {
			fmt.Fprintln(stderr, "rxego-bench workloads: -nice:", err)
			return 1
		}
		rankNice = niceValue
	}
	p := full
	if *quick {
		p = small
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	host, _ := os.Hostname()
	how := ""
	if rankNice != 0 {
		how = fmt.Sprintf("; every rank at nice %d", rankNice)
	}
	fmt.Fprintf(stdout, "# AI workloads: rxego against TCP\n\n%s, %d CPUs, %s; %d rounds, median (min-max)%s; load average at the start %s\n\n",
		host, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02 15:04 MST"), *rounds, how, loadAverage())
	if err := run(ctx, stdout, stderr, p, strings.Split(*only, ","), *rounds, rankNice); err != nil {
		fmt.Fprintln(stderr, "rxego-bench workloads:", err)
		return 1
	}
	fmt.Fprintf(stdout, "Load average at the end: %s (%s).\n", loadAverage(), time.Now().UTC().Format("15:04:05 MST"))
	return 0
}

// niceValue is what -nice sets, as rxego-bench -nice does.
const niceValue = -20

// loadAverage is the 1-, 5- and 15-minute load averages, for the report
// (a figure counts only from a quiet sitting: docs/performance.md).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	if f := strings.Fields(string(b)); len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

// params are the sizes of a sitting.
type params struct {
	kv         kvcache.Shape
	qps, conns int
	prefix     prefixcache.Config
	reduce     allreduce.Config
}

var full = params{
	kv: kvcache.DeepSeekV3, qps: 4, conns: 4,
	prefix: prefixcache.Config{Bytes: 61 * 2048 * 512 * 2, Readers: 3, Rounds: 2, Chunk: 1 << 20, Depth: 8, Verify: true},
	reduce: allreduce.Config{Count: 16 << 20, Ranks: 4, Iters: 3},
}

var small = params{
	kv: kvcache.Shape{Layers: 8, Tokens: 512, Width: 512, DTypeBytes: 2, BlockTokens: 64}, qps: 4, conns: 4,
	prefix: prefixcache.Config{Bytes: 8 << 20, Readers: 3, Rounds: 2, Chunk: 1 << 20, Depth: 8, Verify: true},
	reduce: allreduce.Config{Count: 1 << 20, Ranks: 4, Iters: 3},
}

// rankMain is a rank process of workload name.
func rankMain(name string, args []string) int {
	switch name {
	case "kvcache":
		return job.RankMain(args, kvcache.Rank)
	case "prefix":
		return job.RankMain(args, prefixcache.Rank)
	case "allreduce":
		return job.RankMain(args, allreduce.Rank)
	}
	fmt.Fprintf(os.Stderr, "no workload %q\n", name)
	return 2
}

// procs starts a workload's ranks as processes of this executable, at
// nice value nice (0: unchanged; "nice-rank N" before the name: each rank
// applies it to all its threads as it starts, since a child inherits only
// the nice value of the thread that forked it).
func procs(name string, cfg any, nice int) job.Starter {
	if nice != 0 {
		return job.Processes([]string{"workloads", "nice-rank", strconv.Itoa(nice), name}, cfg)
	}
	return job.Processes([]string{"workloads", "rank", name}, cfg)
}

// row is one line of the report: a figure per round.
type row struct {
	name  string
	unit  string
	vals  []float64
	ratio string // a row name to compare with (same unit)
	lower bool   // lower is better
	// beside names a row whose median is printed in this row's cell
	// too: the prefix cache's owner CPU beside its throughput.
	beside string
}

type table struct {
	title string
	rows  []*row
	index map[string]*row
}

func (t *table) add(name, unit string, v float64, ratio string, lower bool) {
	if t.index == nil {
		t.index = map[string]*row{}
	}
	r := t.index[name]
	if r == nil {
		r = &row{name: name, unit: unit, ratio: ratio, lower: lower}
		t.index[name] = r
		t.rows = append(t.rows, r)
	}
	r.vals = append(r.vals, v)
}

// besides makes row name's cell also show row other's median.
func (t *table) besides(name, other string) {
	if r := t.index[name]; r != nil {
		r.beside = other
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func (t *table) write(w io.Writer) {
	fmt.Fprintf(w, "## %s\n\n| figure | median | runs | vs |\n|---|---:|---|---|\n", t.title)
	for _, r := range t.rows {
		vs := ""
		if b := t.index[r.ratio]; b != nil {
			vs = fmt.Sprintf("%.2fx %s", median(r.vals)/median(b.vals), b.name)
		}
		cell := fmt.Sprintf("%.3g", median(r.vals))
		if b := t.index[r.beside]; b != nil {
			cell += fmt.Sprintf(" (%s %.3g %s)", b.name, median(b.vals), b.unit)
		}
		fmt.Fprintf(w, "| %s (%s) | %s | %.3g-%.3g | %s |\n", r.name, r.unit, cell, slices.Min(r.vals), slices.Max(r.vals), vs)
	}
	fmt.Fprintln(w)
}

func run(ctx context.Context, out, progress io.Writer, p params, only []string, rounds, nice int) error {
	kv := &table{title: fmt.Sprintf("KV-cache hand-off: %d layers x %d tokens x %d x %d B = %.0f MiB; RDMA over %d QPs",
		p.kv.Layers, p.kv.Tokens, p.kv.Width, p.kv.DTypeBytes, float64(p.kv.Bytes())/(1<<20), p.qps)}
	px := &table{title: fmt.Sprintf("Shared prefix: %.0f MiB, %d readers x %d pulls, READs of %d KiB, %d outstanding",
		float64(p.prefix.Bytes)/(1<<20), p.prefix.Readers, p.prefix.Rounds, p.prefix.Chunk>>10, p.prefix.Depth)}
	ar := &table{title: fmt.Sprintf("Ring all-reduce: %d ranks x %.0f MiB float32, median of %d all-reduces a run",
		p.reduce.Ranks, float64(p.reduce.Count*4)/(1<<20), p.reduce.Iters)}
	for i := range rounds {
		fmt.Fprintf(progress, "round %d of %d\n", i+1, rounds)
		if slices.Contains(only, "kvcache") {
			rs, err := kvcache.Compare(ctx, p.kv, p.qps, p.conns, false, true, func(c kvcache.Config) job.Starter { return procs("kvcache", c, nice) })
			if err != nil {
				return err
			}
			for _, r := range rs {
				name := fmt.Sprintf("%s %d", r.Transport, r.Lanes)
				kv.add(name+" Gbit/s", "Gbit/s", r.Gbps, "tcp 1 Gbit/s", false)
				kv.add(name+" total", "ms", r.Total*1e3, "tcp 1 total", true)
				kv.add(name+" first layer", "ms", r.First*1e3, "tcp 1 first layer", true)
				kv.add(name+" untimed first pass", "ms", r.Cold*1e3, "tcp 1 untimed first pass", true)
				kv.add(name+" prefill CPU", "s", r.SendCPU, "tcp 1 prefill CPU", true)
				kv.add(name+" decode CPU", "s", r.CPU, "tcp 1 decode CPU", true)
			}
		}
		if slices.Contains(only, "prefix") {
			rs, err := prefixcache.Compare(ctx, p.prefix, func(c prefixcache.Config) job.Starter { return procs("prefix", c, nice) })
			if err != nil {
				return err
			}
			for _, r := range rs {
				px.add(r.Transport+" Gbit/s", "Gbit/s, all readers", r.Gbps(), "tcp Gbit/s", false)
				px.add(r.Transport+" owner CPU", "s", r.CPU, "tcp owner CPU", true)
				px.add(r.Transport+" owner CPU per GiB", "s", r.CPU/(float64(r.Served)/(1<<30)), "tcp owner CPU per GiB", true)
				px.add(r.Transport+" readers' CPU", "s", r.ReaderCPU, "tcp readers' CPU", true)
				px.besides(r.Transport+" Gbit/s", r.Transport+" owner CPU")
			}
		}
		if slices.Contains(only, "allreduce") {
			rs, err := allreduce.Compare(ctx, p.reduce, func(c allreduce.Config) job.Starter { return procs("allreduce", c, nice) })
			if err != nil {
				return err
			}
			for _, r := range rs {
				ar.add(r.Transport+" algbw", "Gbit/s", r.AlgGbps(), "tcp algbw", false)
				ar.add(r.Transport+" time", "ms", r.Median()*1e3, "tcp time", true)
				ar.add(r.Transport+" CPU per all-reduce, all ranks", "s", r.CPU, "tcp CPU per all-reduce, all ranks", true)
			}
		}
	}
	for _, t := range []*table{kv, px, ar} {
		if len(t.rows) > 0 {
			t.write(out)
		}
	}
	return nil
}
