package job

import (
	"encoding/binary"
	"fmt"
)

// The examples fill buffers with a pattern that depends on each 8-byte
// word's position, so a receiver can check any range byte for byte
// without a copy of the sender's data.

// mix is splitmix64's output function.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// word is the pattern's word at byte offset off (a multiple of 8).
func word(seed uint64, off int) uint64 { return mix(seed ^ uint64(off/8)) }

// Fill writes the pattern of seed into buf, buf[0] being the byte at
// offset off of the pattern (off a multiple of 8).
func Fill(buf []byte, seed uint64, off int) {
	i := 0
	for ; i+8 <= len(buf); i += 8 {
		binary.LittleEndian.PutUint64(buf[i:], word(seed, off+i))
	}
	if i < len(buf) {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], word(seed, off+i))
		copy(buf[i:], w[:])
	}
}

// Check reports the first byte of buf that differs from the pattern
// Fill(buf, seed, off) writes.
func Check(buf []byte, seed uint64, off int) error {
	i := 0
	for ; i+8 <= len(buf); i += 8 {
		if binary.LittleEndian.Uint64(buf[i:]) != word(seed, off+i) {
			break
		}
	}
	var w [8]byte
	for ; i < len(buf); i += 8 {
		binary.LittleEndian.PutUint64(w[:], word(seed, off+i))
		for j := 0; j < 8 && i+j < len(buf); j++ {
			if buf[i+j] != w[j] {
				return fmt.Errorf("byte %d is %#02x, want %#02x", off+i+j, buf[i+j], w[j])
			}
		}
	}
	return nil
}

// Touch writes a zero into every page of buf, so that a receive buffer's
// pages exist before a measured transfer writes into it (as
// ibv_reg_mr's pinning makes them exist on an RDMA NIC), for RDMA and
// TCP alike: neither run then pays first-touch page faults.
func Touch(buf []byte) {
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 0
	}
}
