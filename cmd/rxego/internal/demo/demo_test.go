package demo

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// TestTour runs every scenario over real loopback sockets, recording each
// into its own capture; each scenario checks its own outcome (bytes
// landed, completions, RNR seen, the loss recovered, the rate cut) and
// fails otherwise, and each draws its ladder.
func TestTour(t *testing.T) {
	var out bytes.Buffer
	var cands []string
	for i := 0; i < 8; i++ {
		cands = append(cands, testaddr.Loopback().String())
	}
	dir := t.TempDir()
	tour, err := OpenWith(&out, Options{PcapDir: dir, CongestionMark: 2 * time.Millisecond, CongestionRecoverMax: 20 * time.Millisecond}, cands...)
	if err != nil {
		t.Fatal(err)
	}
	defer tour.Close()
	if err := tour.Run(); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"Receiver-Not-Ready", "consumes exactly one", "counter now holds 7", "CPU saw nothing",
		"RNR NAK psn", "LOST: never arrived", "NAK seq-err", "go-back-N", "CNP: congestion notification", "the switch starts marking CE",
		"alice's rate cut", "DCQCN rate over time",
		"checked every layer byte for byte", "imm 0x3", "each copy checked byte for byte (true)", "READ_RESP_ONLY",
		"0 + 7 + 14 + 21 = 42", "imm 0x10002"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("tour output lacks %q:\n%s", want, out.String())
		}
	}
	checkTourText(t, out.String())
	for _, s := range Scenarios {
		path := filepath.Join(dir, s.Name+".pcapng")
		if st, err := os.Stat(path); err != nil || st.Size() == 0 || !strings.Contains(out.String(), "Capture: "+path) {
			t.Errorf("scenario %s: capture %v", s.Name, err)
		}
	}
}

// TestTourWithoutCapture runs a scenario with nothing recorded: no
// ladder is drawn.
func TestTourWithoutCapture(t *testing.T) {
	var out bytes.Buffer
	var cands []string
	for i := 0; i < 8; i++ {
		cands = append(cands, testaddr.Loopback().String())
	}
	tour, err := OpenOn(&out, cands...)
	if err != nil {
		t.Fatal(err)
	}
	defer tour.Close()
	if err := tour.Run("read"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "What went over the wire") || !strings.Contains(out.String(), "== read:") {
		t.Errorf("output:\n%s", out.String())
	}
}

// checkTourText holds the tour's text to what a learner can trust: a
// send completion shows no byte count (byte_len means nothing there),
// every message in a ladder is narrated (the 4-byte SEND after write-imm),
// a wr_id is introduced before it is named, QP numbers read as in the
// ladders, a capture taken at the responder calls its RTT a turnaround,
// the congestion ladder's batch times are explained, and counts of one
// are singular.
func checkTourText(t *testing.T, out string) {
	t.Helper()
	for _, want := range []string{
		"alice's completion: RDMA_WRITE success (", "alice's completion: SEND success.",
		"bob posts two receives, wr_id 30 and then 31", "wr_id 30: it consumed the first receive only",
		`alice SENDs 4 bytes ("tidy"), which take it: message #2 below`,
		"(QP 0x000011) and bob at", "its turnaround, not a round trip", "measured at the responder: its turnaround",
		"can share one time there", "requests by  msgs",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("tour output lacks %q", want)
		}
	}
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`(RDMA_WRITE|SEND) success, \d+ bytes`),
		regexp.MustCompile(`\b1 (RNR NAKs|QPs|connections|packets|messages)\b`),
		regexp.MustCompile(`consuming receive`),
		regexp.MustCompile(`\(QP \d+\)`),
	} {
		if m := bad.FindString(out); m != "" {
			t.Errorf("tour output holds %q", m)
		}
	}
}
