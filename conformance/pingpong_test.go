package conformance

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/conformance/lab"
)

// ppRun is one run of an ibv_*_pingpong tool in the guest against
// `rxego pingpong` on the host end.
type ppRun struct {
	Tool        string // rc, uc, ud or srq
	Size        int
	Iters       int
	RxegoServer bool // rxego listens, the C tool connects; else the reverse
	IPv6        bool // use the IPv6 GIDs (TCP stays on IPv4)
	// GIDIndex gives rxego its address as the C tool gets its own: a GID
	// index (-d br0 -g N, N the index rxe would give the host's address
	// on the bridge); IPv4 only.
	GIDIndex bool
	RxDepth  int // -r on both sides; 0 for the tools' default
	// CheckC gives the C tool -c too (--chk: its first message then has
	// each page's first byte zeroed, and it checks those bytes of what it
	// receives); rxego always checks (-c).
	CheckC bool
	NumQP  int // srq: -q on both sides; 0 for the tools' 16
	// Timeout bounds the whole run; default 2 minutes.
	Timeout time.Duration
	// StatsQuiet is how long rxego waits for silence before reading its
	// counters (--stats-quiet); 0 for its default.
	StatsQuiet time.Duration
}

// role names who listens, for report rows.
func (r ppRun) role() string {
	if r.RxegoServer {
		return "rxego server"
	}
	return "rxego client"
}

// name is the case name for report rows.
func (r ppRun) name() string {
	n := fmt.Sprintf("%s_pingpong s=%d n=%d", r.Tool, r.Size, r.Iters)
	if r.NumQP > 0 {
		n += fmt.Sprintf(" q=%d", r.NumQP)
	}
	if r.IPv6 {
		n += " ipv6"
	}
	if r.GIDIndex {
		n += " -g index"
	}
	if r.CheckC {
		n += " -c"
	}
	return n
}

// verifyLine is what `rxego pingpong -c` prints after a clean run.
var verifyLine = regexp.MustCompile(`verify: (\d+) of (\d+) received messages matched`)

// pingpong runs r on p and returns rxego's counters. Both sides must exit
// 0, report r.Iters iterations, and rxego must have checked every message
// it received (the C tools echo what they receive, so this also proves
// rxego's bytes reached the guest intact).
func (p *Peer) pingpong(t *testing.T, r ppRun) Outcome {
	t.Helper()
	timeout := r.Timeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	gidIdx, hostAddr := "1", p.HostIP
	if r.IPv6 {
		gidIdx, hostAddr = strconv.Itoa(p.gid6Index(t)), p.HostIP6
	}
	// -e: both sides sleep on completion events rather than spin, which
	// leaves the host's CPUs to the emulated guests: a starved guest or
	// rxego stalls long enough to set off rxe's 67 ms retransmit timer.
	common := []string{"-e", "-p", strconv.Itoa(p.Port), "-s", strconv.Itoa(r.Size), "-n", strconv.Itoa(r.Iters)}
	if r.RxDepth > 0 {
		common = append(common, "-r", strconv.Itoa(r.RxDepth))
	}
	if r.NumQP > 0 {
		common = append(common, "-q", strconv.Itoa(r.NumQP))
	}
	cTool := append([]string{"ibv_" + r.Tool + "_pingpong", "-d", "rxe0", "-g", gidIdx}, common...)
	if r.CheckC {
		cTool = append(cTool, "-c")
	}
	gidArgs := []string{"-g", hostAddr}
	if r.GIDIndex {
		gidArgs = []string{"-d", p.Lab.Bridge(), "-g", strconv.Itoa(p.hostGIDIndex(t))}
	}
	// rxego runs under the C tool's own name, taking its flags exactly.
	rxego := append(append([]string{"ibv_" + r.Tool + "_pingpong", "-c", "--stats",
		"-timeout", (timeout - 5*time.Second).String()}, gidArgs...), common...)
	if r.StatsQuiet > 0 {
		rxego = append(rxego, "--stats-quiet", r.StatsQuiet.String())
	}

	var h *hostProc
	var proc *lab.Proc
	var err error
	if r.RxegoServer {
		h = p.startRxego(t, ctx, rxego...)
		if err := h.waitListen(ctx, p.Port); err != nil {
			t.Fatalf("rxego server: %v\n%s", err, h.output())
		}
		if proc, err = p.Guest.Start(append(cTool, hostAddrTCP(p))...); err != nil {
			t.Fatal(err)
		}
	} else {
		if proc, err = p.Guest.Start(cTool...); err != nil {
			t.Fatal(err)
		}
		if err := p.Guest.WaitTCPListen(ctx, p.Port); err != nil {
			proc.Kill()
			t.Fatal(err)
		}
		h = p.startRxego(t, ctx, append(rxego, p.Guest.IP())...)
	}
	defer proc.Kill()
	cRes, cErr, rErr := p.waitBoth(t, ctx, proc, h)
	if rErr != nil || cErr != nil {
		t.Fatalf("%s\nrxego: %v\n%s\nC tool: %v\nC stdout: %s", r.role(), rErr, h.output(), cErr, cRes.Stdout)
	}
	out := h.stdout.Bytes()
	want := fmt.Sprintf("%d iters in", r.Iters)
	if !regexp.MustCompile(regexp.QuoteMeta(want)).Match(cRes.Stdout) {
		t.Errorf("C tool: no %q in its output:\n%s", want, cRes.Stdout)
	}
	if r.CheckC && bytes.Contains(cRes.Stdout, []byte("invalid data")) {
		t.Errorf("C tool -c found rxego's data invalid:\n%s", cRes.Stdout)
	}
	if r.GIDIndex && !bytes.Contains(out, []byte("GID ::ffff:"+p.HostIP+"\n")) { // the local address line
		t.Errorf("rxego did not serve on its GID ::ffff:%s:\n%s", p.HostIP, out)
	}
	m := verifyLine.FindSubmatch(out)
	if m == nil || string(m[1]) != string(m[2]) || string(m[2]) == "0" {
		t.Errorf("rxego did not verify every message:\n%s", out)
	}
	stats, err := parseStats(out)
	if err != nil {
		t.Fatal(err)
	}
	note := ""
	if m != nil {
		note = fmt.Sprintf("%s messages verified", m[1])
	}
	return Outcome{Note: note, Rxego: stats}
}

// hostAddrTCP is the address the C tools reach rxego's TCP exchange at:
// IPv4 always (ibv_srq_pingpong's server listens on IPv4 only, and the
// RoCE addresses travel inside the exchange).
func hostAddrTCP(p *Peer) string { return p.HostIP }

// waitBoth waits for the guest's tool and rxego to end. If rxego fails
// first, the guest's QP states (`rdma res show qp`: PSNs, state) go to the
// test log before the tool is killed; if the tool ends first, rxego gets a
// few seconds to finish.
func (p *Peer) waitBoth(t *testing.T, ctx context.Context, proc *lab.Proc, h *hostProc) (lab.Result, error, error) {
	t.Helper()
	type end struct {
		res lab.Result
		err error
	}
	cDone := make(chan end, 1)
	go func() {
		res, err := proc.Wait(ctx)
		cDone <- end{res, err}
	}()
	select {
	case c := <-cDone:
		grace, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return c.res, c.err, h.wait(grace)
	case <-h.done:
		if h.err != nil {
			p.logQPState(t)
			proc.Kill()
		}
		c := <-cDone
		return c.res, c.err, h.err
	}
}

// logQPState logs the guest's RDMA QPs (state and PSNs) and counters.
func (p *Peer) logQPState(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := p.Guest.Run(ctx, "rdma", "-d", "res", "show", "qp")
	t.Logf("guest QPs (%v):\n%s%s", err, res.Stdout, res.Stderr)
	if c, err := p.Guest.HWCounters(); err == nil {
		t.Logf("guest hw_counters: %s", formatCounters(c))
	}
}

// gid6Index returns the index of the guest's RoCEv2 GID for its global
// IPv6 address (rxe adds it after the link-local and IPv4 ones).
func (p *Peer) gid6Index(t *testing.T) int {
	t.Helper()
	for i := range 16 {
		gid, err := p.Guest.GID(i)
		if err == nil && gid.String() == p.Guest.IP6() {
			return i
		}
	}
	t.Fatalf("guest %s: no GID for %s", p.Guest.IP(), p.Guest.IP6())
	return -1
}

// hostGIDIndex returns the index rxe would give the host's IPv4 address
// on the lab bridge (rxego.InterfaceGIDs: the default GID at 0, then the
// IPv4 addresses in the kernel's order, which `ip -o -4 addr` lists).
func (p *Peer) hostGIDIndex(t *testing.T) int {
	t.Helper()
	out, err := p.Lab.Command("ip", "-o", "-4", "addr", "show", "dev", p.Lab.Bridge()).Output()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[2] != "inet" {
			continue
		}
		n++
		if strings.HasPrefix(f[3], p.HostIP+"/") {
			return n
		}
	}
	t.Fatalf("no %s on %s:\n%s", p.HostIP, p.Lab.Bridge(), out)
	return -1
}

// TestPingpongGIDIndex runs rc_pingpong with rxego given a GID index, as
// the C tool is (-d br0 -g N), in both roles, on every kernel: rxego must
// serve on the address that index names and the runs pass as by address.
func TestPingpongGIDIndex(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, server := range []bool{true, false} {
			r := ppRun{Tool: "rc", Size: 4096, Iters: 10, RxegoServer: server, GIDIndex: true}
			p.Case(t, Case{Name: r.name(), Role: r.role()}, func(t *testing.T) Outcome { return p.pingpong(t, r) })
		}
	})
}

// TestPingpongCheck: ibv_rc_pingpong -c against rxego pingpong -c in
// both roles (issue 23): rxego's check accepts the C tool's first message,
// whose page starts -c zeroes, so every received message matches.
func TestPingpongCheck(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, server := range []bool{true, false} {
			r := ppRun{Tool: "rc", Size: 8192, Iters: 20, RxegoServer: server, CheckC: true}
			p.Case(t, Case{Name: r.name(), Role: r.role()}, func(t *testing.T) Outcome { return p.pingpong(t, r) })
		}
	})
}

// udMaxSize is the largest ud_pingpong message: the port's active MTU
// (1024 with the guests' 1500-byte Ethernet MTU); the tool refuses more.
const udMaxSize = 1024

// srqTail is what ibv_srq_pingpong with several QPs may leave behind: it
// stops once it has sent and received -n messages in all, with messages
// still in flight on other QPs, and exits. The side that ends first leaves
// the other's last messages unacknowledged, so the other retries them (and
// the retries meet a closed peer), and packet counts do not balance. A
// C-to-C run does the same. The tool also sends from and receives into
// one buffer shared by all QPs, so an echo of a multi-packet message can
// be torn between two incoming messages: these runs use 1-byte messages,
// which cannot tear, and data integrity at every size is covered by the
// one-QP runs.
var srqTail = []string{"completer_retry_err", "retransmits", "duplicate_request", "drop_duplicate"}

// TestPingpong runs every pingpong tool in both roles at sizes 1, one more
// than the path MTU (two packets) and 64 KiB (64 packets), UD at 1 and the
// MTU, over the IPv4 GIDs, on every kernel. SRQ runs with one QP, so that
// it ends cleanly and is held to the same exact counters, and once with 16
// QPs sharing the SRQ (see srqTail).
func TestPingpong(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, tool := range []string{"rc", "uc", "ud", "srq"} {
			sizes := []int{1, 1025, 65536}
			if tool == "ud" {
				sizes = []int{1, udMaxSize}
			}
			for _, size := range sizes {
				for _, server := range []bool{true, false} {
					r := ppRun{Tool: tool, Size: size, Iters: 20, RxegoServer: server}
					if tool == "srq" {
						r.NumQP = 1
					}
					p.Case(t, Case{Name: r.name(), Role: r.role()}, func(t *testing.T) Outcome {
						return p.pingpong(t, r)
					})
				}
			}
		}
		for _, server := range []bool{true, false} {
			r := ppRun{Tool: "srq", Size: 1, Iters: 64, RxegoServer: server, NumQP: 16}
			c := Case{Name: r.name(), Role: r.role(), Expect: srqTail, Tail: true}
			p.Case(t, c, func(t *testing.T) Outcome { return p.pingpong(t, r) })
		}
	})
}

// TestPingpongSRQManyQPs runs ibv_srq_pingpong -q 8 at 4 KiB (four
// packets a message) in both roles: receive completions of the shared
// queue arrive in the order its QPs consume it, and the tool echoes from
// one buffer all its QPs receive into, so rxego matches each completion
// to its buffer by wr_id and accepts an echo pieced from packets of its
// recent messages (package pingpong).
func TestPingpongSRQManyQPs(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, server := range []bool{true, false} {
			r := ppRun{Tool: "srq", Size: 4096, Iters: 64, RxegoServer: server, NumQP: 8}
			c := Case{Name: r.name(), Role: r.role(), Expect: srqTail, Tail: true}
			p.Case(t, c, func(t *testing.T) Outcome { return p.pingpong(t, r) })
		}
	})
}

// TestPingpongIPv6 is a smoke set over the IPv6 GIDs: each tool once per
// role at a multi-packet size (UD at the MTU).
func TestPingpongIPv6(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, tool := range []string{"rc", "uc", "ud", "srq"} {
			size := 4096
			if tool == "ud" {
				size = udMaxSize
			}
			for _, server := range []bool{true, false} {
				r := ppRun{Tool: tool, Size: size, Iters: 10, RxegoServer: server, IPv6: true}
				if tool == "srq" {
					r.NumQP = 1
				}
				p.Case(t, Case{Name: r.name(), Role: r.role()}, func(t *testing.T) Outcome {
					return p.pingpong(t, r)
				})
			}
		}
	})
}
