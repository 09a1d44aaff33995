// Package conformance runs rdma-core's tools with Linux Soft-RoCE
// (rdma_rxe) in QEMU guests (package lab) against rxego running on the host
// side of the lab's bridge, and writes a markdown report of every case.
//
// Shared infrastructure (this file), for every test file of the package:
//
//   - TestMain builds the rxego binary once (rxegoBin; $RXEGO_BIN names a
//     prebuilt one instead) when the lab can run, and at the end closes
//     the shared lab and writes the shared report (report, rows grouped by
//     case) to $RXEGO_REPORT or conformance/report.md.
//   - requireLab(t) skips the test when the lab cannot run here (naming
//     lab.SetupCommand), or fails it when CI=true; -short skips too; with
//     the lab present, a failed rxego build fails.
//   - forEachKernel(t, fn) runs fn(t, p) as one parallel subtest per kernel
//     (lab.Kernels, or the comma-separated $RXEGO_KERNELS), with p a *Peer
//     leased for the subtest. Kernels run in parallel; cases on one kernel
//     run one after another.
//   - lease(t, kernel) *Peer gives the test exclusive use of that kernel's
//     guest (booted on first use, shared by all tests, killed at the end)
//     until the test ends. A Peer carries the Lab, the Guest, and the host
//     end rxego uses for it: HostIP, HostIP6 (addresses on the lab bridge
//     reserved for this kernel, so kernels can run in parallel) and Port
//     (a TCP port for the tools' exchange, reserved likewise).
//   - p.Case(t, Case{...}, body) runs body as a subtest and one report row:
//     it reads the guest's rxe hw_counters before and after, asserts that
//     the error counters not named in Case.Expect stayed 0, and, when body
//     returns rxego's own counters (Outcome.Rxego, e.g. from parseStats),
//     that the packet counts of both sides agree (rxe's rcvd_pkts counts
//     only packets whose headers and ICRC it accepted) less the drops
//     (Outcome.Dropped, else what the guest's tap dropped: tapDrops) and
//     that any timeout retries are explained (see timing). Case.Require
//     names counters that must have moved ("rxe:send_rnr_err"),
//     Case.Lossy and Case.Tail relax the balance to inequalities when the
//     drops are not known.
//   - $RXEGO_GUEST_DEATHS=FILE records each test during which a guest
//     kernel died (recordGuestDeath), for scripts/test.sh's one rerun.
//   - $RXEGO_CAPTURE=DIR captures the bridge during every case to
//     DIR/<test name>.pcap (all kernels' traffic: filter by address;
//     a repeated case adds -2, -3, ...).
//   - p.startRxego(t, ctx, args...) runs the rxego binary in the lab
//     namespace; hostProc.waitListen waits for its TCP listener and
//     hostProc.wait for its exit. parseStats reads the line `--stats`
//     prints.
package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rxego/rxego/conformance/lab"
)

// rxegoBin is the rxego binary TestMain built; empty when the lab is not
// available (buildErr then says why, if the build itself failed).
var (
	rxegoBin string
	buildErr error
)

// report collects every case's row; TestMain writes it at the end.
var report = lab.NewReport("rxego conformance against rdma_rxe")

// defaultReport is where the report goes without $RXEGO_REPORT, relative
// to the package directory the test runs in.
const defaultReport = "report.md"

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if bin := os.Getenv("RXEGO_BIN"); bin != "" {
		rxegoBin = bin
	} else if lab.Available() == nil {
		dir, err := os.MkdirTemp("", "rxego-conformance-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		t0 := time.Now()
		bin := filepath.Join(dir, "rxego")
		out, err := exec.Command("go", "build", "-o", bin, "github.com/rxego/rxego/cmd/rxego").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("building rxego: %v\n%s", err, out)
		} else {
			rxegoBin = bin
			fmt.Fprintf(os.Stderr, "conformance: built rxego in %v\n", time.Since(t0).Round(time.Millisecond))
		}
	}
	runDescription = describeRun()
	code := m.Run()
	closeShared()
	if rows := report.Rows(); len(rows) > 0 {
		path := lab.ReportPath(defaultReport)
		if err := os.WriteFile(path, []byte(reportMarkdown()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "conformance: writing report:", err)
			code = 1
		} else {
			fmt.Fprintf(os.Stderr, "conformance: report with %d rows in %s\n", len(rows), path)
		}
	}
	return code
}

// requireLab skips the test when the lab cannot run here (or -short), and
// fails it under CI=true, where a missing lab is a broken set-up. With the
// lab present, an rxego binary that failed to build fails the test.
func requireLab(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the rxe lab boots QEMU guests")
	}
	if err := lab.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err) // the error names lab.SetupCommand
	}
	// The lab is here: a binary that does not build is a failure.
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	if rxegoBin == "" {
		t.Fatal("rxego binary not built")
	}
}

// kernels returns the kernel series to test: $RXEGO_KERNELS
// (comma-separated) or all of lab.Kernels.
func kernels() []string {
	env := os.Getenv("RXEGO_KERNELS")
	if env == "" {
		return lab.Kernels
	}
	var ks []string
	for _, k := range strings.Split(env, ",") {
		if k = strings.TrimSpace(k); slices.Contains(lab.Kernels, k) {
			ks = append(ks, k)
		}
	}
	return ks
}

// forEachKernel runs fn as a parallel subtest named after each kernel,
// with that kernel's guest leased for the subtest.
func forEachKernel(t *testing.T, fn func(t *testing.T, p *Peer)) {
	t.Helper()
	requireLab(t)
	for _, k := range kernels() {
		t.Run(k, func(t *testing.T) {
			t.Parallel()
			fn(t, lease(t, k))
		})
	}
}

// shared is the lab every test uses, created on first use.
var shared struct {
	once   sync.Once
	lab    *lab.Lab
	err    error
	mu     sync.Mutex
	guests map[string]*guestSlot
}

// guestSlot is one kernel's guest: booted once, leased to one test at a
// time through the token channel.
type guestSlot struct {
	once  sync.Once
	peer  *Peer
	err   error
	token chan struct{}
}

// Peer is one kernel's guest and the host end rxego uses to face it.
type Peer struct {
	Lab     *lab.Lab
	Guest   *lab.Guest
	Kernel  string // series, e.g. "6.12"
	HostIP  string // IPv4 address on the bridge for rxego's device
	HostIP6 string // IPv6 address on the bridge for rxego's device
	Port    int    // TCP port for the tools' exchange
}

// Per-kernel addresses: kernel i of lab.Kernels gets guest 198.18.0.(11+i),
// host end 198.18.0.(101+i) and 2001:2::(101+i), TCP port 18515+i.
const (
	guestBase = 11
	hostBase  = 101
	portBase  = 18515
)

// sharedLab returns the shared lab, creating it on first use.
func sharedLab(t *testing.T) *lab.Lab {
	t.Helper()
	shared.once.Do(func() {
		l, err := lab.New(lab.Options{Logf: logf, Keep: os.Getenv("RXEGO_KEEP") == "1"})
		if err != nil {
			shared.err = err
			return
		}
		// Host ends per kernel: each kernel's rxego binds its own address,
		// so kernels' cases can run at once.
		for i := range lab.Kernels {
			for _, a := range []string{fmt.Sprintf("198.18.0.%d/24", hostBase+i), fmt.Sprintf("2001:2::%d/64", hostBase+i)} {
				args := []string{"-n", l.Name(), "addr", "add", a, "dev", l.Bridge()}
				if strings.Contains(a, ":") {
					args = append(args, "nodad")
				}
				if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
					l.Close()
					shared.err = fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
					return
				}
			}
		}
		shared.lab = l
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.lab
}

// logf prints lab progress (boot times) to stderr, which go test shows.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "conformance: "+format+"\n", args...)
}

// lease returns kernel's peer for t's exclusive use until t ends, booting
// the guest on first use.
func lease(t *testing.T, kernel string) *Peer {
	t.Helper()
	idx := slices.Index(lab.Kernels, kernel)
	if idx < 0 {
		t.Fatalf("unknown kernel %q", kernel)
	}
	l := sharedLab(t)
	shared.mu.Lock()
	if shared.guests == nil {
		shared.guests = make(map[string]*guestSlot)
	}
	s := shared.guests[kernel]
	if s == nil {
		s = &guestSlot{token: make(chan struct{}, 1)}
		s.token <- struct{}{}
		shared.guests[kernel] = s
	}
	shared.mu.Unlock()

	// Bounded: a test holding the guest longer than this is itself stuck.
	select {
	case <-s.token:
	case <-time.After(30 * time.Minute):
		t.Fatalf("kernel %s: guest still leased after 30 minutes", kernel)
	}
	t.Cleanup(func() { s.token <- struct{}{} })

	s.once.Do(func() {
		g, err := l.Boot(kernel, fmt.Sprintf("198.18.0.%d", guestBase+idx), lab.BootOptions{})
		if err != nil {
			s.err = err
			return
		}
		s.peer = &Peer{Lab: l, Guest: g, Kernel: kernel,
			HostIP:  fmt.Sprintf("198.18.0.%d", hostBase+idx),
			HostIP6: fmt.Sprintf("2001:2::%d", hostBase+idx),
			Port:    portBase + idx}
	})
	if s.err != nil {
		t.Fatal(s.err)
	}
	if g := s.peer.Guest; g.Exited() {
		// The guest died during an earlier case (that case failed and
		// printed its console): a fresh one serves the cases after it,
		// which would otherwise all fail.
		logf("kernel %s: the guest had died (console below); booting a fresh one\n%s", kernel, g.ConsoleTail(40))
		g.Close()
		ng, err := l.Boot(kernel, g.IP(), lab.BootOptions{})
		if err != nil {
			t.Fatalf("kernel %s: rebooting the guest: %v", kernel, err)
		}
		s.peer.Guest = ng
	}
	return s.peer
}

// logNeighbours logs both ends' neighbour tables after a failed case:
// packets lost in both directions with nothing dropped on the bridge
// (TestPerftestIPv6 once) point at address resolution, which nothing
// else records.
func (p *Peer) logNeighbours(t *testing.T) {
	host, err := exec.Command("ip", "-n", p.Lab.Name(), "neigh", "show").CombinedOutput()
	if err != nil {
		host = fmt.Appendf(host, "(%v)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := p.Guest.Run(ctx, "ip", "neigh", "show")
	guest := string(res.Stdout)
	if err != nil {
		guest += fmt.Sprintf("(%v)", err)
	}
	t.Logf("neighbours after the failure: host side:\n%s\nguest %s:\n%s", host, p.Guest.IP(), guest)
}

// hung reports whether p's guest no longer answers: its agent fails two
// trivial commands in a row, each given 15 seconds (a loaded emulated
// guest answers in well under one).
func (p *Peer) hung() bool {
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		_, err := p.Guest.Run(ctx, "ip", "link", "show", "lo")
		cancel()
		if err == nil {
			return false
		}
	}
	return true
}

// recordGuestDeath notes, for scripts/test.sh, that p's guest kernel died
// during t: one line "TestName kernel" appended to $RXEGO_GUEST_DEATHS,
// with the whole console log copied beside that file. The script reruns
// such a test once on a fresh guest (docs/conformance.md, "When the guest
// kernel dies"); without the variable nothing is written.
func recordGuestDeath(t *testing.T, p *Peer) {
	path := os.Getenv("RXEGO_GUEST_DEATHS")
	if path == "" {
		return
	}
	top, _, _ := strings.Cut(t.Name(), "/")
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("recording the guest's death: %v", err)
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s %s\n", top, p.Kernel)
	if data, err := os.ReadFile(p.Guest.ConsoleLog()); err == nil {
		name := fmt.Sprintf("console-%s-%s-%d.log", top, p.Kernel, time.Now().Unix())
		if err := os.WriteFile(filepath.Join(filepath.Dir(path), name), data, 0o644); err == nil {
			t.Logf("the whole console: %s", filepath.Join(filepath.Dir(path), name))
		}
	}
}

// closeShared kills the guests and removes the lab.
func closeShared() {
	if shared.lab == nil {
		return
	}
	if err := shared.lab.Close(); err != nil {
		logf("lab close: %v", err)
	}
}

// Case describes one report row.
type Case struct {
	Name string // e.g. "rc_pingpong s=1025"
	Role string // e.g. "rxego server", "rxego client"
	// Expect names counters (rxe hw_counters or rxego's --stats names)
	// that may move in this case, e.g. retries under loss; every other
	// error counter must stay 0.
	Expect []string
	// Lossy says packets are dropped on purpose: the two sides' packet
	// counts then differ by the drops (see Outcome.Dropped).
	Lossy bool
	// Tail says the tool may exit with messages in flight, so each side
	// may have sent packets the other never counted.
	Tail bool
	// Require names counters that must have moved, as "rxe:NAME" or
	// "rxego:NAME": proof that the case exercised what it is about.
	Require []string
	// MaxResent, when above 0, bounds resentRatio of rxego's counters:
	// the case fails when more was sent again (issue 23).
	MaxResent float64
	// GuestTimerRetries, when set, says why the case accepts timeouts of
	// the guest's own requester (rxe's completer_retry_err) although it
	// reports no rxego counters to cross-check them against. A guest
	// whose requester never got its ACK still fails the case: it retries
	// until retry_exceeded_err, and its tool reports the error.
	GuestTimerRetries string
}

// resentRatio measures how much of a case's traffic went twice, from
// rxego's counters: the packets rxego retransmitted, and those it
// received and discarded as already received or as past a gap (the
// peer's retransmissions, and the go-back-N tail behind a loss, which the
// peer then sends again), per packet that was not wasted. It covers both
// roles: as the requester rxego's own resends count, as the responder (and
// as a READ's requester) the peer's.
func resentRatio(rx map[string]uint64) (ratio float64, wasted, useful uint64) {
	wasted = rx["retransmits"] + rx["drop_duplicate"] + rx["drop_out_of_sequence"] + rx["drop_stale_response"]
	total := rx["sent_pkts"] + rx["rcvd_pkts"]
	if wasted >= total {
		return 0, wasted, 0
	}
	useful = total - wasted
	return float64(wasted) / float64(useful), wasted, useful
}

// Outcome is what a case's body hands back for its row.
type Outcome struct {
	Note string
	// Retry asks Case to run the body again from scratch (at most three
	// times): the peer tool failed for a reason of its own, such as
	// perftest's clock calibration in an emulated guest before its
	// traffic ended, before anything about rxego was judged.
	Retry bool
	// Rxego is rxego's counters over the case (parseStats), or nil.
	Rxego map[string]uint64
	// Dropped, when known, is how many RoCE packets the lab's loss rules
	// dropped toward the guest and from it; packet counts then must
	// balance exactly, up to Overrun. When it is nil, Case counts the
	// drops at the guest's tap (tapDrops) as Overrun.
	Dropped *Drops
	// Overrun is what the path to the guest dropped when the emulated
	// guest fell behind (tap, virtio ring, qdisc, backlog). Those counters
	// count frames of every kind, the lab agent's TCP and ARP included,
	// so at most this many of them were RoCE packets: packet counts must
	// balance to within it.
	Overrun Drops
	// GuestRestarts, when not nil, is how many times the bridge capture
	// saw the guest's requester go back to a PSN it had sent before. A
	// body that reports no rxego counters sets it to have up to that
	// many of rxe's timeouts (completer_retry_err) accepted as the
	// guest's own: on the lab's busy host an emulated guest can stall
	// past its ACK timeout and take the timeout as soon as it runs again,
	// before the ACKs waiting in its queue. More timeouts than the wire
	// shows resends still fail the case.
	GuestRestarts *int
}

// Drops counts RoCE packets the lab dropped: by its loss rules, or at the
// guest's tap when the emulated NIC could not keep up.
type Drops struct {
	ToGuest, FromGuest uint64
}

// minus returns d - e per direction (0 where a counter went down).
func (d Drops) minus(e Drops) Drops {
	sub := func(a, b uint64) uint64 {
		if a < b {
			return 0
		}
		return a - b
	}
	return Drops{ToGuest: sub(d.ToGuest, e.ToGuest), FromGuest: sub(d.FromGuest, e.FromGuest)}
}

// tapDrops reads the host end of p's tap: TX dropped are packets for the
// guest that QEMU did not take in time (its virtio ring was full), RX
// dropped packets from the guest the bridge refused. It runs on the host,
// so it is cheap enough for every case.
func (p *Peer) tapDrops() (Drops, error) {
	ip := p.Guest.IP()
	tap := "tap" + ip[strings.LastIndexByte(ip, '.')+1:] // as package lab names it
	out, err := exec.Command("ip", "-n", p.Lab.Name(), "-s", "-j", "link", "show", "dev", tap).Output()
	if err != nil {
		return Drops{}, fmt.Errorf("ip link show %s: %w", tap, err)
	}
	var links []struct {
		Stats64 struct {
			RX struct{ Dropped uint64 } `json:"rx"`
			TX struct{ Dropped uint64 } `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return Drops{}, fmt.Errorf("ip link show %s: %q: %v", tap, out, err)
	}
	return Drops{ToGuest: links[0].Stats64.TX.Dropped, FromGuest: links[0].Stats64.RX.Dropped}, nil
}

// benign are the rxe counters (and rxego's) that count normal traffic;
// every other counter is an error or retry counter and must stay 0 unless
// the case expects it or it is a timing counter.
var benign = map[string]bool{
	"sent_pkts": true, "rcvd_pkts": true, "rdma_sends": true, "rdma_recvs": true,
	"sent_bytes": true, "rcvd_bytes": true, "completions_generated": true,
	"udp_sent_packets": true, "udp_sent_bytes": true, "udp_recv_packets": true,
	"udp_recv_bytes": true, "udp_gso_segments": true, "udp_gro_segments": true,
	// rxe counts an ACK it coalesced; rxego an ACK it deferred: both normal.
	"ack_deferred": true,
	// rxego held a READ request back until its READ responses in flight
	// fit its socket (qp/readsplit.go): flow control, not an error.
	"read_budget_waits": true,
	// rsocket messages taken after rxego's SHUTDOWN or DISCONNECT: a
	// normal ending, which checkCounters allows for (rsocketAfterShutdown).
	rsocketAfterShutdown: true,
}

// timing are the counters a loss-free run still moves when one side is
// too slow to acknowledge within the 67 ms ACK timeout the C tools set:
// the guests are emulated (TCG) and share two host CPUs, so a guest or
// rxego stalled for tens of milliseconds times the other side out. Such a
// timeout retry resends packets the receiver already has, which it counts
// as duplicates. When rxego's counters are known, checkCounters proves
// these retries lost and broke nothing: packet counts balance exactly,
// every duplicate rxe saw is a packet rxego resent, and no sequence error,
// NAK or drop occurred.
var timing = map[string]bool{
	"completer_retry_err": true, "retransmits": true,
	"duplicate_request": true, "drop_duplicate": true,
	// rxego's congestion window shrinks at each timeout (qp/window.go).
	"window_cuts": true,
}

// Case runs body as the subtest c.Name/c.Role on p's guest and records
// one report row with rxe's counter delta, whether body passed or not.
func (p *Peer) Case(t *testing.T, c Case, body func(t *testing.T) Outcome) {
	t.Helper()
	t.Run(strings.ReplaceAll(c.Name+"/"+c.Role, " ", "_"), func(t *testing.T) {
		before, err := p.Guest.HWCounters()
		if err != nil {
			t.Fatal(err)
		}
		var out Outcome
		tapBefore, err := p.tapDrops()
		if err != nil {
			t.Fatal(err)
		}
		capt := p.capture(t)
		t0 := time.Now()
		defer func() {
			d := time.Since(t0)
			tapAfter, err := p.tapDrops()
			if err != nil {
				t.Error(err)
			}
			if over := tapAfter.minus(tapBefore); out.Dropped == nil && over.ToGuest+over.FromGuest > 0 {
				// The emulated NIC overran and dropped packets: the case
				// saw loss it did not ask for. Count the drops so packets
				// still balance, and accept what loss causes.
				out.Dropped = &Drops{}
				out.Overrun = over
				c.Lossy = true
				c.Expect = append(slices.Clone(c.Expect), lossRetries...)
				out.Note = strings.TrimSpace(fmt.Sprintf("%s; guest overran: tap dropped %d to rxe, %d from rxe",
					out.Note, over.ToGuest, over.FromGuest))
			}
			if capt != nil {
				capt.Stop()
				t.Logf("capture: %s", capt.Path())
			}
			if p.Guest.Exited() {
				t.Errorf("the guest died during the case; its console:\n%s", p.Guest.ConsoleTail(80))
				out.Note = strings.TrimSpace(out.Note + "; the guest kernel died")
				recordGuestDeath(t, p)
			}
			after, err := p.Guest.HWCounters()
			if err != nil {
				t.Error(err)
			}
			delta := lab.CounterDelta(before, after)
			if !t.Failed() {
				checkCounters(t, c, delta, out)
			}
			if t.Failed() && !p.Guest.Exited() {
				p.logNeighbours(t)
				if p.hung() {
					// A kernel that stops answering without QEMU
					// exiting (6.1 once, in riostream): as a death,
					// so the next case gets a fresh guest and
					// scripts/test.sh reruns this test.
					t.Errorf("the guest stopped answering (its agent unreachable) and is killed; its console:\n%s", p.Guest.ConsoleTail(80))
					out.Note = strings.TrimSpace(out.Note + "; the guest kernel hung")
					recordGuestDeath(t, p)
					p.Guest.Kill()
				}
			}
			resent := ""
			if out.Rxego != nil {
				ratio, wasted, useful := resentRatio(out.Rxego)
				resent = fmt.Sprintf("%.1f%% (%d/%d)", 100*ratio, wasted, useful)
				if c.MaxResent > 0 && !t.Failed() && (useful == 0 || ratio > c.MaxResent) {
					t.Errorf("%s of the packets went twice (retransmitted, or discarded as duplicates or past a gap), bound %.0f%%",
						resent, 100*c.MaxResent)
				}
			}
			result := "pass"
			if t.Failed() {
				result = "FAIL"
			} else if t.Skipped() {
				result = "skip"
			}
			note := out.Note
			if out.Rxego != nil {
				note = strings.TrimSpace(note + " rxego: " + formatCounters(out.Rxego))
			}
			report.Add(lab.Row{Case: c.Name, Kernel: p.Kernel, Role: c.Role, Result: result,
				Duration: d, Counters: delta, Resent: resent, Note: note})
		}()
		for attempt := 1; ; attempt++ {
			out = body(t)
			if !out.Retry {
				break
			}
			if attempt == 3 {
				t.Fatalf("the peer tool failed for a reason of its own three times: %s", out.Note)
			}
			// The peer tool failed for an environmental reason before
			// anything was judged: measure the case again from scratch.
			t.Logf("attempt %d: %s; running the case again", attempt, out.Note)
			if before, err = p.Guest.HWCounters(); err != nil {
				t.Fatal(err)
			}
			if tapBefore, err = p.tapDrops(); err != nil {
				t.Fatal(err)
			}
			t0 = time.Now()
		}
	})
}

// capture starts a bridge capture for the running case when
// $RXEGO_CAPTURE names a directory; the file is named after the test.
func (p *Peer) capture(t *testing.T) *lab.Capture {
	dir := os.Getenv("RXEGO_CAPTURE")
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := strings.NewReplacer("/", "_", "=", "").Replace(t.Name())
	path := filepath.Join(dir, name+".pcap")
	// A repeated case (go test -count) keeps every run's capture.
	for i := 2; fileExists(path); i++ {
		path = filepath.Join(dir, fmt.Sprintf("%s-%d.pcap", name, i))
	}
	c, err := p.Lab.Capture(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// fileExists reports whether path names an existing file.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// checkCounters asserts rxe's delta and rxego's counters show no error the
// case does not expect, that timing retries are explained (see timing),
// and that packet counts balance.
func checkCounters(t *testing.T, c Case, rxe map[string]uint64, out Outcome) {
	t.Helper()
	// Without rxego's counters timing retries cannot be cross-checked, so
	// they count as errors then.
	allowTiming := out.Rxego != nil
	bad := func(side string, m map[string]uint64) {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if m[k] == 0 || benign[k] || allowTiming && timing[k] || slices.Contains(c.Expect, k) {
				continue
			}
			switch {
			case side == "rxe" && k == "completer_retry_err" && c.GuestTimerRetries != "":
				t.Logf("rxe counter %s = %d: accepted (%s)", k, m[k], c.GuestTimerRetries)
			case side == "rxe" && k == "completer_retry_err" && out.GuestRestarts != nil && m[k] <= uint64(*out.GuestRestarts):
				t.Logf("rxe counter %s = %d: accepted (the bridge saw the guest's requester go back %d times: its own timeouts)", k, m[k], *out.GuestRestarts)
			default:
				t.Errorf("%s counter %s = %d, want 0 (all: %s)", side, k, m[k], formatCounters(m))
			}
		}
	}
	bad("rxe", rxe)
	for _, r := range c.Require {
		side, name, _ := strings.Cut(r, ":")
		m := rxe
		if side == "rxego" {
			m = out.Rxego
		}
		if m[name] == 0 {
			t.Errorf("%s counter %s did not move: the case did not exercise what it tests", side, name)
		}
	}
	if out.Rxego == nil {
		return
	}
	rx := out.Rxego
	bad("rxego", rx)
	if !c.Lossy && !c.Tail {
		// A retry without loss is a timeout: rxe saw as duplicates only
		// packets rxego resent, and each side resent only after a timeout.
		if rxe["duplicate_request"] > rx["retransmits"] {
			t.Errorf("rxe counted %d duplicate requests, rxego resent only %d packets", rxe["duplicate_request"], rx["retransmits"])
		}
		if rx["retransmits"] > 0 && rx["completer_retry_err"] == 0 && rx["rcvd_rnr_err"] == 0 {
			t.Errorf("rxego resent %d packets without a timeout retry or an RNR NAK", rx["retransmits"])
		}
		if rx["duplicate_request"] > 0 && rxe["completer_retry_err"] == 0 {
			t.Errorf("rxego counted %d duplicate requests, rxe never retried", rx["duplicate_request"])
		}
	}
	var drop Drops
	if out.Dropped != nil {
		drop = *out.Dropped
	} else if c.Lossy || c.Tail {
		// Unknown drops: each side can only have received fewer.
		if rxe["rcvd_pkts"] > rx["udp_sent_packets"] || rx["udp_recv_packets"] > rxe["sent_pkts"] {
			t.Errorf("packet counts: rxe rcvd %d of rxego's %d sent, rxego received %d of rxe's %d sent",
				rxe["rcvd_pkts"], rx["udp_sent_packets"], rx["udp_recv_packets"], rxe["sent_pkts"])
		}
		return
	}
	// rxe counts rcvd_pkts after its header and ICRC checks: every packet
	// rxego sent that was not dropped must have passed them, but for
	// late replies to duplicates (lateReplies).
	balance(t, "rxe", rxe["rcvd_pkts"], "rxego", rx["udp_sent_packets"], drop.ToGuest,
		out.Overrun.ToGuest+lateReplies(rxe["completer_retry_err"], rx["duplicate_request"])+rx[rsocketAfterShutdown])
	balance(t, "rxego", rx["udp_recv_packets"], "rxe", rxe["sent_pkts"], drop.FromGuest,
		out.Overrun.FromGuest+lateReplies(rx["completer_retry_err"], rxe["duplicate_request"]))
	if t.Failed() {
		t.Logf("counters: rxe %s; rxego %s", formatCounters(rxe), formatCounters(rx))
	}
}

// lateReplies bounds the replies to duplicates that may reach a QP its
// tool has already destroyed, so the receiver drops them uncounted (rxe
// checks the QP before its rcvd_pkts counter; an exited rxego counts
// nothing). When a requester's timer resends its last message although
// the original arrived, the original's ACK completes it and the tool may
// tear down before the responder's reply to the copy arrives (seen in
// TestDCQCNAgainstRxe's capture: rxe resent a 64-packet SEND 1 ms after
// sending it, its timer armed long before, and the re-ACK came after
// ibv_rc_pingpong had exited). Without a timeout retry by the requester
// there are no such replies; with one, each duplicate the responder
// received is answered by at most one packet (ACKs coalesce), and any
// CNPs for them are counted among the drops already.
func lateReplies(requesterRetries, responderDuplicates uint64) uint64 {
	if requesterRetries == 0 {
		return 0
	}
	return responderDuplicates
}

// rsocketAfterShutdown names the --stats counter of the messages an
// rxego rsocket tool took from the peer after sending its own SHUTDOWN or
// DISCONNECT (rsocket.Stats.AfterShutdown). rsocket's rshutdown moves the
// QP to ERR once it has taken the peer's DISCONNECT or its own has
// completed, and rxe checks the QP's state before its rcvd_pkts counter,
// so each such message can cost one of rxego's packets uncounted by rxe:
// its ACK, when rstream had taken rxego's DISCONNECT first (a failing
// TestRstreamSizes capture: rxe sent rstream's DISCONNECT 37 us after
// acknowledging rxego's, rxego acknowledged it 85 us later, and rxe
// counted one packet fewer than rxego sent), or for rxe's DISCONNECT
// rxego's own, arriving after rxe's had completed. Never both for one
// message: whichever rxe took first it counted. A resend of rxego's
// DISCONNECT would be a retry the balance does not excuse.
const rsocketAfterShutdown = "rsocket_after_shutdown"

// balance checks that the receiver accepted every packet the sender sent
// but the dropped ones, and that at most missing more went missing: the
// path's overrun counters (which also count frames that were not RoCE
// packets) and late replies to duplicates.
func balance(t *testing.T, receiver string, accepted uint64, sender string, sent, dropped, missing uint64) {
	t.Helper()
	want := sent - dropped
	if accepted > want || accepted+missing < want {
		t.Errorf("%s accepted %d packets, %s sent %d minus %d dropped = %d (and up to %d more lost to the guest's overrun or late replies to duplicates)",
			receiver, accepted, sender, sent, dropped, want, missing)
	}
}

// formatCounters renders the non-zero counters as "name=value", sorted.
func formatCounters(m map[string]uint64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if m[k] != 0 {
			parts = append(parts, k+"="+strconv.FormatUint(m[k], 10))
		}
	}
	return strings.Join(parts, " ")
}

// statsPrefix starts the line `rxego ... --stats` prints.
const statsPrefix = "rxego-stats "

// parseStats finds the --stats line in a tool's output and returns its
// counters.
func parseStats(out []byte) (map[string]uint64, error) {
	for line := range strings.Lines(string(out)) {
		if rest, ok := strings.CutPrefix(line, statsPrefix); ok {
			m := make(map[string]uint64)
			if err := json.Unmarshal([]byte(rest), &m); err != nil {
				return nil, fmt.Errorf("rxego stats %q: %w", rest, err)
			}
			return m, nil
		}
	}
	return nil, errors.New("no rxego-stats line in the output")
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// Bytes returns a copy of what was written so far.
func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.b.Bytes())
}

// hostProc is the rxego binary (or another host program) running in the
// lab namespace.
type hostProc struct {
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	done           chan struct{}
	err            error // valid after done
}

// startRxego starts the rxego binary with args in the lab namespace. ctx
// kills it; so does the end of the test.
func (p *Peer) startRxego(t *testing.T, ctx context.Context, args ...string) *hostProc {
	t.Helper()
	h := &hostProc{cmd: p.Lab.CommandContext(ctx, rxegoBin, args...), done: make(chan struct{})}
	h.cmd.Stdout, h.cmd.Stderr = &h.stdout, &h.stderr
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		h.err = h.cmd.Wait()
		close(h.done)
	}()
	t.Cleanup(func() {
		select {
		case <-h.done:
		default:
			h.cmd.Process.Kill()
			<-h.done
		}
	})
	return h
}

// wait waits for the process to exit (bounded by ctx) and returns its
// error; output is in stdout and stderr.
func (h *hostProc) wait(ctx context.Context) error {
	select {
	case <-h.done:
		return h.err
	case <-ctx.Done():
		h.cmd.Process.Kill()
		<-h.done
		return fmt.Errorf("killed: %w", ctx.Err())
	}
}

// output returns stdout and stderr for messages.
func (h *hostProc) output() string {
	return fmt.Sprintf("stdout:\n%s\nstderr:\n%s", h.stdout.Bytes(), h.stderr.Bytes())
}

// waitListen waits until the process listens on TCP port (read from its
// own /proc/PID/net/tcp{,6}, which shows its namespace), so that a client
// started next does not race it.
func (h *hostProc) waitListen(ctx context.Context, port int) error {
	want := fmt.Sprintf(":%04X", port)
	for {
		for _, f := range []string{"tcp", "tcp6"} {
			data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", h.cmd.Process.Pid, f))
			for line := range strings.Lines(string(data)) {
				fs := strings.Fields(line)
				if len(fs) > 3 && strings.HasSuffix(fs[1], want) && fs[3] == "0A" {
					return nil
				}
			}
		}
		select {
		case <-h.done:
			return fmt.Errorf("exited before listening on %d: %v", port, h.err)
		case <-ctx.Done():
			return fmt.Errorf("not listening on %d: %w", port, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// readingNotes end the report.
const readingNotes = `
## Reading this report

Each row is one case: an rdma-core tool in a QEMU guest (rdma_rxe) facing
rxego on the host end of the lab bridge, or, for RNR, rxego inside the test
process. "rxe counters" is the delta of the guest's
/sys/class/infiniband/rxe0/ports/1/hw_counters over the case (zeros left
out); the note carries rxego's own counters over its run (the engine's
under rxe's names, udp_* for the socket layer; see internal/app/devstats).
"resent" is, from rxego's counters, the packets that went twice (rxego's
retransmissions, and what it received and discarded as duplicates or
past a gap) per packet delivered; the slow-peer cases bound it (10 %, 40 %
under loss; docs/reliability.md).

Checked in every case: both sides exit cleanly; rxego verified every
message it received (the tools echo what they receive, so this also
proves rxego's bytes reached the guest intact); no error counter moved on
either side except those the case is about; rxe's rcvd_pkts, which rxe
counts only after its header and ICRC checks, equals rxego's
udp_sent_packets minus the packets the lab dropped, and rxego's
udp_recv_packets equals rxe's sent_pkts minus the drops (when the emulated
guest overran, up to the frames its path dropped, which count the lab's
own control traffic too). Timeout retries
(completer_retry_err, retransmits, duplicate_request) can appear without
loss when an emulated guest stalls past the tools' 67 ms ACK timeout;
they are accepted only when every duplicate is accounted for by a resend
and the packet counts still balance. Loss rows drop data packets (ACKs
and NAKs pass) at random in both directions with nftables and show the
drop counts.
`

// reportMarkdown is the report, rows grouped by case and role in the
// order cases first ran with the kernels side by side, plus a summary, the
// kernels' releases and how to read it.
func reportMarkdown() string {
	rows := report.Rows()
	first := map[string]int{}
	key := func(r lab.Row) string { return r.Case + "\x00" + r.Role }
	for i, r := range rows {
		if _, ok := first[key(r)]; !ok {
			first[key(r)] = i
		}
	}
	slices.SortStableFunc(rows, func(a, b lab.Row) int {
		if d := first[key(a)] - first[key(b)]; d != 0 {
			return d
		}
		return slices.Index(lab.Kernels, a.Kernel) - slices.Index(lab.Kernels, b.Kernel)
	})
	sorted := lab.NewReport("rxego conformance against rdma_rxe")
	sorted.SetRun(runDescription + ", load average at the end " + loadAverage())
	results := map[string]int{}
	for _, r := range rows {
		sorted.Add(r)
		results[r.Result]++
	}
	var b strings.Builder
	b.WriteString(sorted.Markdown())
	fmt.Fprintf(&b, "\n%d cases:", len(rows))
	for _, k := range slices.Sorted(maps.Keys(results)) {
		fmt.Fprintf(&b, " %d %s", results[k], k)
	}
	b.WriteString(".\n\n## Kernels\n\n")
	for _, k := range lab.Kernels {
		if info, err := lab.Kernel(k); err == nil {
			fmt.Fprintf(&b, "- %s: %s (%s)\n", k, info.Release, info.Package)
		}
	}
	b.WriteString(readingNotes)
	return b.String()
}

// runDescription says which run the report comes from (describeRun).
var runDescription string

// describeRun names the run: the commit tested (and whether the work tree
// had changes), whether it ran under CI, the host's CPUs and load average
// at the start.
func describeRun() string {
	commit := "unknown commit"
	if out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output(); err == nil {
		commit = "commit " + strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
			commit += " with local changes"
		}
	}
	ci := "not CI"
	if os.Getenv("CI") == "true" {
		ci = "CI=true"
	}
	return fmt.Sprintf("%s, %s, %d CPUs, load average at the start %s", commit, ci, runtime.NumCPU(), loadAverage())
}

// loadAverage is the first three fields of /proc/loadavg, or "unknown".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}
