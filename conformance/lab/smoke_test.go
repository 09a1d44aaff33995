package lab_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rxego/rxego/conformance/lab"
)

// requireLab skips the test when the lab cannot run here, or fails it
// under CI=true, where a missing lab is a broken set-up.
func requireLab(t *testing.T) {
	t.Helper()
	if err := lab.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// newLab makes a lab closed at the end of the test; on failure the guests'
// console tails go to the test log first.
func newLab(t *testing.T) *lab.Lab {
	t.Helper()
	requireLab(t)
	l, err := lab.New(lab.Options{Logf: t.Logf, Keep: os.Getenv("RXEGO_KEEP") == "1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, g := range l.Guests() {
				t.Logf("console of %s (%s):\n%s", g.IP(), g.ConsoleLog(), g.ConsoleTail(30))
			}
		}
		if err := l.Close(); err != nil {
			t.Errorf("lab close: %v", err)
		}
	})
	return l
}

// bootPair boots server .11 and client .12 on kernel at once.
func bootPair(t *testing.T, l *lab.Lab, kernel string) (server, client *lab.Guest) {
	t.Helper()
	var wg sync.WaitGroup
	var errs [2]error
	var gs [2]*lab.Guest
	for i, ip := range []string{"198.18.0.11", "198.18.0.12"} {
		wg.Go(func() {
			gs[i], errs[i] = l.Boot(kernel, ip, lab.BootOptions{})
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range gs {
		t.Logf("kernel %s: guest %s ready %v after QEMU start", g.Kernel().Release, g.IP(), g.BootTime().Round(time.Millisecond))
	}
	return gs[0], gs[1]
}

// serverClient runs argv as a server on s (waiting for it to listen on TCP
// port when port > 0) and then argv plus s's address as client on c, and
// returns both results. Any failure fails the test.
func serverClient(t *testing.T, ctx context.Context, s, c *lab.Guest, port int, argv ...string) (srv, cli lab.Result) {
	t.Helper()
	p, err := s.Start(argv...)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if port > 0 {
		if err := s.WaitTCPListen(ctx, port); err != nil {
			out, errOut, _ := p.Output()
			t.Fatalf("%v\nserver stdout: %s\nserver stderr: %s", err, out, errOut)
		}
	}
	cli, err = c.Run(ctx, append(argv, s.IP())...)
	if err != nil {
		t.Fatalf("client: %v\nstdout: %s", err, cli.Stdout)
	}
	srv, err = p.Wait(ctx)
	if err != nil {
		t.Fatalf("server: %v\nstdout: %s", err, srv.Stdout)
	}
	return srv, cli
}

// counters reads hw_counters of every guest.
func counters(t *testing.T, gs ...*lab.Guest) []map[string]uint64 {
	t.Helper()
	out := make([]map[string]uint64, len(gs))
	for i, g := range gs {
		c, err := g.HWCounters()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = c
	}
	return out
}

// TestSmoke boots two guests per kernel and runs rxe-to-rxe traffic between
// them with rdma-core tools: RC pingpong over the IPv4 and IPv6 GIDs, an
// RDMA WRITE bandwidth run and rping over rdma_cm. It checks exit codes,
// the tools' own summaries and that rxe's packet counters moved.
func TestSmoke(t *testing.T) {
	requireLab(t)
	report := lab.NewReport("rxe lab smoke test")
	t.Cleanup(func() {
		path := lab.ReportPath(filepath.Join(t.TempDir(), "report.md"))
		if err := report.WriteFile(path); err != nil {
			t.Error(err)
		}
		t.Logf("report: %s\n%s", path, report.Markdown())
	})
	for _, k := range lab.Kernels {
		t.Run(k, func(t *testing.T) {
			t.Parallel()
			smoke(t, report, k)
		})
	}
}

func smoke(t *testing.T, report *lab.Report, kernel string) {
	l := newLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	s, c := bootPair(t, l, kernel)
	for _, g := range []*lab.Guest{s, c} {
		report.Add(lab.Row{Case: "boot", Kernel: g.Kernel().Release, Role: g.IP(), Result: "pass",
			Duration: g.BootTime(), Note: g.Kernel().Package})
	}
	t.Logf("kernel %s: both guests ready after %v", kernel, time.Since(start).Round(time.Millisecond))

	// The IPv4 GID is ::ffff:<ip> at index 1.
	for _, g := range []*lab.Guest{s, c} {
		gid, err := g.GID(1)
		if err != nil {
			t.Fatal(err)
		}
		if gid.String() != g.IP() {
			t.Fatalf("guest %s: GID 1 is %v, want %s", g.IP(), gid, g.IP())
		}
	}

	run := func(name string, port int, check func(srv, cli lab.Result) error, argv ...string) {
		t.Helper()
		before := counters(t, s, c)
		t0 := time.Now()
		srv, cli := serverClient(t, ctx, s, c, port, argv...)
		d := time.Since(t0)
		after := counters(t, s, c)
		if err := check(srv, cli); err != nil {
			t.Fatalf("%s: %v\nserver: %s\nclient: %s", name, err, srv.Stdout, cli.Stdout)
		}
		for i, g := range []*lab.Guest{s, c} {
			delta := lab.CounterDelta(before[i], after[i])
			if delta["rcvd_pkts"] == 0 || delta["sent_pkts"] == 0 {
				t.Errorf("%s: guest %s counters did not move: %v", name, g.IP(), delta)
			}
			role := "server"
			if g == c {
				role = "client"
			}
			report.Add(lab.Row{Case: name, Kernel: g.Kernel().Release, Role: role + " " + g.IP(),
				Result: "pass", Duration: d, Counters: delta})
		}
		t.Logf("%s on %s: %v", name, kernel, d.Round(time.Millisecond))
	}

	iters := func(n int) func(srv, cli lab.Result) error {
		return func(srv, cli lab.Result) error {
			want := []byte(fmt.Sprintf("%d iters in", n))
			if !bytes.Contains(srv.Stdout, want) || !bytes.Contains(cli.Stdout, want) {
				return fmt.Errorf("no %q in output", want)
			}
			return nil
		}
	}
	run("rc_pingpong", 18515, iters(20), "ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-n", "20")

	// IPv6: rxe adds a RoCEv2 GID for the guest's global IPv6 address.
	idx6 := gidIndex(t, s, s.IP6())
	if idx6c := gidIndex(t, c, c.IP6()); idx6c != idx6 {
		t.Fatalf("IPv6 GID index differs: %d on %s, %d on %s", idx6, s.IP(), idx6c, c.IP())
	}
	run("rc_pingpong_ipv6", 18515, iters(20), "ibv_rc_pingpong", "-d", "rxe0", "-g", fmt.Sprint(idx6), "-n", "20")

	run("write_bw", 18515, func(srv, cli lab.Result) error {
		// perftest prints a results table headed by "#bytes".
		if !bytes.Contains(cli.Stdout, []byte("#bytes")) {
			return fmt.Errorf("no result table")
		}
		return nil
	}, "ib_write_bw", "-d", "rxe0", "-x", "1", "-n", "10")

	rping(t, ctx, report, s, c)
}

// gidIndex returns the index of rxe0's GID equal to ip, checking 0..7.
func gidIndex(t *testing.T, g *lab.Guest, ip string) int {
	t.Helper()
	for i := range 8 {
		gid, err := g.GID(i)
		if err == nil && gid.String() == ip {
			return i
		}
	}
	t.Fatalf("guest %s: no GID for %s", g.IP(), ip)
	return -1
}

// rping runs rping (rdma_cm connection set-up, then SEND/READ/WRITE)
// between the guests. rping's server listens on an RDMA CM port, not TCP,
// so the client retries a few times while the server comes up.
func rping(t *testing.T, ctx context.Context, report *lab.Report, s, c *lab.Guest) {
	t.Helper()
	t0 := time.Now()
	p, err := s.Start("rping", "-s", "-a", s.IP(), "-v", "-C", "3")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	var cli lab.Result
	for attempt := range 5 {
		cli, err = c.Run(ctx, "rping", "-c", "-a", s.IP(), "-v", "-C", "3")
		if err == nil {
			break
		}
		t.Logf("rping client attempt %d: %v", attempt+1, err)
		time.Sleep(time.Second)
	}
	if err != nil {
		t.Fatal(err)
	}
	srv, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// -v prints each ping's payload: "ping data: rdma-ping-0: ABC...".
	for _, r := range []lab.Result{srv, cli} {
		if n := strings.Count(string(r.Stdout), "ping data: rdma-ping-"); n != 3 {
			t.Fatalf("rping: %d pings, want 3\nstdout: %s", n, r.Stdout)
		}
	}
	report.Add(lab.Row{Case: "rping", Kernel: s.Kernel().Release, Role: "pair", Result: "pass",
		Duration: time.Since(t0)})
}
