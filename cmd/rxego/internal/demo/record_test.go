package demo_test

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rxego/rxego/cmd/rxego/internal/demo"
	"github.com/rxego/rxego/internal/testenv/testaddr"
)

var record = flag.Bool("record", false, "record the ladder's testdata/rxego_*.pcapng again with the demo (then run the ladder's tests with -update)")

// TestRecord re-records rxego's own captures with the demo's scenarios
// (send with RNR, loss, congestion with a short marking phase) when run
// with -record. The demo fixes QPNs (the first QP of a device) and PSNs
// (1000 and 2000); addresses are the test's random loopback ones.
func TestRecord(t *testing.T) {
	if !*record {
		t.Skip("run with -record to record testdata/rxego_*.pcapng again")
	}
	var cands []string
	for range 8 {
		cands = append(cands, testaddr.Loopback().String())
	}
	dir := t.TempDir()
	tour, err := demo.OpenWith(io.Discard, demo.Options{PcapDir: dir, CongestionMark: time.Millisecond,
		CongestionRecoverMax: time.Millisecond}, cands...)
	if err != nil {
		t.Fatal(err)
	}
	defer tour.Close()
	if err := tour.Run("send", "loss", "congestion"); err != nil {
		t.Fatal(err)
	}
	for from, to := range map[string]string{"send": "rxego_rnr", "loss": "rxego_loss", "congestion": "rxego_cnp"} {
		b, err := os.ReadFile(filepath.Join(dir, from+".pcapng"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ladderTestdata, to+".pcapng"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
