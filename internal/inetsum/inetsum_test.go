package inetsum

import (
	"encoding/binary"
	"encoding/hex"
	"testing"
)

// TestIPv4 checks the worked example of an IPv4 header checksum
// (192.168.0.1 -> 192.168.0.199, checksum 0xb861) and that a header with
// its checksum filled in sums to zero.
func TestIPv4(t *testing.T) {
	h, _ := hex.DecodeString("450000730000400040110000c0a80001c0a800c7")
	c := IPv4(h)
	if c != 0xb861 {
		t.Fatalf("checksum %#04x, want 0xb861", c)
	}
	h[10], h[11] = byte(c>>8), byte(c)
	if fold(sum(0, h)) != 0 {
		t.Error("a header with its checksum does not verify")
	}
}

// TestUDP checks a UDP checksum against one computed by hand-free means:
// the datagram with its checksum in place sums, with the pseudo-header,
// to all ones; and an odd length pads with a zero byte.
func TestUDP(t *testing.T) {
	addrs := []byte{127, 0, 0, 1, 127, 0, 0, 2}
	for _, n := range []int{0, 1, 7, 1024} {
		u := make([]byte, 8+n)
		u[0], u[1], u[2], u[3] = 0xc0, 0x01, 0x12, 0xb7 // ports 49153 -> 4791
		u[4], u[5] = byte(len(u)>>8), byte(len(u))
		for i := 8; i < len(u); i++ {
			u[i] = byte(i * 7)
		}
		c := UDP(addrs, u)
		u[6], u[7] = byte(c>>8), byte(c)
		if s := fold(sum(sum(0, addrs)+uint32(len(u))+17, u)); s != 0 && !(c == 0xffff && s == 0xffff) {
			t.Errorf("%d bytes: checksum %#04x does not verify (%#04x)", n, c, s)
		}
	}
}

// TestUDPValidAndPartial: a datagram carrying the checksum UDP computed
// is valid and stops being so when a bit flips; and the partial sum a
// sending kernel leaves for an offload, finished as the offload does (the
// complemented sum over the datagram with the partial sum in place), is
// the checksum UDP computes.
func TestUDPValidAndPartial(t *testing.T) {
	addrs := []byte{198, 18, 0, 1, 198, 18, 0, 2}
	for _, n := range []int{8, 9, 73, 1084} {
		u := make([]byte, n)
		for i := range u {
			u[i] = byte(i*31 + n)
		}
		u[6], u[7] = 0, 0
		c := UDP(addrs, u)
		binary.BigEndian.PutUint16(u[6:], UDPPartial(addrs, n))
		if got := IPv4(u); got != c && !(got == 0 && c == 0xffff) {
			t.Errorf("%d bytes: partial sum finished gives %#04x, UDP %#04x", n, got, c)
		}
		binary.BigEndian.PutUint16(u[6:], c)
		if !UDPValid(addrs, u) {
			t.Errorf("%d bytes: checksum %#04x not valid", n, c)
		}
		u[n-1] ^= 0x10
		if UDPValid(addrs, u) {
			t.Errorf("%d bytes: valid after a bit flip", n)
		}
	}
}
