package conformance

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/conformance/lab"
)

// rdma_cm tests: librdmacm's rping and ucmatose in the guest against
// `rxego rping` and `rxego ucmatose` on the host end. The connection is
// made by the IB CM in MADs on QP1 (package cm), then the tools' own
// traffic runs on the RC QPs.

// cmListening starts the line rxego's rdma_cm servers print when ready.
const cmListening = "rxego: rdma_cm listening on "

// cmExpect: a disconnect moves the QPs to ERR (rdma_disconnect does so
// too), which flushes the receives still posted; and a packet the peer
// sent before it heard of the disconnect may reach rxego after the QP is
// destroyed (drop_closed_qp, qp/quarantine.go); so may a CM MAD for QP1
// after rxego's connection manager closed (a DREP to a DREQ that crossed
// the peer's: the one drop_unknown_qp seen in ib_atomic_lat -R runs). A
// packet for a QP number rxego never had (drop_unknown_qp) stays an error.
var cmExpect = []string{"flushed_work_requests", "drop_closed_qp"}

// cmTimeout bounds one rdma_cm run: guests are slow, and a lost CM
// message costs a retransmission timeout of about 4.6 s.
const cmTimeout = 2 * time.Minute

// waitOutput waits until the rxego process printed prefix, on its
// standard output or error.
func (h *hostProc) waitOutput(ctx context.Context, prefix string) error {
	for {
		if bytes.Contains(h.stdout.Bytes(), []byte(prefix)) || bytes.Contains(h.stderr.Bytes(), []byte(prefix)) {
			return nil
		}
		select {
		case <-h.done:
			return fmt.Errorf("exited before printing %q: %v", prefix, h.err)
		case <-ctx.Done():
			return fmt.Errorf("no %q: %w", prefix, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitCMListen waits until an rdma_cm ID in the guest listens on port (as
// `rdma resource show cm_id` lists it).
func (p *Peer) waitCMListen(ctx context.Context, port int) error {
	want := regexp.MustCompile(`state LISTEN .*src-addr \[?[0-9a-f.:]+\]?:` + strconv.Itoa(port) + `\b`)
	for {
		res, err := p.Guest.Run(ctx, "rdma", "resource", "show", "cm_id")
		if err == nil && want.Match(res.Stdout) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("guest: nothing listens on rdma_cm port %d: %w (last: %s)", port, ctx.Err(), res.Stdout)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// cmOutcome splits rxego's --stats into the engine and transport counters
// the case checks and the CM's counters, which go in the note.
func cmOutcome(t *testing.T, out []byte, note string) Outcome {
	t.Helper()
	stats, err := parseStats(out)
	if err != nil {
		t.Fatal(err)
	}
	return Outcome{Note: strings.TrimSpace(note + " " + splitCM(stats)), Rxego: stats}
}

// splitCM removes the CM's counters (cm_*) from stats and returns the
// non-zero ones as a note, "cm: sent_req=1 ...".
func splitCM(stats map[string]uint64) string {
	var cm []string
	for _, k := range slices.Sorted(maps.Keys(stats)) {
		if strings.HasPrefix(k, "cm_") {
			if stats[k] != 0 {
				cm = append(cm, fmt.Sprintf("%s=%d", strings.TrimPrefix(k, "cm_"), stats[k]))
			}
			delete(stats, k)
		}
	}
	if len(cm) == 0 {
		return ""
	}
	return "cm: " + strings.Join(cm, " ")
}

// rpingRun is one rping exchange.
type rpingRun struct {
	RxegoServer bool
	Count       int
	Size        int
	// Drop is rxego's -cm-drop: CM messages it loses on purpose.
	Drop string
	IPv6 bool // connect over the IPv6 addresses (GIDs)
}

func (r rpingRun) role() string {
	if r.RxegoServer {
		return "rxego server"
	}
	return "rxego client"
}

var (
	rpingClientLine = regexp.MustCompile(`(?m)^ping data: rdma-ping-(\d+): `)
	rpingServerLine = regexp.MustCompile(`(?m)^server ping data: rdma-ping-(\d+): `)
	rxegoServed     = regexp.MustCompile(`rxego rping: served (\d+) pings, (\d+) verified`)
	rxegoPinged     = regexp.MustCompile(`rxego rping: (\d+) pings, (\d+) verified`)
)

// countPings checks re's lines number 0..n-1 in order.
func countPings(t *testing.T, who string, re *regexp.Regexp, out []byte, n int) {
	t.Helper()
	ms := re.FindAllSubmatch(out, -1)
	if len(ms) != n {
		t.Errorf("%s: %d ping lines, want %d:\n%s", who, len(ms), n, out)
		return
	}
	for i, m := range ms {
		if string(m[1]) != strconv.Itoa(i) {
			t.Errorf("%s: line %d is ping %s", who, i, m[1])
		}
	}
}

// rping runs rping in the guest against rxego rping on the host end. Both
// sides check the data: the C client with -V compares what the server
// wrote back with what it sent, rxego's server checks every ping it read
// against rping's pattern, rxego's client compares like -V.
func (p *Peer) rping(t *testing.T, r rpingRun) Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmTimeout)
	defer cancel()
	count, size := strconv.Itoa(r.Count), strconv.Itoa(r.Size)
	port := "7174"
	hostIP, guestIP := p.HostIP, p.Guest.IP()
	if r.IPv6 {
		hostIP, guestIP = p.HostIP6, p.Guest.IP6()
	}
	rx := []string{"rping", "-p", port, "-S", size, "-v", "--stats", "-timeout", (cmTimeout - 10*time.Second).String()}
	if r.Drop != "" {
		rx = append(rx, "-cm-drop", r.Drop)
	}
	if r.RxegoServer {
		h := p.startRxego(t, ctx, append(rx, "-s", "-a", hostIP)...)
		if err := h.waitOutput(ctx, cmListening); err != nil {
			t.Fatalf("rxego server: %v\n%s", err, h.output())
		}
		res, err := p.Guest.Run(ctx, "rping", "-c", "-a", hostIP, "-p", port, "-S", size, "-v", "-V", "-C", count)
		if err != nil {
			h.wait(ctx)
			t.Fatalf("guest rping -c: %v\nstdout: %s\nstderr: %s\nrxego server %s", err, res.Stdout, res.Stderr, h.output())
		}
		if err := h.wait(ctx); err != nil {
			t.Fatalf("rxego server: %v\n%s", err, h.output())
		}
		countPings(t, "guest rping -c", rpingClientLine, res.Stdout, r.Count)
		countPings(t, "rxego server", rpingServerLine, h.stdout.Bytes(), r.Count)
		m := rxegoServed.FindSubmatch(h.stdout.Bytes())
		if m == nil || string(m[1]) != count || string(m[2]) != count {
			t.Errorf("rxego server did not serve and verify %d pings:\n%s", r.Count, h.output())
		}
		return cmOutcome(t, h.stdout.Bytes(), count+" pings verified by both")
	}
	proc, err := p.Guest.Start("rping", "-s", "-a", guestIP, "-p", port, "-S", size, "-v", "-C", count)
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	if err := p.waitCMListen(ctx, 7174); err != nil {
		t.Fatal(err)
	}
	h := p.startRxego(t, ctx, append(rx, "-c", "-a", guestIP, "-I", hostIP, "-V", "-C", count)...)
	rerr := h.wait(ctx)
	if rerr != nil {
		proc.Kill()
	}
	res, err := proc.Wait(ctx)
	if rerr != nil || err != nil {
		t.Fatalf("rxego client: %v\n%s\nguest rping -s: %v\nstdout: %s\nstderr: %s", rerr, h.output(), err, res.Stdout, res.Stderr)
	}
	countPings(t, "rxego client", rpingClientLine, h.stdout.Bytes(), r.Count)
	countPings(t, "guest rping -s", rpingServerLine, res.Stdout, r.Count)
	m := rxegoPinged.FindSubmatch(h.stdout.Bytes())
	if m == nil || string(m[1]) != count || string(m[2]) != count {
		t.Errorf("rxego client did not verify %d pings:\n%s", r.Count, h.output())
	}
	return cmOutcome(t, h.stdout.Bytes(), count+" pings verified by both")
}

// TestRping runs rping against rxego in both roles, at rping's default
// size and at one spanning several packets, over IPv4 and IPv6.
func TestRping(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, size := range []int{64, 3000} {
			for _, server := range []bool{true, false} {
				r := rpingRun{RxegoServer: server, Count: 10, Size: size}
				p.Case(t, Case{Name: fmt.Sprintf("rping S=%d C=10", size), Role: r.role(), Expect: cmExpect}, func(t *testing.T) Outcome {
					return p.rping(t, r)
				})
			}
		}
		for _, server := range []bool{true, false} {
			r := rpingRun{RxegoServer: server, Count: 10, Size: 64, IPv6: true}
			p.Case(t, Case{Name: "rping S=64 C=10 ipv6", Role: r.role(), Expect: cmExpect}, func(t *testing.T) Outcome {
				return p.rping(t, r)
			})
		}
	})
}

// TestRpingCMLoss loses CM messages on purpose (rxego drops them as a
// lossy link would, so the run is deterministic): a lost REP and RTU on
// rxego's server, and on its client. Each side's retransmission (or the
// answer to a duplicate) must recover.
func TestRpingCMLoss(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, r := range []rpingRun{
			{RxegoServer: true, Count: 3, Size: 64, Drop: "out:REP"},
			{RxegoServer: true, Count: 3, Size: 64, Drop: "in:RTU"},
			{RxegoServer: false, Count: 3, Size: 64, Drop: "in:REP"},
			{RxegoServer: false, Count: 3, Size: 64, Drop: "out:RTU"},
			{RxegoServer: false, Count: 3, Size: 64, Drop: "in:DREP"},
		} {
			p.Case(t, Case{Name: "rping lost " + r.Drop, Role: r.role(), Expect: cmExpect}, func(t *testing.T) Outcome {
				out := p.rping(t, r)
				if !strings.Contains(out.Note, "dropped=1") {
					t.Errorf("rxego dropped no CM message: %s", out.Note)
				}
				return out
			})
		}
	})
}

// TestCMReject: a connection request for an rdma_cm port nobody listens
// on is rejected with reason 8 (invalid service ID), both ways.
func TestCMReject(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		p.Case(t, Case{Name: "REQ to a closed port", Role: "rxego client", Expect: cmExpect}, func(t *testing.T) Outcome {
			ctx, cancel := context.WithTimeout(context.Background(), cmTimeout)
			defer cancel()
			h := p.startRxego(t, ctx, "rping", "-c", "-a", p.Guest.IP(), "-I", p.HostIP, "-p", "7999", "-C", "1", "--stats")
			err := h.wait(ctx)
			if err == nil || !strings.Contains(string(h.stderr.Bytes()), "connection refused (REJ, reason 8") {
				t.Fatalf("rxego client: %v, want a REJ with reason 8\n%s", err, h.output())
			}
			return cmOutcome(t, h.stdout.Bytes(), "REJ reason 8")
		})
		p.Case(t, Case{Name: "REQ to a closed port", Role: "rxego server"}, func(t *testing.T) Outcome {
			ctx, cancel := context.WithTimeout(context.Background(), cmTimeout)
			defer cancel()
			h := p.startRxego(t, ctx, "rping", "-s", "-a", p.HostIP, "-p", "7174", "--stats", "-timeout", "10s")
			if err := h.waitOutput(ctx, cmListening); err != nil {
				t.Fatalf("rxego server: %v\n%s", err, h.output())
			}
			res, err := p.Guest.Run(ctx, "rping", "-c", "-a", p.HostIP, "-p", "7999", "-C", "1")
			if err == nil || !strings.Contains(string(res.Stderr)+string(res.Stdout), "RDMA_CM_EVENT_REJECTED, error 8") {
				t.Errorf("guest rping -c: %v, want REJECTED error 8\nstdout: %s\nstderr: %s", err, res.Stdout, res.Stderr)
			}
			h.wait(ctx) // the server gives up at its -timeout
			return cmOutcome(t, h.stdout.Bytes(), "REJ reason 8")
		})
	})
}

// exchangeLine is the summary rxego ucmatose and rxego udaddy print.
var exchangeLine = regexp.MustCompile(`rxego (\w+): (\d+) connections?, (\d+) sent, (\d+) received, (\d+) verified`)

// ucmatose runs ucmatose in the guest against rxego ucmatose with conns
// connections of 10 messages each way; rxego verifies every message.
func (p *Peer) ucmatose(t *testing.T, rxegoServer bool, conns int) Outcome {
	return p.cmExchange(t, "ucmatose", 7471, rxegoServer, conns, 10*conns)
}

// cmExchange runs the rdma-core tool in the guest against rxego's tool of
// the same name and flags, in the role asked, with conns connections of
// 10 messages each way, and checks both ends: the tool's status 0, and
// rxego's summary with verified messages checked.
func (p *Peer) cmExchange(t *testing.T, tool string, port int, rxegoServer bool, conns, verified int) Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmTimeout)
	defer cancel()
	c := strconv.Itoa(conns)
	rx := []string{tool, "-c", c, "--stats", "-timeout", (cmTimeout - 10*time.Second).String()}
	var h *hostProc
	var res lab.Result
	if rxegoServer {
		h = p.startRxego(t, ctx, append(rx, "-b", p.HostIP)...)
		if err := h.waitOutput(ctx, cmListening); err != nil {
			t.Fatalf("rxego server: %v\n%s", err, h.output())
		}
		var err error
		if res, err = p.Guest.Run(ctx, tool, "-s", p.HostIP, "-c", c); err != nil {
			h.wait(ctx)
			t.Fatalf("guest %s: %v\nstdout: %s\nrxego server %s", tool, err, res.Stdout, h.output())
		}
		if err := h.wait(ctx); err != nil {
			t.Fatalf("rxego server: %v\n%s", err, h.output())
		}
	} else {
		proc, err := p.Guest.Start(tool, "-b", p.Guest.IP(), "-c", c)
		if err != nil {
			t.Fatal(err)
		}
		defer proc.Kill()
		if err := p.waitCMListen(ctx, port); err != nil {
			t.Fatal(err)
		}
		h = p.startRxego(t, ctx, append(rx, "-s", p.Guest.IP(), "-b", p.HostIP)...)
		rerr := h.wait(ctx)
		if rerr != nil {
			proc.Kill()
		}
		res, err = proc.Wait(ctx)
		if rerr != nil || err != nil {
			t.Fatalf("rxego client: %v\n%s\nguest %s: %v\nstdout: %s", rerr, h.output(), tool, err, res.Stdout)
		}
	}
	if !bytes.Contains(res.Stdout, []byte("return status 0")) {
		t.Errorf("guest %s did not end with status 0:\n%s", tool, res.Stdout)
	}
	msgs := strconv.Itoa(10 * conns)
	m := exchangeLine.FindSubmatch(h.stdout.Bytes())
	if m == nil || string(m[1]) != tool || string(m[2]) != c || string(m[3]) != msgs || string(m[4]) != msgs || string(m[5]) != strconv.Itoa(verified) {
		t.Errorf("rxego: want %s connections, %s messages each way, %d verified:\n%s", c, msgs, verified, h.output())
	}
	return cmOutcome(t, h.stdout.Bytes(), msgs+" messages each way")
}

// TestUcmatose runs ucmatose with one and with several connections in
// both roles.
func TestUcmatose(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, conns := range []int{1, 4} {
			for _, server := range []bool{true, false} {
				role := "rxego client"
				if server {
					role = "rxego server"
				}
				p.Case(t, Case{Name: fmt.Sprintf("ucmatose -c %d", conns), Role: role, Expect: cmExpect}, func(t *testing.T) Outcome {
					return p.ucmatose(t, server, conns)
				})
			}
		}
	})
}
