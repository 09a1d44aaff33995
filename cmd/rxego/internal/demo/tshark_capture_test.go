package demo_test

import (
	"io"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/rxego/rxego/cmd/rxego/internal/demo"
	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/internal/app/trace/tsharktest"
	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// ladderTestdata holds rxego's own recordings that the ladder's golden
// tests read.
const ladderTestdata = "../../../../internal/app/ladder/testdata"

// TestRxegoCapturesAgainstTshark runs every scenario of the demo with
// Alice's device recording (transport/pcaptap) and checks each capture,
// and rxego's recordings in internal/app/ladder/testdata, with tshark: no
// malformed frame and no expert warning or error with IP and UDP checksum
// validation on, every frame decoded as InfiniBand, and every field as
// `rxego trace --json` decodes it. The probe stop is left out: it sends
// a reserved opcode on purpose, which neither decoder may accept.
func TestRxegoCapturesAgainstTshark(t *testing.T) {
	tsharktest.Need(t)
	var cands []string
	for range 8 {
		cands = append(cands, testaddr.Loopback().String())
	}
	dir := t.TempDir()
	tour, err := demo.OpenWith(io.Discard, demo.Options{PcapDir: dir, CongestionMark: 2 * time.Millisecond,
		CongestionRecoverMax: 5 * time.Millisecond}, cands...)
	if err != nil {
		t.Fatal(err)
	}
	err = tour.Run()
	tour.Close()
	if err != nil {
		t.Fatal(err)
	}
	all, _ := filepath.Glob(filepath.Join(dir, "*.pcapng"))
	if len(all) != len(demo.Scenarios) {
		t.Fatalf("%d captures for %d scenarios", len(all), len(demo.Scenarios))
	}
	var files []string
	for _, f := range all {
		if filepath.Base(f) != "probe.pcapng" {
			files = append(files, f)
		}
	}
	if len(files) != len(all)-1 {
		t.Fatalf("no probe.pcapng among the captures %v", all)
	}
	own, _ := filepath.Glob(filepath.Join(ladderTestdata, "rxego_*.pcapng"))
	files = append(files, own...)
	// tshark takes seconds to start: check one file made of them all, and
	// that the reader reads the merged file like the parts.
	merged := filepath.Join(dir, "merged.pcapng")
	if out, err := exec.Command("mergecap", append([]string{"-a", "-w", merged}, files...)...).CombinedOutput(); err != nil {
		t.Fatalf("mergecap: %v\n%s", err, out)
	}
	total := 0
	for _, path := range files {
		if err := trace.ReadFile(path, func(trace.Record) error { total++; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	n := tsharktest.ExpertCheck(t, merged)
	want := tsharktest.Frames(t, merged)
	got := map[int]trace.Record{}
	if err := trace.ReadFile(merged, func(r trace.Record) error { got[r.Frame] = r; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(want) != n || len(got) != n || n != total {
		t.Fatalf("%d frames in the parts, %d merged, tshark decoded %d as InfiniBand, trace %d", total, n, len(want), len(got))
	}
	tsharktest.Compare(t, want, got, tsharktest.BTHOnly)
	t.Logf("%d frames of %d captures compared", n, len(files))
}
