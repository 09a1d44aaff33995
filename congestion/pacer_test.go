package congestion

import (
	"math"
	"testing"
	"time"
)

// sendAll plays a backlogged sender on virtual time from start until end:
// it sends size-byte packets as soon as the pacer admits them, never faster
// than lineRate, and returns the bytes sent.
func sendAll(t *testing.T, p *Pacer, lineRate uint64, size int, start, end time.Duration) uint64 {
	t.Helper()
	serial := time.Duration(uint64(size) * 8 * uint64(time.Second) / lineRate)
	var sent uint64
	now := start
	for i := 0; now < end; i++ {
		if i > 10_000_000 {
			t.Fatal("sender loop did not finish")
		}
		ok, wait := p.Admit(now, size)
		if ok {
			sent += uint64(size)
			now += serial
			continue
		}
		if wait <= 0 {
			t.Fatalf("refused with wait %v", wait)
		}
		now += wait
	}
	return sent
}

func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }

func TestPacerBurstThenRate(t *testing.T) {
	p := NewPacer(10*Gbps, 16<<10)
	p.SetRate(0, 1*Gbps)
	// 1024 B at 1 Gb/s = 8192 ns; the burst is 16384 B = 131072 ns. A packet
	// is admitted while the schedule is at most 131072 ns ahead: after k
	// packets it is 8192k ahead, so packets 1..17 pass (8192*16 <= 131072).
	for i := range 17 {
		if ok, _ := p.Admit(0, 1024); !ok {
			t.Fatalf("packet %d of the burst refused", i+1)
		}
	}
	// Packet 18: schedule at 17*8192 = 139264, wait 139264 - 131072 = 8192.
	ok, wait := p.Admit(0, 1024)
	if ok || wait != 8192 {
		t.Fatalf("packet 18: ok=%v wait=%v, want refused with 8192ns", ok, wait)
	}
	if d := p.Delay(0); d != 8192 {
		t.Fatalf("Delay = %v, want 8192ns", d)
	}
	// At 8192 ns it passes, and the next one waits one more packet time.
	if ok, _ := p.Admit(8192, 1024); !ok {
		t.Fatal("refused after waiting")
	}
	if ok, wait := p.Admit(8192, 1024); ok || wait != 8192 {
		t.Fatalf("ok=%v wait=%v, want refused with 8192ns", ok, wait)
	}
	// After a long idle the bucket is full again, but not fuller: 17 packets.
	n := 0
	for ; n < 100; n++ {
		if ok, _ := p.Admit(time.Second, 1024); !ok {
			break
		}
	}
	if n != 17 {
		t.Fatalf("after idle %d packets passed, want 17", n)
	}
}

// The long-run average is the set rate, within 1%, for rates and sizes
// whose per-packet time is not a whole number of nanoseconds.
func TestPacerLongRunRate(t *testing.T) {
	const line = 100 * Gbps
	for _, tc := range []struct {
		rate uint64
		size int
	}{
		{1 * Gbps, 1500},
		{7_770 * Mbps, 64},
		{3_333_333_333, 4096},
		{100 * Mbps, 1500},
		{1 * Mbps, 1024},
	} {
		p := NewPacer(line, DefaultBurst)
		p.SetRate(0, tc.rate)
		// Long enough for 200000 packets, so the 64 KiB burst is < 1%.
		d := time.Duration(200_000 * uint64(tc.size) * 8 * uint64(time.Second) / tc.rate)
		sent := sendAll(t, &p, line, tc.size, 0, d)
		got := float64(sent) * 8 / d.Seconds()
		if !within(got, float64(tc.rate), 0.01) {
			t.Errorf("rate %d size %d: average %.0f b/s, not within 1%%", tc.rate, tc.size, got)
		}
	}
}

func TestPacerRateChangeMidStream(t *testing.T) {
	const line = 10 * Gbps
	p := NewPacer(line, 6000)
	p.SetRate(0, 1*Gbps)
	const half = 50 * time.Millisecond
	first := sendAll(t, &p, line, 1500, 0, half)
	p.SetRate(half, 4*Gbps)
	second := sendAll(t, &p, line, 1500, half, 2*half)
	// 1 Gb/s for 50 ms = 6.25 MB; 4 Gb/s for 50 ms = 25 MB.
	if !within(float64(first), 6.25e6, 0.01) || !within(float64(second), 25e6, 0.01) {
		t.Fatalf("sent %d then %d bytes, want 6.25e6 then 25e6 within 1%%", first, second)
	}
}

// Bytes admitted but not drained are re-timed at the new rate.
func TestPacerRescalesBacklog(t *testing.T) {
	p := NewPacer(10*Gbps, 0)
	p.SetRate(0, 1*Gbps)
	p.Admit(0, 1000) // drains at 8000 ns
	// At 2000 ns, 6000 ns of backlog at 1 Gb/s = 750 B = 3000 ns at 2 Gb/s.
	p.SetRate(2000, 2*Gbps)
	if d := p.Delay(2000); d != 3000 {
		t.Fatalf("after speed-up Delay = %v, want 3000ns", d)
	}
	// 3000 ns at 2 Gb/s = 750 B = 12000 ns at 500 Mb/s.
	p.SetRate(2000, 500*Mbps)
	if d := p.Delay(2000); d != 12000 {
		t.Fatalf("after slow-down Delay = %v, want 12000ns", d)
	}
}

func TestPacerUnlimited(t *testing.T) {
	p := NewPacer(10*Gbps, DefaultBurst)
	for i := range 1000 {
		if ok, wait := p.Admit(0, 9000); !ok || wait != 0 {
			t.Fatalf("new pacer refused packet %d", i)
		}
	}
	for _, r := range []uint64{0, 10 * Gbps, 40 * Gbps} {
		p.SetRate(0, 1*Gbps)
		p.SetRate(0, r)
		if p.Rate() != 0 || p.Delay(0) != 0 {
			t.Fatalf("SetRate(%d) did not turn pacing off", r)
		}
		if ok, _ := p.Admit(0, 1<<20); !ok {
			t.Fatalf("SetRate(%d): refused", r)
		}
	}
	// Limited again: the old backlog is gone, a full burst is available.
	// After it the schedule is exactly one burst ahead, which still admits
	// one packet; the one after that waits its own time, 8 ns for 1 B.
	p.SetRate(5, 1*Gbps)
	if ok, _ := p.Admit(5, DefaultBurst); !ok {
		t.Fatal("burst refused after re-enabling pacing")
	}
	if ok, _ := p.Admit(5, 1); !ok {
		t.Fatal("packet at exactly the burst refused")
	}
	if ok, wait := p.Admit(5, 1); ok || wait != 8 {
		t.Fatalf("packet beyond the burst: ok=%v wait=%v, want refused for 8ns", ok, wait)
	}
}

func TestPacerEdgeInputs(t *testing.T) {
	p := NewPacer(10*Gbps, -5) // burst treated as 0
	p.SetRate(0, 1)
	if p.Rate() != minPacerRate {
		t.Fatalf("rate %d, want raised to %d", p.Rate(), minPacerRate)
	}
	p.SetRate(0, 1*Gbps)
	for _, n := range []int{0, -1500} {
		if ok, _ := p.Admit(0, n); !ok {
			t.Fatalf("Admit(%d) refused", n)
		}
	}
	if d := p.Delay(0); d != 0 {
		t.Fatalf("non-positive sizes were charged: Delay %v", d)
	}
	// A huge packet at the minimum rate saturates instead of wrapping.
	p.SetRate(0, minPacerRate)
	p.Admit(0, math.MaxInt32)
	p.Admit(0, 1)
	if ok, wait := p.Admit(time.Hour, 1); ok || wait <= 0 {
		t.Fatalf("after a huge packet: ok=%v wait=%v", ok, wait)
	}
}

// The hot paths do not allocate.
func TestZeroAllocs(t *testing.T) {
	free := NewPacer(10*Gbps, DefaultBurst)
	paced := NewPacer(10*Gbps, DefaultBurst)
	paced.SetRate(0, 1*Gbps)
	c, _ := NewDCQCN(NVIDIAParams(10 * Gbps))
	np := NewNP(4 * us)
	var now time.Duration
	for name, f := range map[string]func(){
		"unlimited Admit": func() { free.Admit(now, 1500) },
		"paced Admit":     func() { now += 100; paced.Admit(now, 1500) },
		"DCQCN": func() {
			now += 1000
			c.OnCNP(now)
			c.OnSent(now, 4096)
			c.Advance(now)
			_ = c.Stats()
		},
		"NP": func() { now += 1000; np.OnCE(now) },
	} {
		if a := testing.AllocsPerRun(1000, f); a != 0 {
			t.Errorf("%s allocates %v times", name, a)
		}
	}
}
