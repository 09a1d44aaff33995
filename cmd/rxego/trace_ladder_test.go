package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/demo"
	"github.com/rxego/rxego/internal/testaddr"
)

// TestTraceLadder draws the ladder and the summary of rxego's RNR
// recording and writes its page.
func TestTraceLadder(t *testing.T) {
	const rnr = "../../internal/ladder/testdata/rxego_rnr.pcapng"
	var out bytes.Buffer
	if err := traceTo(&out, []string{"--ladder", rnr}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"QP pair 1 (RC)", "RNR NAK psn 1000", "RETX: retry after an RNR wait", "completes #1", "A -> B"} {
		if !strings.Contains(s, want) {
			t.Errorf("ladder lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "\x1b[") {
		t.Error("colors on a buffer with --color auto")
	}
	out.Reset()
	if err := traceTo(&out, []string{"--summary", rnr}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "|--") || !strings.Contains(out.String(), "RTT ms") {
		t.Errorf("summary:\n%s", out.String())
	}
	page := filepath.Join(t.TempDir(), "p.html")
	out.Reset()
	if err := traceTo(&out, []string{"--html", page, "--packets", rnr}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(page)
	if err != nil || !bytes.Contains(b, []byte(`<svg class="ladder"`)) || !bytes.Contains(b, []byte("render-check")) {
		t.Errorf("page: %v, %d bytes", err, len(b))
	}
	if n := strings.Count(out.String(), "\n"); n != 10 {
		t.Errorf("--packets printed %d lines, want the capture's 10 packets", n)
	}
	for _, bad := range [][]string{{"-w", "x.pcapng", rnr}, {"--color", "pink", "--ladder", rnr}, {"--ladder"}, {"-i", "lo", rnr}} {
		if err := traceTo(io.Discard, bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestTraceLive captures on the loopback interface (AF_PACKET, root)
// while a demo pair WRITEs, keeping only one device's packets, and checks
// the packets were read with their real headers (the ICRC checks) and
// drawn as a ladder.
func TestTraceLive(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("live capture needs root (CAP_NET_RAW)")
	}
	var cands []string
	for range 8 {
		cands = append(cands, testaddr.Loopback().String())
	}
	tour, err := demo.OpenWith(io.Discard, demo.Options{}, cands...)
	if err != nil {
		t.Fatal(err)
	}
	defer tour.Close()
	host := tour.Devices()[0].Addr().Addr().String()
	pcap := filepath.Join(t.TempDir(), "live.pcapng")
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- traceTo(&out, []string{"-i", "lo", "--host", host, "--count", "6", "--duration", "20s", "-w", pcap, "--ladder", "--packets"})
	}()
	var runErr error
	for i := 0; i < 200; i++ { // a WRITE and its ACK each round, until the capture has its six
		if runErr = tour.Run("write"); runErr != nil {
			break
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			checkLive(t, out.String(), host, pcap)
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("capture did not finish (tour: %v)", runErr)
}

// checkLive checks the live capture's output and file.
func checkLive(t *testing.T, s, host, pcap string) {
	t.Helper()
	lines := 0
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "#") {
			lines++
			if !strings.Contains(l, host+":4791") || !strings.HasSuffix(l, "icrc=ok") {
				t.Errorf("packet line %q", l)
			}
		}
	}
	if lines != 6 || !strings.Contains(s, "WRITE_ONLY") || !strings.Contains(s, "ACK psn") {
		t.Errorf("%d packet lines:\n%s", lines, s)
	}
	var again bytes.Buffer
	if err := traceTo(&again, []string{pcap}); err != nil || strings.Count(again.String(), "icrc=ok") != 6 {
		t.Errorf("the -w file: %v\n%s", err, again.String())
	}
}
