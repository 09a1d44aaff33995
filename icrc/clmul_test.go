package icrc

import (
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// TestRunMatchesCRC32 checks run and ChecksumIEEE against hash/crc32 for every length
// up to a jumbo frame's and beyond, at aligned and unaligned starts, from
// several registers: with the wide fold where this CPU has it, and with it
// switched off.
func TestRunMatchesCRC32(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 9300)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	lengths := make([]int, 0, 1200)
	for n := 0; n <= 1100; n++ {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 4095, 4096, 4108, 4112, 4128, 8191, 9000, 9216)
	paths := []bool{false}
	if hasWide {
		paths = append(paths, true)
	} else {
		t.Log("this CPU has no 256-bit VPCLMULQDQ: only hash/crc32's path is checked")
	}
	defer func(w bool) { hasWide = w }(hasWide)
	for _, wide := range paths {
		hasWide = wide
		for _, n := range lengths {
			for _, off := range []int{0, 1, 3, 8, 13} {
				for _, c := range []uint32{0, ^uint32(0), 0x9ad1e7c3} {
					p := buf[off : off+n]
					if c == 0 && ChecksumIEEE(p) != crc32.ChecksumIEEE(p) {
						t.Fatalf("wide=%v n=%d off=%d: ChecksumIEEE %08x, hash/crc32 %08x", wide, n, off, ChecksumIEEE(p), crc32.ChecksumIEEE(p))
					}
					if got, want := ^run(^c, p), crc32.Update(c, table, p); got != want {
						t.Fatalf("wide=%v n=%d off=%d crc=%#x: run %08x, hash/crc32 %08x", wide, n, off, c, got, want)
					}
				}
			}
		}
	}
}

// TestRunChains checks that run over pieces equals run over the
// whole, for cuts on and off the 16-byte grid the wide fold works in.
func TestRunChains(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	buf := make([]byte, 4128)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	whole := run(^uint32(0), buf)
	for cut := 0; cut <= len(buf); cut += 37 {
		if got := run(run(^uint32(0), buf[:cut]), buf[cut:]); got != whole {
			t.Fatalf("cut at %d: %08x, whole %08x", cut, got, whole)
		}
	}
}

// foldConstant returns the constant clmul_amd64.s multiplies by to move
// 64 bits of a reflected CRC-32 (IEEE) remainder n bits forward:
// x^n mod P, bit-reflected and shifted left once.
func foldConstant(n int) uint64 {
	r := uint32(1) // x^0
	for range n {
		carry := r&0x80000000 != 0
		r <<= 1
		if carry {
			r ^= 0x04c11db7 // P without its x^32 term
		}
	}
	return uint64(bits.Reverse32(r)) << 1
}

// TestFoldConstants derives clmul_amd64.s's fold constants: for a fold by
// D bits, x^(D+32) for the low and x^(D-32) for the high 64-bit half.
func TestFoldConstants(t *testing.T) {
	for _, c := range []struct {
		name string
		n    int
		want uint64
	}{
		{"fold512 low", 512 + 32, 0x154442bd4},
		{"fold512 high", 512 - 32, 0x1c6e41596},
		{"fold128 low", 128 + 32, 0x1751997d0},
		{"fold128 high", 128 - 32, 0x0ccaa009e},
		{"fold64", 64, 0x163cd6124},
	} {
		if got := foldConstant(c.n); got != c.want {
			t.Errorf("%s: x^%d gives %#x, the assembly has %#x", c.name, c.n, got, c.want)
		}
	}
}
