package job

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"
)

// RankFunc is the work of one rank, joined to its hub.
type RankFunc func(ctx context.Context, r *Rank) (result any, err error)

// Serve joins the hub at addr as rank id of size, runs f and hands its
// result or failure to the hub: the body of a rank, in a goroutine or in
// its own process.
func Serve(ctx context.Context, addr string, id, size int, f RankFunc) error {
	r, err := Join(ctx, addr, id, size)
	if err != nil {
		return err
	}
	res, err := f(ctx, r)
	if ferr := r.Finish(res, err); err == nil {
		err = ferr
	}
	return err
}

// Starter starts rank id of a job of size ranks whose hub is at hub, and
// returns a function that waits for it to end.
type Starter func(ctx context.Context, id, size int, hub string) (wait func() error, err error)

// Goroutines starts each rank as a goroutine of this process running f
// (tests, the demo).
func Goroutines(f RankFunc) Starter {
	return func(ctx context.Context, id, size int, hub string) (func() error, error) {
		done := make(chan error, 1)
		go func() { done <- Serve(ctx, hub, id, size, f) }()
		return func() error { return <-done }, nil
	}
}

// Processes starts each rank as a process: this program's own
// executable run with prefix, then -config (cfg as JSON) -hub ADDR -rank
// ID -size N, which the program hands to RankMain. The ranks' standard
// output goes to this process's standard error.
func Processes(prefix []string, cfg any) Starter {
	return func(ctx context.Context, id, size int, hub string) (func() error, error) {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		js, err := json.Marshal(cfg)
		if err != nil {
			return nil, err
		}
		a := append(append([]string(nil), prefix...), "-config", string(js), "-hub", hub,
			"-rank", strconv.Itoa(id), "-size", strconv.Itoa(size))
		cmd := exec.CommandContext(ctx, exe, a...)
		var errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = os.Stderr, &errOut
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		return func() error {
			if err := cmd.Wait(); err != nil {
				return fmt.Errorf("rank %d: %w: %s", id, err, bytes.TrimSpace(errOut.Bytes()))
			}
			return nil
		}, nil
	}
}

// IsRank reports whether args are those Processes gives a rank.
func IsRank(args []string) bool {
	for _, a := range args {
		if a == "-hub" {
			return true
		}
	}
	return false
}

// RankMain is the main of a rank process that Processes started: it
// parses the flags, decodes -config into a C, and serves rank(C). It
// returns the process's exit status; the failure, if any, went to the
// hub and to stderr.
func RankMain[C any](args []string, rank func(C) RankFunc) int {
	fs := flag.NewFlagSet("rank", flag.ContinueOnError)
	cfg := fs.String("config", "{}", "the job's configuration, JSON")
	hub := fs.String("hub", "", "the job's hub")
	id := fs.Int("rank", 0, "this rank")
	size := fs.Int("size", 1, "the job's ranks")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var c C
	err := json.Unmarshal([]byte(*cfg), &c)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), RankTimeout)
		defer cancel()
		err = Serve(ctx, *hub, *id, *size, rank(c))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// RankTimeout bounds a rank process's life.
const RankTimeout = 5 * time.Minute

// Launch runs a job of n ranks started by start and returns each rank's
// result decoded into results (a pointer to a slice).
func Launch(ctx context.Context, n int, start Starter, results any) error {
	h, err := NewHub(n)
	if err != nil {
		return err
	}
	defer h.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var waits []func() error
	for id := 0; id < n; id++ {
		w, err := start(ctx, id, n, h.Addr())
		if err != nil {
			cancel()
			return errors.Join(err, waitAll(waits))
		}
		waits = append(waits, w)
	}
	raw, err := h.Run(ctx)
	if err != nil {
		cancel() // a rank failed or hung: stop the rest
	}
	if werr := waitAll(waits); err == nil && werr != nil {
		err = werr
	}
	if err != nil {
		return err
	}
	all, _ := json.Marshal(raw)
	return json.Unmarshal(all, results)
}

// waitAll waits for every rank and joins their failures.
func waitAll(waits []func() error) error {
	errs := make([]error, len(waits))
	var wg sync.WaitGroup
	for i, w := range waits {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = w() }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Each runs run on each configuration in turn (an example over RDMA,
// then its TCP baselines) and collects the results; the first failure
// stops it, named by label.
func Each[C, R any](cs []C, label func(C) string, run func(C) (R, error)) ([]R, error) {
	var out []R
	for _, c := range cs {
		r, err := run(c)
		if err != nil {
			return out, fmt.Errorf("%s: %w", label(c), err)
		}
		out = append(out, r)
	}
	return out, nil
}

// BothWays runs c over RDMA and then over TCP: with(c, tcp) is c set to
// run over TCP or not.
func BothWays[C, R any](c C, with func(C, bool) C, run func(C) (R, error)) ([]R, error) {
	names := []string{"rdma", "tcp"}
	i := 0
	return Each([]C{with(c, false), with(c, true)}, func(C) string { i++; return names[i-1] }, run)
}
