package icrc_test

import (
	"math/rand/v2"
	"testing"
)

// TestSumScattered checks that the ICRC of a packet in three pieces is the
// ICRC of the pieces gathered, for every place the payload can start and
// end, with BTH byte 4 clear (the fast path of Sum) and set.
func TestSumScattered(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	v4, v6 := randomV4(rng), randomV6(rng)
	for _, n := range []int{16, 17, 40, 1024 + 32, 4096 + 32, 9000} {
		pkt := make([]byte, n)
		for i := range pkt {
			pkt[i] = byte(rng.Uint32())
		}
		for _, b4 := range []byte{0, 0x40} {
			pkt[4] = b4
			for _, hdr := range []int{12, 28, 40} {
				for _, tail := range []int{4, 5, 7} {
					if hdr+tail > n {
						continue
					}
					h, p, tr := pkt[:hdr], pkt[hdr:n-tail], pkt[n-tail:]
					if got, want := v4.SumScattered(77, h, p, tr), v4.Sum(77, pkt); got != want {
						t.Fatalf("V4 n=%d hdr=%d tail=%d byte4=%#x: scattered %08x, whole %08x", n, hdr, tail, b4, got, want)
					}
					if got, want := v6.SumScattered(h, p, tr), v6.Sum(pkt); got != want {
						t.Fatalf("V6 n=%d hdr=%d tail=%d byte4=%#x: scattered %08x, whole %08x", n, hdr, tail, b4, got, want)
					}
				}
			}
		}
	}
	short := make([]byte, 11)
	if v4.SumScattered(0, short, nil, make([]byte, 4)) != 0 || v6.SumScattered(make([]byte, 12), nil, short[:3]) != 0 {
		t.Error("pieces too short for a BTH or an ICRC gave a sum")
	}
}

// TestSumScatteredAllocs checks that the scattered sums allocate nothing.
func TestSumScatteredAllocs(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	v4, v6 := randomV4(rng), randomV6(rng)
	pkt := benchPacket(4096)
	h, p, tr := pkt[:28], pkt[28:len(pkt)-4], pkt[len(pkt)-4:]
	for name, fn := range map[string]func(){
		"V4.SumScattered": func() { sink = v4.SumScattered(3, h, p, tr) },
		"V6.SumScattered": func() { sink = v6.SumScattered(h, p, tr) },
	} {
		if a := testing.AllocsPerRun(100, fn); a != 0 {
			t.Errorf("%s: %v allocs", name, a)
		}
	}
}
