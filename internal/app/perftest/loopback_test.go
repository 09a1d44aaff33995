package perftest

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
)

// peerMem evaluates PeerChecks against the other rxego's memory.
type peerMem struct {
	mu     sync.Mutex
	checks []PeerCheck
}

func (p *peerMem) hold(c []PeerCheck) error {
	p.mu.Lock()
	p.checks = append(p.checks, c...)
	p.mu.Unlock()
	return nil
}

// verify checks every collected PeerCheck against res's memory.
func (p *peerMem) verify(t *testing.T, side string, res *Result) int {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.checks {
		off := c.Addr - res.MemAddr
		if c.Addr < res.MemAddr || off+uint64(len(c.Data)) > uint64(len(res.Mem)) {
			t.Errorf("%s check %q: address %#x (+%d) outside the peer's buffer %#x+%d", side, c.What, c.Addr, len(c.Data), res.MemAddr, len(res.Mem))
			continue
		}
		if got := res.Mem[off:][:len(c.Data)]; !bytes.Equal(got, c.Data) {
			t.Errorf("%s check %q: peer memory differs", side, c.What)
		}
	}
	return len(p.checks)
}

type loopCase struct {
	test   Test
	atomic AtomicOp
	size   int
	iters  int
	all    bool
	qps    int
	rdmaCM bool // -R: the exchange and the QPs connect with rdma_cm
	// mod, when set, changes both sides' Config (the modes: -Q, -l, -D, -b, ...).
	mod func(*Config)
	// clientFor, when set, ends the client's context after this long (an
	// endless run).
	clientFor time.Duration
	// noPeerChecks: the mode leaves no memory a side can vouch for.
	noPeerChecks bool
}

func (c loopCase) String() string {
	s := fmt.Sprintf("%s/s=%d/n=%d", c.test, c.size, c.iters)
	if c.atomic != "" {
		s += "/" + string(c.atomic)
	}
	if c.all {
		s += "/a"
	}
	if c.qps > 1 {
		s += fmt.Sprintf("/q=%d", c.qps)
	}
	if c.rdmaCM {
		s += "/R"
	}
	return s
}

// The loopback addresses of the two peers: a random 127.X.Y.0/24 per test
// process, so that concurrent test runs (and other packages' loopback
// tests on 127.0.0.1) do not fight over UDP port 4791.
var serverAddr, clientAddr = func() (netip.Addr, netip.Addr) {
	x, y := byte(rand.N(200)+20), byte(rand.N(254)+1)
	return netip.AddrFrom4([4]byte{127, x, y, 1}), netip.AddrFrom4([4]byte{127, x, y, 2})
}()

// runPair runs a server on serverAddr and a client on clientAddr.
func runPair(t *testing.T, lc loopCase) (srv, cli *Result, sout, cout string) {
	t.Helper()
	var sm, cmem peerMem
	base := Config{Test: lc.test, Atomic: lc.atomic, Size: lc.size, Iters: lc.iters, All: lc.all, NumQPs: lc.qps,
		Timeout: 60 * time.Second, RDMACM: lc.rdmaCM}
	if lc.mod != nil {
		lc.mod(&base)
	}
	scfg, ccfg := base, base
	scfg.Local, scfg.Hold = serverAddr, sm.hold
	ccfg.Local, ccfg.Server, ccfg.Hold = clientAddr, serverAddr.String(), cmem.hold
	if lc.rdmaCM {
		// rdma_cm ports belong to the device: any will do.
		scfg.Port = 20000 + rand.N(10000)
		// A REQ sent before the server's device is open is lost; retry it
		// after about 0.6 s rather than rdma_cm's 4.6 s.
		fast := &cm.Config{ResponseTimeout: 14}
		scfg.CMConfig, ccfg.CMConfig = fast, fast
	} else {
		ln, err := net.Listen("tcp", netip.AddrPortFrom(serverAddr, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		scfg.Listener, scfg.Port = ln, ln.Addr().(*net.TCPAddr).Port
	}
	ccfg.Port = scfg.Port
	var sb, cb bytes.Buffer
	scfg.Out, ccfg.Out = &sb, &cb
	type ret struct {
		r   *Result
		err error
	}
	ch := make(chan ret, 1)
	go func() {
		r, err := Run(context.Background(), scfg)
		ch <- ret{r, err}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if lc.clientFor > 0 {
		ctx, cancel = context.WithTimeout(ctx, lc.clientFor)
		defer cancel()
	}
	cli, cerr := Run(ctx, ccfg)
	sr := <-ch
	if cerr != nil || sr.err != nil {
		t.Fatalf("client: %v\n%s\n%s\nserver: %v\n%s\n%s", cerr, engineSummary(cli), cb.String(), sr.err, engineSummary(sr.r), sb.String())
	}
	srv = sr.r
	// Each side's checks describe the other side's memory.
	n := cmem.verify(t, "client", srv) + sm.verify(t, "server", cli)
	if lc.test != WriteLat && n == 0 && !lc.noPeerChecks {
		t.Errorf("no peer checks")
	}
	return srv, cli, sb.String(), cb.String()
}

// engineSummary renders a run's engine counters for failure messages.
func engineSummary(r *Result) string {
	if r == nil || r.Device == nil {
		return "(no device)"
	}
	s := r.Device.Stats()
	return fmt.Sprintf("engine: sent %d rcvd %d retransmits %d rcvd_seq_err %d duplicate %d out_of_seq %d naks %d",
		s.SentPkts, s.RcvdPkts, s.Retransmits, s.RcvdSeqErr, s.DuplicateRequest,
		s.OutOfSeqRequest, s.NAKsSent)
}

// TestLoopback runs every test between two rxego peers on loopback: the
// exchange, the loops, the printed tables, rxego's own data checks and
// each side's PeerChecks evaluated against the other side's memory.
func TestLoopback(t *testing.T) {
	cases := []loopCase{
		{test: SendBW, size: 1, iters: 20}, {test: SendBW, size: 1025, iters: 20}, {test: SendBW, size: 65536, iters: 5},
		{test: SendBW, size: 100, iters: 300, qps: 3},
		{test: WriteBW, size: 1, iters: 100}, {test: WriteBW, size: 1025, iters: 20}, {test: WriteBW, size: 1 << 20, iters: 5},
		{test: WriteBW, size: 64, iters: 50, qps: 4},
		{test: ReadBW, size: 1, iters: 100}, {test: ReadBW, size: 1025, iters: 20}, {test: ReadBW, size: 1 << 20, iters: 5},
		{test: ReadBW, size: 4096, iters: 10, qps: 2},
		{test: AtomicBW, atomic: FetchAndAdd, iters: 200}, {test: AtomicBW, atomic: CmpAndSwap, iters: 200},
		{test: AtomicBW, atomic: FetchAndAdd, iters: 100, qps: 2},
		{test: SendLat, size: 1, iters: 20}, {test: SendLat, size: 1025, iters: 10}, {test: SendLat, size: 65536, iters: 5},
		{test: WriteLat, size: 1, iters: 20}, {test: WriteLat, size: 1025, iters: 10}, {test: WriteLat, size: 65536, iters: 5},
		{test: ReadLat, size: 1, iters: 20}, {test: ReadLat, size: 1025, iters: 10}, {test: ReadLat, size: 65536, iters: 5},
		{test: AtomicLat, atomic: FetchAndAdd, iters: 20}, {test: AtomicLat, atomic: CmpAndSwap, iters: 20},
		{test: SendBW, all: true, iters: 5}, {test: WriteBW, all: true, iters: 5}, {test: ReadBW, all: true, iters: 5},
		{test: SendLat, all: true, iters: 5}, {test: WriteLat, all: true, iters: 5}, {test: ReadLat, all: true, iters: 5},
	}
	for _, lc := range cases {
		t.Run(lc.String(), func(t *testing.T) {
			if lc.all && testing.Short() {
				t.Skip("-short: -a moves 16 MiB per iteration")
			}
			checkPair(t, lc)
		})
	}
}

// TestLoopbackRDMACM runs every test with -R between two rxego peers: the
// exchange over an rdma_cm-connected QP, the data QPs connected by the CM
// (one connection each, several with -q), the same tables and data checks,
// and both sides' connections torn down at the end.
func TestLoopbackRDMACM(t *testing.T) {
	cases := []loopCase{
		{test: SendBW, size: 1025, iters: 20}, {test: SendBW, size: 100, iters: 100, qps: 3},
		{test: WriteBW, size: 65536, iters: 10}, {test: WriteBW, size: 64, iters: 50, qps: 4},
		{test: ReadBW, size: 1025, iters: 20}, {test: ReadBW, size: 4096, iters: 10, qps: 2},
		{test: AtomicBW, atomic: FetchAndAdd, iters: 100}, {test: AtomicBW, atomic: CmpAndSwap, iters: 50, qps: 2},
		{test: SendLat, size: 1025, iters: 10}, {test: WriteLat, size: 1025, iters: 10},
		{test: ReadLat, size: 65536, iters: 5}, {test: AtomicLat, atomic: FetchAndAdd, iters: 20},
	}
	for _, lc := range cases {
		lc.rdmaCM = true
		t.Run(lc.String(), func(t *testing.T) {
			srv, cli, sout, cout := checkPair(t, lc)
			for _, side := range []struct {
				name string
				r    *Result
				out  string
			}{{"server", srv, sout}, {"client", cli, cout}} {
				if !strings.Contains(side.out, "Data ex. method : rdma_cm") {
					t.Errorf("%s's header does not say rdma_cm:\n%s", side.name, side.out)
				}
				if strings.Contains(side.out, "rdma_cm teardown") {
					t.Errorf("%s: teardown failed:\n%s", side.name, side.out)
				}
			}
		})
	}
}

// checkPair runs lc with runPair and checks the tables, the reports and
// the data checks of both sides.
func checkPair(t *testing.T, lc loopCase) (srv, cli *Result, sout, cout string) {
	t.Helper()
	srv, cli, sout, cout = runPair(t, lc)
	header := resultFmtBW
	if lc.test.Lat() {
		header = resultFmtLat
	}
	lines := 1
	if lc.all {
		lines = 23 // 2 bytes to 8 MiB
	}
	client := cout
	if !strings.Contains(client, header) {
		t.Errorf("client output has no table header:\n%s", client)
	}
	switch {
	case lc.test.Lat():
		if len(cli.Lat) != lines || cli.Lat[0].Iters != lc.iters {
			t.Errorf("client latency lines %+v", cli.Lat)
		}
	default:
		q := max(lc.qps, 1)
		srvLines := 1 // a write, read or atomic server prints the client's last report
		if lc.test == SendBW {
			srvLines = lines
		}
		if len(cli.BW) != lines || cli.BW[0].Iters != uint64(lc.iters*q) || len(srv.BW) != srvLines || srv.BW[0].Iters != uint64(lc.iters*q) {
			t.Errorf("BW reports: client %+v server %+v", cli.BW, srv.BW)
		}
	}
	if cli.Checked+srv.Checked == 0 && lc.test != WriteBW {
		t.Errorf("no data checks (client %d, server %d)", cli.Checked, srv.Checked)
	}
	if cli.Mismatches+srv.Mismatches != 0 {
		t.Errorf("mismatches: client %d server %d", cli.Mismatches, srv.Mismatches)
	}
	if testing.Verbose() {
		t.Logf("server:\n%s\nclient:\n%s", sout, cout)
	}
	return srv, cli, sout, cout
}

// TestRDMACMClientRetries starts a -R client while the server's device
// has a connection manager but nobody listens: its REQs draw REJs with
// reason 8 (as the Linux CM answers), and the client dials again, with
// its exchange QP reset and its receive posted again, until the server
// runs; then the test completes with its data checks.
func TestRDMACMClientRetries(t *testing.T) {
	dev, err := rxego.Open(netip.AddrPortFrom(serverAddr, rxego.DefaultPort).String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	early, err := cm.New(dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	port := 20000 + rand.N(10000)
	base := Config{Test: SendBW, Size: 100, Iters: 20, Timeout: 30 * time.Second, RDMACM: true, Port: port}
	ccfg := base
	ccfg.Local, ccfg.Server = clientAddr, serverAddr.String()
	type ret struct {
		r   *Result
		err error
	}
	cli := make(chan ret, 1)
	go func() {
		r, err := Run(context.Background(), ccfg)
		cli <- ret{r, err}
	}()
	// Wait for at least two rejections, then make way for the server.
	for end := time.Now().Add(10 * time.Second); early.Counters()["cm_sent_rej"] < 2; {
		if time.Now().After(end) {
			t.Fatalf("no rejections to the early client: %v", early.Counters())
		}
		time.Sleep(10 * time.Millisecond)
	}
	rejected := early.Counters()["cm_sent_rej"]
	early.Close()
	scfg := base
	scfg.Device = dev
	srv, serr := Run(context.Background(), scfg)
	c := <-cli
	if serr != nil || c.err != nil {
		t.Fatalf("server: %v; client: %v", serr, c.err)
	}
	if srv.Checked == 0 || srv.Mismatches != 0 {
		t.Errorf("server checks: %d, mismatches %d", srv.Checked, srv.Mismatches)
	}
	t.Logf("client rejected %d times before the server listened", rejected)
}
