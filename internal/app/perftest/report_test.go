package perftest

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestLayout checks the buffer arithmetic against values worked out from
// perftest's macros for a 4096-byte page and 64-byte cache lines.
func TestLayout(t *testing.T) {
	l := layout{ctxSize: 1025, cycle: 4096, cacheLine: 64, numQPs: 2}
	for _, c := range []struct{ size, inc, slots int }{
		{1, 64, 64}, {64, 64, 64}, {65, 128, 32}, {1025, 1088, 3}, {2048, 2048, 2}, {2049, 2112, 1}, {65536, 65536, 1},
	} {
		if got := l.inc(c.size); got != c.inc {
			t.Errorf("inc(%d) = %d, want %d", c.size, got, c.inc)
		}
		if got := l.slots(c.size); got != c.slots {
			t.Errorf("slots(%d) = %d, want %d", c.size, got, c.slots)
		}
	}
	if l.buffSize() != 4096 || l.total() != 4096*2*2 || l.buf(1) != 4096 || l.vaddr(0) != 8192 || l.vaddr(1) != 12288 {
		t.Errorf("layout %+v: buffSize %d total %d buf(1) %d vaddr %d %d", l, l.buffSize(), l.total(), l.buf(1), l.vaddr(0), l.vaddr(1))
	}
	// Work requests 0..5 of 1025 bytes walk three slots and wrap.
	var got []int
	for k := range 6 {
		got = append(got, l.slot(k, 1025))
	}
	if want := []int{0, 1088, 2176, 0, 1088, 2176}; !slices.Equal(got, want) {
		t.Errorf("slots %v, want %v", got, want)
	}
	// SEND receives: 4 posted up front walking the slots, then reposts
	// from the base again (ctx_set_recv_wqes resets the address), whose
	// walk wraps when (posted+1) is a multiple of the slot count: the 5th
	// receive (posted becomes 5) wraps at once, so the 6th is at the base
	// too (run_iter_bw_server's increase_loc_addr).
	base := l.recvBase(0)
	offs := l.recvOffsets(0, 1025, 4, 8, false)
	if want := []int{base, base + 1088, base + 2176, base, base, base, base + 1088, base + 2176}; !slices.Equal(offs, want) {
		t.Errorf("recvOffsets %v, want %v", offs, want)
	}
	if offs := l.recvOffsets(0, 1025, 4, 8, true); slices.ContainsFunc(offs, func(o int) bool { return o != base }) {
		t.Errorf("latency receives %v, want all at %d", offs, base)
	}
	if offs := l.recvOffsets(1, 100, 6, 5, false); len(offs) != 5 {
		t.Errorf("recvOffsets with rx depth above iters: %v", offs)
	}
}

// TestBWReport checks the average, message rate and peak arithmetic.
func TestBWReport(t *testing.T) {
	// Ten 1 MiB messages posted at 0..9 ms, completed 1 ms later each:
	// 10 MiB in 10 ms on average; the best window is any single message,
	// 1 MiB per ms... except windows of several that overlap: (j-i+1)
	// messages in (j-i+1) ms: 1 MiB/ms either way.
	var posted, completed []time.Duration
	for i := range 10 {
		posted = append(posted, time.Duration(i)*time.Millisecond)
		completed = append(completed, time.Duration(i+1)*time.Millisecond)
	}
	r := bwReport(1<<20, posted, completed, 1)
	if r.Size != 1<<20 || r.Iters != 10 || math.Abs(r.BWAvg-1000) > 1e-6 || math.Abs(r.BWPeak-1000) > 1e-6 ||
		math.Abs(r.MsgRate-0.001) > 1e-9 {
		t.Fatalf("report %+v", r)
	}
	// Without the times, no peak: the average over the span.
	if r := avgReport(1<<20, 10, 10*time.Millisecond); r.BWPeak != 0 || math.Abs(r.BWAvg-1000) > 1e-6 || r.Iters != 10 {
		t.Fatalf("no-peak report %+v", r)
	}
	var b bytes.Buffer
	(&printer{w: &b}).printBW(r)
	if want := fmt.Sprintf(" %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n", 1<<20, 10, 1000.0, 1000.0, 0.001); b.String() != want {
		t.Fatalf("line %q, want %q", b.String(), want)
	}
	// --report_gbits: 1000 MiB/s is 8.388608 Gb/s, and the titles say so.
	b.Reset()
	p := &printer{w: &b, gbits: true}
	p.bwHeader()
	p.printBW(r)
	if want := fmt.Sprintf(" %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n", 1<<20, 10, 8.39, 8.39, 0.001); !strings.HasSuffix(b.String(), want) ||
		!strings.Contains(b.String(), "BW peak[Gb/sec]    BW average[Gb/sec]") {
		t.Fatalf("--report_gbits:\n%q\nwant a line %q", b.String(), want)
	}
}

// TestLatStats checks perftest's latency statistics: deltas between
// posts, halved for round trips, sorted, the largest two dropped.
func TestLatStats(t *testing.T) {
	// Posts at 0, 10, 30, 60, 100, 200 us: deltas 10, 20, 30, 40, 100.
	var posted []time.Duration
	for _, us := range []int{0, 10, 30, 60, 100, 200} {
		posted = append(posted, time.Duration(us)*time.Microsecond)
	}
	st := latStats(8, posted, false)
	// Measured: 10, 20, 30 (40 and 100 are the tail); typical = median of
	// three = 20; average 20; max = the first dropped one (perftest's
	// delta[measure_cnt]) = 40; 99% and 99.9% = index ceil(3*0.99) = 3 = 40.
	want := LatStats{Size: 8, Iters: 6, Min: 10, Max: 40, Typical: 20, Avg: 20, Std: math.Sqrt(200.0 / 3), Pct99: 40, Pct999: 40}
	if st != want {
		t.Fatalf("stats %+v, want %+v", st, want)
	}
	if rt := latStats(8, posted, true); rt.Min != 5 || rt.Typical != 10 {
		t.Fatalf("round-trip stats %+v", rt)
	}
	var b bytes.Buffer
	(&printer{w: &b}).printLat(st)
	if !strings.HasPrefix(b.String(), " 8       6          10.00") {
		t.Fatalf("line %q", b.String())
	}
}

// TestCAltHex checks C's "%#0*x" rendering used in the address lines.
func TestCAltHex(t *testing.T) {
	for _, c := range []struct {
		v     uint64
		width int
		want  string
	}{{0, 4, "0000"}, {0x11, 6, "0x0011"}, {0xcfa8a8, 6, "0xcfa8a8"}, {0x55f53c2c3000, 16, "0x0055f53c2c3000"}} {
		if got := cAltHex(c.v, c.width); got != c.want {
			t.Errorf("cAltHex(%#x, %d) = %q, want %q", c.v, c.width, got, c.want)
		}
	}
}

// TestNormalise checks perftest's defaults and dependency rules.
func TestNormalise(t *testing.T) {
	n, err := normalise(Config{Test: SendBW, Iters: 5})
	if err != nil || n.Size != defSizeBW || n.TxDepth != 5 || n.RxDepth != 6 || n.cqMod != 1 || n.OutReads != 1 {
		t.Fatalf("send_bw -n 5: %+v %v", n, err)
	}
	n, err = normalise(Config{Test: ReadLat})
	if err != nil || n.Size != defSizeLat || n.Iters != defIters || n.TxDepth != 1 || n.OutReads != 128 {
		t.Fatalf("read_lat: %+v %v", n, err)
	}
	n, err = normalise(Config{Test: WriteBW})
	if err != nil || n.Iters != defItersWriteBW || n.TxDepth != defTxBW || n.cqMod != 1 {
		t.Fatalf("write_bw: %+v %v", n, err)
	}
	n, err = normalise(Config{Test: AtomicBW})
	if err != nil || n.Size != 8 || n.Atomic != FetchAndAdd || n.cqMod != defCQMod {
		t.Fatalf("atomic_bw: %+v %v", n, err)
	}
	for _, bad := range []Config{
		{Test: "foo_bw"}, {Test: AtomicBW, Size: 16}, {Test: AtomicBW, All: true}, {Test: AtomicLat, Atomic: "SWAP"},
		{Test: WriteBW, Atomic: FetchAndAdd}, {Test: WriteBW, Iters: 4}, {Test: WriteLat, NumQPs: 2},
		{Test: WriteBW, MTU: 1500}, {Test: WriteBW, Size: maxSize + 1}, {Test: ReadBW, OutReads: 129}, {Test: WriteBW, Port: 70000},
	} {
		if _, err := normalise(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
