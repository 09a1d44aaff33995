package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// freePort returns a TCP port free on addr right now.
func freePort(t *testing.T, addr string) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// scrape fetches a metrics page and returns the value of the sample
// name{device="dev"...}.
func scrape(url, name, dev string) (float64, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\{device="` + regexp.QuoteMeta(dev) + `"[^}]*\} (\S+)$`)
	m := re.FindSubmatch(body)
	if m == nil {
		return 0, fmt.Errorf("no %s for %s in:\n%.3000s", name, dev, body)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// TestPingpongMetricsAddr runs an rxego pingpong server with
// --metrics-addr and a client against it, scrapes /metrics before the
// client comes (zero payload moved) and after the exchange while the
// server lingers: exactly n messages of s bytes received, and n plus the
// retransmitted ones (single-packet messages) sent. It checks the --pcap
// capture holds the server's packets.
func TestPingpongMetricsAddr(t *testing.T) {
	srv, cli := testaddr.Loopback().String(), testaddr.Loopback().String()
	port, mport := freePort(t, srv), freePort(t, srv)
	const n, size = 20, 64
	url := fmt.Sprintf("http://%s/metrics", net.JoinHostPort(srv, strconv.Itoa(mport)))
	pcap := filepath.Join(t.TempDir(), "server.pcapng")
	done := make(chan error, 1)
	go func() {
		done <- runPingpong([]string{"-g", srv, "-p", strconv.Itoa(port), "-n", strconv.Itoa(n), "-s", strconv.Itoa(size),
			"-timeout", "20s", "--pcap", pcap, "--metrics-addr", net.JoinHostPort(srv, strconv.Itoa(mport)), "--metrics-linger", "3s"})
	}()
	dev := net.JoinHostPort(srv, "4791")
	var before float64
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if before, err = scrape(url, "rxego_sent_payload_bytes_total", dev); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || before != 0 {
		t.Fatalf("before the run: %v, %v", before, err)
	}
	if err := runPingpong([]string{"-g", cli, "-p", strconv.Itoa(port), "-n", strconv.Itoa(n), "-s", strconv.Itoa(size), "-timeout", "20s", srv}); err != nil {
		t.Fatal(err)
	}
	// The server finishes its last exchange, then lingers.
	var sent, rcvd, retx, pkts float64
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		sent, _ = scrape(url, "rxego_sent_payload_bytes_total", dev)
		rcvd, _ = scrape(url, "rxego_rcvd_payload_bytes_total", dev)
		retx, _ = scrape(url, "rxego_retransmitted_pkts_total", dev)
		if sent == (n+retx)*size && rcvd == n*size {
			break
		}
	}
	pkts, err = scrape(url, "rxego_transport_pkts_total", dev)
	if sent != (n+retx)*size || rcvd != n*size || err != nil || pkts < n {
		t.Errorf("after the run: sent %v payload bytes (want (%d+%v retransmitted)*%d), received %v (want %d); %v packets out (%v)",
			sent, n, retx, size, rcvd, n*size, pkts, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the server did not finish")
	}
	var out, in int
	err = trace.ReadFile(pcap, func(r trace.Record) error {
		if !r.ICRCOK {
			t.Errorf("frame %d does not check", r.Frame)
		}
		if r.Src.String() == srv {
			out++
		} else {
			in++
		}
		return nil
	})
	// Each side sends n SENDs and ACKs some of the peer's.
	if err != nil || out < n || in < n {
		t.Errorf("capture: %d packets out, %d in (%v)", out, in, err)
	}
}

// TestDemoCommand runs two demo scenarios through the command with its
// own loopback addresses: per-scenario captures and the whole-tour
// --pcap are written, and the ladders show the loss and its recovery.
func TestDemoCommand(t *testing.T) {
	var addrs []string
	for range 8 {
		addrs = append(addrs, testaddr.Loopback().String())
	}
	dir := t.TempDir()
	all := filepath.Join(dir, "tour.pcapng")
	var out bytes.Buffer
	if err := demoTo(&out, []string{"--addrs", strings.Join(addrs, ","), "--pcap-dir", dir, "--pcap", all, "--color", "never", "write", "loss"}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"== write:", "== loss:", "LOST: never arrived", "NAK seq-err", "go-back-N", "Capture: " + filepath.Join(dir, "loss.pcapng")} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	count := func(path string) int {
		n := 0
		if err := trace.ReadFile(path, func(trace.Record) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	parts := count(filepath.Join(dir, "write.pcapng")) + count(filepath.Join(dir, "loss.pcapng"))
	if whole := count(all); parts < 2+11 || whole < parts {
		t.Errorf("%d packets in the scenario captures, %d in the tour's", parts, whole)
	}
	if err := demoTo(io.Discard, []string{"nosuch"}); err == nil {
		t.Error("unknown scenario accepted")
	}
	if _, err := os.Stat(filepath.Join(dir, "send.pcapng")); err == nil {
		t.Error("a scenario that did not run left a capture")
	}
}

// TestObserveOpenDevice checks the helper commands like perf use to open
// their device: nothing without an observing flag, a recorded device
// with --pcap, and an error in server mode without a local address.
func TestObserveOpenDevice(t *testing.T) {
	local := testaddr.Loopback()
	var none observeFlags
	if d, err := none.openDevice(local, "", nil); d != nil || err != nil {
		t.Fatalf("no flags: %v %v", d, err)
	}
	o := &observeFlags{pcap: filepath.Join(t.TempDir(), "perf.pcapng")}
	if err := o.start(); err != nil {
		t.Fatal(err)
	}
	if _, err := o.openDevice(netip.Addr{}, "", nil); err == nil || !strings.Contains(err.Error(), "--addr") {
		t.Errorf("server mode without an address: %v", err)
	}
	d, err := o.openDevice(local, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Addr().Addr() != local {
		t.Errorf("device on %v, want %v", d.Addr(), local)
	}
	if err := o.close(); err != nil {
		t.Fatal(err)
	}
	if err := trace.ReadFile(o.pcap, func(trace.Record) error { return nil }); err != nil {
		t.Errorf("the capture does not read: %v", err)
	}
}

// TestPerfTClass: perf's --tclass sets the IP TOS of the packets its
// device sends (perftest's GRH traffic class): a write_bw server given
// --tclass 104 (DSCP 26) sends its ACKs with DSCP 26 and, DCQCN being on,
// ECT(0); the client, given none, sends DSCP 0. Its --pcap shows both.
func TestPerfTClass(t *testing.T) {
	srv, cli := testaddr.Loopback().String(), testaddr.Loopback().String()
	port := strconv.Itoa(freePort(t, srv))
	pcap := filepath.Join(t.TempDir(), "server.pcapng")
	done := make(chan error, 1)
	go func() {
		done <- runPerf([]string{"write_bw", "--tclass", "104", "--addr", srv, "-p", port, "-n", "20", "-s", "4096", "--pcap", pcap, "--timeout", "20s"})
	}()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = runPerf([]string{"write_bw", "--addr", cli, "-p", port, "-n", "20", "-s", "4096", "--timeout", "20s", srv}); err == nil ||
			!strings.Contains(err.Error(), "refused") {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	dscp := map[string]map[[2]uint8]int{}
	err = trace.ReadFile(pcap, func(r trace.Record) error {
		if dscp[r.Src.String()] == nil {
			dscp[r.Src.String()] = map[[2]uint8]int{}
		}
		dscp[r.Src.String()][[2]uint8{r.DSCP, r.ECN}]++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s, c := dscp[srv], dscp[cli]
	if len(s) != 1 || s[[2]uint8{26, 2}] == 0 || len(c) != 1 || c[[2]uint8{0, 2}] == 0 {
		t.Errorf("(DSCP, ECN) of the packets: server %v, client %v; want (26, 2) and (0, 2)", s, c)
	}
}
