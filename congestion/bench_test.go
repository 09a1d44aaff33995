package congestion

import (
	"testing"
	"time"
)

func BenchmarkPacerAdmitUnlimited(b *testing.B) {
	p := NewPacer(100*Gbps, DefaultBurst)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		p.Admit(time.Duration(i), 4096)
	}
}

func BenchmarkPacerAdmitPaced(b *testing.B) {
	p := NewPacer(100*Gbps, DefaultBurst)
	p.SetRate(0, 10*Gbps)
	var now time.Duration
	b.ReportAllocs()
	for b.Loop() {
		if ok, wait := p.Admit(now, 4096); !ok {
			now += wait
		}
	}
}

func BenchmarkPacerSetRate(b *testing.B) {
	p := NewPacer(100*Gbps, DefaultBurst)
	var now time.Duration
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now += 1000
		p.SetRate(now, uint64(1+i%50)*Gbps)
	}
}

// A QP under steady congestion: a CNP every 50 us, 4 KiB sends in between.
func BenchmarkDCQCNOnSent(b *testing.B) {
	c, _ := NewDCQCN(NVIDIAParams(100 * Gbps))
	var now time.Duration
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now += 330 // 4 KiB at ~100 Gb/s
		if i%150 == 0 {
			c.OnCNP(now)
		}
		c.OnSent(now, 4096)
	}
}

func BenchmarkNPOnCE(b *testing.B) {
	np := NewNP(4 * time.Microsecond)
	var now time.Duration
	b.ReportAllocs()
	for b.Loop() {
		now += 330
		np.OnCE(now)
	}
}
