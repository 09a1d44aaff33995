package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cmd/rxego/internal/demo"
	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// TestTraceLadder draws the ladder and the summary of rxego's RNR
// recording and writes its page.
func TestTraceLadder(t *testing.T) {
	const rnr = "../../internal/app/ladder/testdata/rxego_rnr.pcapng"
	var out bytes.Buffer
	if err := traceTo(&out, []string{"--ladder", rnr}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"QP pair 1 (RC)", "RNR NAK psn 1000", "RETX: retry after an RNR wait", "completes #1", "requests by  msgs"} {
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

// TestTraceLiveGSO captures on lo (root) while one rxego device sends
// another 4 KiB SENDs at a 1024-byte path MTU, which rxego hands to the
// kernel as UDP GSO datagrams that the packet socket sees whole. The
// trace must cut them into the packets the peer receives: every packet a
// BTH-sized RoCE packet with a good ICRC (each segment's ICRC covers the
// IP ID the kernel gave it), marked gso(...), none lost (PSNs in a
// row), and --summary must count every message and byte.
func TestTraceLiveGSO(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("live capture needs root (CAP_NET_RAW)")
	}
	const msgs, size = 5, 4096
	a, b := testaddr.Open(t, nil), testaddr.Open(t, nil)
	devs := [2]*rxego.Device{a, b}
	var qps [2]*rxego.QP
	var mrs [2]*rxego.MR
	var cqs [2]*rxego.CQ
	for i, d := range devs {
		pd, _ := d.AllocPD()
		cqs[i], _ = d.CreateCQ(2 * msgs)
		var err error
		if qps[i], err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cqs[i], RecvCQ: cqs[i], Caps: rxego.Caps{MaxSendWR: msgs, MaxRecvWR: msgs}}); err != nil {
			t.Fatal(err)
		}
		mrs[i], _ = pd.RegMR(make([]byte, msgs*size), rxego.AccessLocalWrite)
	}
	for i := range 2 {
		o := 1 - i
		if err := qps[i].Connect(rxego.RemoteQP{Addr: devs[o].Addr(), QPN: qps[o].Num()}, &rxego.ConnectOptions{MTU: rxego.MTU1024}); err != nil {
			t.Fatal(err)
		}
	}
	// The capture stops at the 25th packet: five 4-packet SENDs and their
	// ACKs, whichever packet it opens before. Messages go one at a time
	// until then, however long the capture takes to open on a loaded
	// machine.
	host := a.Addr().Addr().String()
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- traceTo(&out, []string{"-i", "lo", "--host", host, "--count", strconv.Itoa(msgs * 5), "--duration", "20s", "--summary", "--packets"})
	}()
	wc := make([]rxego.WC, msgs)
	captured := false
	for k := 0; k < 400 && !captured; k++ {
		off := uint64(k % msgs * size)
		if err := qps[1].PostRecv(rxego.RecvWR{ID: uint64(k), SGL: []rxego.SGE{{Addr: mrs[1].IOVA() + off, Length: size, LKey: mrs[1].LKey()}}}); err != nil {
			t.Fatal(err)
		}
		err := qps[0].PostSend(rxego.SendWR{ID: uint64(k), Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
			SGL: []rxego.SGE{{Addr: mrs[0].IOVA() + off, Length: size, LKey: mrs[0].LKey()}}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = cqs[0].PollWait(ctx, wc[:1])
		cancel()
		if err != nil || wc[0].Status != 0 {
			t.Fatalf("send %d: %v %+v", k, err, wc[0])
		}
		for n, _ := cqs[1].Poll(wc); n > 0; n, _ = cqs[1].Poll(wc) { // the receives' completions, so the CQ never fills
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			captured = true
		case <-time.After(10 * time.Millisecond):
		}
	}
	if !captured {
		t.Fatal("capture did not finish")
	}
	// Each message has at most one ACK (the responder may coalesce two),
	// so 25 packets hold at least 20 SEND packets, the last message maybe
	// cut by --count. Their PSNs follow one another: a gap would be
	// packets the capture lost.
	s := out.String()
	var sends, firsts, gso int
	lastPSN, retried := -1, false
	psnRE := regexp.MustCompile(` psn=(\d+) `)
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		if !strings.Contains(l, " icrc=ok") {
			t.Errorf("bad ICRC: %s", l)
		}
		if strings.Contains(l, " gso(seg=") {
			gso++
		}
		if !strings.Contains(l, "RC_SEND_") {
			continue
		}
		sends++
		if strings.Contains(l, "RC_SEND_FIRST") {
			firsts++
		}
		if !strings.Contains(l, " len=1024 ") {
			t.Errorf("a SEND packet of a 4 KiB message at MTU 1024 not of 1024 bytes: %s", l)
		}
		m := psnRE.FindStringSubmatch(l)
		psn, _ := strconv.Atoi(append(m, "", "-2")[1])
		if lastPSN >= 0 && psn > lastPSN+1 {
			t.Errorf("PSN %d after %d: the capture lost packets: %s", psn, lastPSN, l)
		}
		retried = retried || lastPSN >= 0 && psn <= lastPSN
		lastPSN = psn
	}
	if sends < msgs*size/1024 || gso < sends {
		t.Errorf("%d SEND packets (want %d or more), %d marked gso:\n%s", sends, msgs*size/1024, gso, s)
	}
	// The sender's row: A or B, as the capture opened on one of its SENDs
	// or on an ACK of the message before. It counts every message begun,
	// and every SEND packet's bytes.
	if retried {
		t.Skip("a SEND was retried (a loaded machine), which the message count below does not allow for")
	}
	rows := regexp.MustCompile(`(?m)^  [AB] +(\d+) +(\d+) `).FindAllStringSubmatch(s, -1)
	counted := false
	for _, m := range rows {
		counted = counted || m[1] == strconv.Itoa(firsts) && m[2] == strconv.Itoa(sends*1024)
	}
	if !counted {
		t.Errorf("summary does not count %d messages of %d bytes in all (%q):\n%s", firsts, sends*1024, rows, s)
	}
}
