package harness

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Suite returns the cases of a full run: the yardsticks first, then rxego.
// quick shortens every measurement and keeps one size per family, for a
// smoke run; multiQPs, when not empty, adds the multi-QP rows for each of
// its QP counts above one (one QP's rows are in the suite already).
func Suite(quick bool, multiQPs []int) []Case {
	warm, dur := 300*time.Millisecond, 1500*time.Millisecond
	if quick {
		warm, dur = 100*time.Millisecond, 300*time.Millisecond
	}
	var cs []Case
	add := func(c Case) {
		c.Warmup, c.Duration = warm, dur
		cs = append(cs, c)
	}
	add(Case{Kind: TCPBW})
	add(Case{Kind: TCPPing})
	add(Case{Kind: RsocketBW})
	add(Case{Kind: RsocketPP})
	for _, size := range []int{1024, 4096} {
		for _, mode := range []string{UDPSingle, UDPMmsg, UDPGSO} {
			add(Case{Kind: UDPBW, Mode: mode, Size: size})
		}
	}
	add(Case{Kind: UDPBW, Mode: UDPGSORuns, Size: 4096})
	add(Case{Kind: UDPBW, Mode: UDPMmsg, Size: 64})
	add(Case{Kind: UDPPing})
	add(Case{Kind: UDPPing, Busy: true})
	sizes := []int{4 << 10, 64 << 10, 1 << 20}
	if quick {
		sizes = []int{64 << 10}
	}
	for _, op := range []string{"write", "read", "send"} {
		for _, mtu := range []int{1024, 4096} {
			for _, size := range sizes {
				add(Case{Kind: RxegoBW, Op: op, Size: size, MTU: mtu, Depth: bwDepth(size)})
			}
		}
	}
	for _, busy := range []bool{false, true} {
		for _, op := range []string{"send", "write", "read", "atomic"} {
			add(Case{Kind: RxegoLat, Op: op, MTU: 1024, Busy: busy})
		}
	}
	// Blocking, and polling as perftest's ib_write_bw does by default; post
	// lists of 32 (four in flight) and 64 (two in flight).
	for _, busy := range []bool{false, true} {
		for _, batch := range []int{32, 64} {
			add(Case{Kind: RxegoRate, MTU: 1024, Depth: 128, Batch: batch, Busy: busy})
		}
	}
	qps := 10000
	if quick {
		qps = 1000
	}
	add(Case{Kind: RxegoScale, MTU: 4096, Size: 4096, QPs: qps})
	// Multi-QP rows: N QPs of one device pair, beside N TCP streams and N
	// UDP GSO/GRO flows of the same sitting.
	for _, n := range multiQPs {
		if n <= 1 {
			continue // one QP: the rows above
		}
		add(Case{Kind: TCPBW, QPs: n})
		add(Case{Kind: UDPBW, Mode: UDPGSO, Size: 4096, QPs: n})
		for _, op := range []string{"write", "read", "send"} {
			for _, mtu := range []int{4096, 1024} {
				add(Case{Kind: RxegoBW, Op: op, Size: 64 << 10, MTU: mtu, QPs: n, Depth: max(2, bwDepth(64<<10)/n)})
			}
		}
	}
	// The 64-byte rate over 8 QPs, in both wait modes: issue 29's target
	// takes the faster.
	if len(multiQPs) > 0 {
		for _, busy := range []bool{false, true} {
			add(Case{Kind: RxegoRate, MTU: 1024, Depth: 128, Batch: 32, Busy: busy, QPs: 8})
		}
	}
	return cs
}

// MultiQPs are the default QP (stream, flow) counts of the multi-QP rows
// (-multi); -qps chooses others.
var MultiQPs = []int{1, 4, 8, 16}

// maxMultiQPs bounds -qps: more QPs than this are the scale case's job.
const maxMultiQPs = 256

// parseQPs reads -qps: QP counts separated by commas, each 1 to
// maxMultiQPs, in rising order.
func parseQPs(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > maxMultiQPs {
			return nil, fmt.Errorf("-qps: %q is not a QP count from 1 to %d", f, maxMultiQPs)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, fmt.Errorf("-qps: %d after %d: counts must rise", n, out[len(out)-1])
		}
		out = append(out, n)
	}
	return out, nil
}

// bwDepth keeps about 4 MiB in flight, between 2 and 64 messages.
func bwDepth(size int) int { return max(2, min(64, (4<<20)/size)) }

// RunCase runs c in two child processes of exe ("exe peer ...").
func RunCase(exe string, c Case) (Result, error) {
	spec, err := json.Marshal(c)
	if err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout(c)+time.Duration(c.QPs)*time.Millisecond+30*time.Second)
	defer cancel()
	srv, err := startPeer(ctx, exe, "server", string(spec), "")
	if err != nil {
		return Result{}, err
	}
	defer srv.kill()
	line, err := srv.line("ctl ")
	if err != nil {
		return Result{}, fmt.Errorf("server: %w%s", err, srv.stderr())
	}
	cli, err := startPeer(ctx, exe, "client", string(spec), line)
	if err != nil {
		return Result{}, err
	}
	defer cli.kill()
	cr, cerr := cli.result()
	sr, serr := srv.result()
	r := merge(cr, sr)
	r.Case, r.CPUs = c, runtime.NumCPU()
	if cerr != nil || serr != nil {
		return r, fmt.Errorf("%v%s / %v%s", cerr, cli.stderr(), serr, srv.stderr())
	}
	if r.Err != "" {
		return r, errors.New(r.Err)
	}
	return r, nil
}

// child is a running peer process.
type child struct {
	cmd    *exec.Cmd
	out    *bufio.Reader
	errBuf *strings.Builder
	done   bool
}

func startPeer(ctx context.Context, exe, role, spec, ctlAddr string) (*child, error) {
	args := []string{"peer", "-role", role, "-case", spec}
	if ctlAddr != "" {
		args = append(args, "-ctl", ctlAddr)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	ch := &child{cmd: cmd, out: bufio.NewReader(out), errBuf: &strings.Builder{}}
	cmd.Stderr = ch.errBuf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return ch, nil
}

// line reads stdout until a line starting with prefix and returns the rest.
func (c *child) line(prefix string) (string, error) {
	for {
		l, err := c.out.ReadString('\n')
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(strings.TrimPrefix(l, prefix)), nil
		}
		if err != nil {
			return "", fmt.Errorf("no %q line: %w", strings.TrimSpace(prefix), err)
		}
	}
}

// result reads the child's result line and waits for it to exit.
func (c *child) result() (Result, error) {
	var r Result
	l, lerr := c.line("result ")
	if lerr == nil {
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			lerr = err
		}
	}
	_, _ = io.Copy(io.Discard, c.out)
	werr := c.cmd.Wait()
	c.done = true
	if lerr != nil {
		return r, lerr
	}
	if werr != nil && r.Err == "" {
		return r, werr
	}
	return r, nil
}

func (c *child) kill() {
	if !c.done && c.cmd.Process != nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
		c.done = true
	}
}

func (c *child) stderr() string {
	if s := strings.TrimSpace(c.errBuf.String()); s != "" {
		return " (stderr: " + s + ")"
	}
	return ""
}

// Main is the command: "rxego-bench [flags]" runs the suite and prints the
// report; "rxego-bench compare ..." compares the -json output of sittings
// (see Compare); "rxego-bench peer ..." is a child process.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "compare" {
		return Compare(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "peer" {
		if err := Peer(args[1:], stdout); err != nil {
			fmt.Fprintln(stderr, "rxego-bench peer:", err)
			return 1
		}
		return 0
	}
	fs := flag.NewFlagSet("rxego-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "short measurements, fewer sizes (a smoke run of about a minute)")
	run := fs.String("run", "", "only cases whose name matches this regular expression")
	list := fs.Bool("list", false, "list the cases and exit")
	dur := fs.Duration("duration", 0, "measured interval per case (default 1.5s, -quick 0.3s)")
	jsonOut := fs.String("json", "", "also write every result as JSON lines to this file")
	repeat := fs.Int("repeat", 3, "run the suite this many times, in rounds, and report each case's median run")
	multi := fs.Bool("multi", false, "add the multi-QP rows: 4, 8 and 16 QPs of WRITE, READ and SEND beside as many TCP streams and UDP GSO/GRO flows, and the 64-byte rate over 8 QPs, blocking and busy-polling (about 52 s a round, -quick 20 s)")
	qpList := fs.String("qps", "", "the multi-QP rows' QP counts, comma-separated (e.g. 1,2,4,8,16; implies -multi; default 1,4,8,16)")
	budget := fs.Duration("budget", 0, "start no case once this much time has passed (0: no limit); cases not run are reported as such, so a sitting with a fixed time ends in it")
	nice := fs.Bool("nice", false, "raise the measuring processes' CPU priority (nice -20 on every thread of both peers, needs root) so other load on the machine disturbs the figures less")
	pin := fs.String("pin", "", "run the peers on these CPUs: one Linux CPU list for both (\"1\": both on CPU 1) or the server's and the client's apart (\"0/1\"); a round trip's figure depends on whether its wake-ups cross CPUs, so latency is best compared with the placement fixed")
	shards := fs.String("shards", "", "the rxego devices' shards: one count for both (\"1\") or the server's and the client's apart (\"4/1\"); default rxego's (one per CPU, but one on two CPUs or fewer)")
	zeroCopy := fs.Bool("zerocopy", false, "the rxego devices send payloads from registered memory (Options.ZeroCopy) instead of copying them into their slabs")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: rxego-bench [flags]\n\nMeasures rxego, raw UDP and TCP between two processes on loopback and prints a markdown report.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var qps []int
	if *multi {
		qps = MultiQPs
	}
	if *qpList != "" {
		var err error
		if qps, err = parseQPs(*qpList); err != nil {
			fmt.Fprintln(stderr, "rxego-bench:", err)
			return 2
		}
	}
	cases := Suite(*quick, qps)
	if *run != "" {
		re, err := regexp.Compile(*run)
		if err != nil {
			fmt.Fprintln(stderr, "rxego-bench: -run:", err)
			return 2
		}
		cases = filterCases(cases, re)
	}
	if *repeat < 1 {
		*repeat = 1
	}
	var sched Sched
	var err error
	if sched.Server, sched.Client, err = ParsePin(*pin); err != nil {
		fmt.Fprintln(stderr, "rxego-bench:", err)
		return 2
	}
	if sched.ServerShards, sched.ClientShards, err = ParseShards(*shards); err != nil {
		fmt.Fprintln(stderr, "rxego-bench:", err)
		return 2
	}
	sched.ZeroCopy = *zeroCopy
	if *nice {
		// A test of the permission only: each peer renices all its own
		// threads (applySched); a child inherits only the nice value of
		// the thread that forked it.
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, 0, -20); err != nil {
			fmt.Fprintf(stderr, "rxego-bench: nice -20 not applied (%v); figures may be noisier\n", err)
		} else {
			sched.Nice = -20
		}
	}
	for i := range cases {
		cases[i].Sched = sched
		if *dur > 0 {
			cases[i].Duration = *dur
		}
	}
	if *list {
		for _, c := range cases {
			fmt.Fprintln(stdout, c.Name())
		}
		return 0
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "rxego-bench:", err)
		return 1
	}
	var jw io.Writer
	if *jsonOut != "" {
		f, err := os.Create(*jsonOut)
		if err != nil {
			fmt.Fprintln(stderr, "rxego-bench:", err)
			return 1
		}
		defer f.Close()
		jw = f
	}
	// Rounds of the whole suite, so each case's runs are spread over the
	// sitting and a passing disturbance spoils one run of a case, not all.
	runs := make([][]Result, len(cases))
	start := time.Now()
	total := len(cases) * *repeat
	for round := range *repeat {
		for i, c := range cases {
			if *budget > 0 && time.Since(start) >= *budget {
				fmt.Fprintf(stderr, "time budget of %v spent: round %d stops before %s\n", *budget, round+1, c.Name())
				break
			}
			fmt.Fprintf(stderr, "[%3d/%d] %-44s ", round*len(cases)+i+1, total, c.Name())
			r, err := RunCase(exe, c)
			if err != nil {
				r.Err = err.Error()
				fmt.Fprintf(stderr, "FAILED: %v\n", err)
			} else {
				fmt.Fprintln(stderr, r.Summary())
			}
			runs[i] = append(runs[i], r)
			if jw != nil {
				b, _ := json.Marshal(r)
				fmt.Fprintf(jw, "%s\n", b)
			}
		}
	}
	fmt.Fprintf(stderr, "done in %v\n", time.Since(start).Round(time.Second))
	results := make([]Result, len(cases))
	failed := false
	for i := range runs {
		if len(runs[i]) == 0 {
			runs[i] = []Result{{Case: cases[i], Err: errNotRun}}
		}
		results[i] = median(runs[i])
		failed = failed || results[i].Err != ""
	}
	WriteReport(stdout, results, sched, *repeat)
	if failed {
		return 1
	}
	return 0
}

// errNotRun is the error of a case the time budget left out.
const errNotRun = "not run: the time budget (-budget) was spent"

// median returns the run with the median figure of the runs that
// succeeded (throughput, latency p50 or rate), with the lowest and highest
// figure of those runs in Low and High, or a failed run if all failed.
func median(runs []Result) Result {
	var ok []Result
	for _, r := range runs {
		if r.Err == "" {
			ok = append(ok, r)
		}
	}
	if len(ok) == 0 {
		return runs[0]
	}
	slices.SortFunc(ok, func(a, b Result) int { return cmp.Compare(a.figure(), b.figure()) })
	m := ok[len(ok)/2]
	m.Low, m.High, m.Runs = ok[0].figure(), ok[len(ok)-1].figure(), len(ok)
	return m
}

func filterCases(cs []Case, re *regexp.Regexp) []Case {
	var out []Case
	for _, c := range cs {
		if re.MatchString(c.Name()) {
			out = append(out, c)
		}
	}
	return out
}
