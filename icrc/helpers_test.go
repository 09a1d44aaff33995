package icrc_test

import (
	"encoding/binary"

	"github.com/rxego/rxego/icrc"
)

// ipv4Header builds the 20-byte IPv4 header v describes for a packet of
// pktLen bytes sent with ID id, with TOS, TTL and checksum set to values
// the ICRC must ignore.
func ipv4Header(v icrc.V4, id uint16, pktLen int) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	h[1] = 0x62 // TOS: DSCP 24, ECN CE
	binary.BigEndian.PutUint16(h[2:], uint16(20+8+pktLen))
	binary.BigEndian.PutUint16(h[4:], id)
	if v.DF {
		h[6] = 0x40
	}
	h[8] = 61 // TTL after three hops
	h[9] = 17
	h[10], h[11] = 0x12, 0x34 // a checksum
	copy(h[12:16], v.Src[:])
	copy(h[16:20], v.Dst[:])
	return h
}

// udpHeader builds a UDP header with a non-zero checksum the ICRC ignores.
func udpHeader(sport, dport uint16, pktLen int) []byte {
	h := make([]byte, 8)
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint16(h[4:], uint16(8+pktLen))
	h[6], h[7] = 0xab, 0xcd
	return h
}

// ipv6Header builds the IPv6 header v describes, with traffic class, flow
// label and hop limit set to values the ICRC must ignore.
func ipv6Header(v icrc.V6, pktLen int) []byte {
	h := make([]byte, 40)
	h[0], h[1], h[2], h[3] = 0x61, 0x2a, 0xbc, 0xde // TC 0x12, flow label 0xabcde
	binary.BigEndian.PutUint16(h[4:], uint16(8+pktLen))
	h[6] = 17
	h[7] = 63
	copy(h[8:24], v.Src[:])
	copy(h[24:40], v.Dst[:])
	return h
}
