package trace_test

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/demo"
	"github.com/rxego/rxego/internal/testenv/testaddr"
	"github.com/rxego/rxego/internal/trace"
)

// TestRxegoCapturesAgainstTshark runs every scenario of the demo with
// Alice's device recording (transport/pcaptap) and checks each capture,
// and rxego's recordings in internal/ladder/testdata, with tshark: no
// malformed frame and no expert warning or error with IP and UDP checksum
// validation on, every frame decoded as InfiniBand, and every field as
// `rxego trace --json` decodes it. The probe stop is left out: it sends
// a reserved opcode on purpose, which neither decoder may accept.
func TestRxegoCapturesAgainstTshark(t *testing.T) {
	needTshark(t)
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
	own, _ := filepath.Glob("../ladder/testdata/rxego_*.pcapng")
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
	n := expertCheck(t, merged)
	want := tsharkFrames(t, merged)
	got := map[int]trace.Record{}
	if err := trace.ReadFile(merged, func(r trace.Record) error { got[r.Frame] = r; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(want) != n || len(got) != n || n != total {
		t.Fatalf("%d frames in the parts, %d merged, tshark decoded %d as InfiniBand, trace %d", total, n, len(want), len(got))
	}
	compare(t, want, got, tsharkBTHOnly)
	t.Logf("%d frames of %d captures compared", n, len(files))
}

// Wireshark's expert severities (epan/proto.h).
const (
	severityWarn  = 0x00600000
	severityError = 0x00800000
)

// expertCheck runs tshark over a capture with IP and UDP checksum
// validation and fails on malformed frames and expert warnings or
// errors. It returns the number of frames.
func expertCheck(t *testing.T, path string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "tshark", "-n", "-r", path, "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
		"-d", "udp.port==4791,infiniband", "--disable-protocol", "rpcordma",
		"-T", "fields", "-E", "separator=|", "-e", "frame.number", "-e", "_ws.malformed", "-e", "_ws.expert.severity", "-e", "_ws.expert.message")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr.String())
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 4 {
			t.Fatalf("tshark line %q", line)
		}
		n++
		if f[1] != "" {
			t.Errorf("frame %s malformed: %s", f[0], f[3])
		}
		for _, sv := range strings.Split(f[2], ",") {
			if sv == "" {
				continue
			}
			v, err := strconv.ParseUint(strings.TrimPrefix(sv, "0x"), 16, 32)
			if err != nil {
				v, err = strconv.ParseUint(sv, 10, 32)
			}
			if err != nil || v >= severityWarn {
				t.Errorf("frame %s: expert severity %s: %s", f[0], sv, f[3])
			}
		}
	}
	return n
}
