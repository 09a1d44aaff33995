package demo

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/testaddr"
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
