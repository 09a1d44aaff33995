// Package inetsum computes the Internet checksum (RFC 1071) of IPv4
// headers and UDP datagrams, for the code that rebuilds frames: pcaptap's
// recordings and trace's GSO segments; and checks a received datagram's,
// for the transport's raw receive mode.
package inetsum

import "encoding/binary"

// IPv4 is the header checksum of the IPv4 header h (its checksum field
// zero).
func IPv4(h []byte) uint16 { return fold(sum(0, h)) }

// UDP is the checksum of the UDP datagram u (header and payload, its
// checksum field zero) under the pseudo-header of addrs, the source and
// destination addresses as they stand in the IP header (8 bytes for IPv4,
// 32 for IPv6). A result of zero is given as 0xffff: zero means "no
// checksum" (RFC 768, RFC 8200).
func UDP(addrs, u []byte) uint16 {
	s := sum(0, addrs) + uint32(len(u)) + 17
	c := fold(sum(s, u))
	if c == 0 {
		c = 0xffff
	}
	return c
}

// UDPValid reports whether the UDP datagram u (header and payload, with
// the checksum it arrived with) checks under the pseudo-header of addrs:
// its sum with the pseudo-header is all ones. A zero checksum (none) is
// for the caller to accept before asking.
func UDPValid(addrs, u []byte) bool { return fold(sum(0, addrs)+uint32(len(u))+17+sum(0, u)) == 0 }

// UDPPartial is what a sender's kernel leaves in the checksum field of an
// n-byte UDP datagram for an offload to finish (CHECKSUM_PARTIAL): the
// pseudo-header's sum, not complemented. A datagram from this host seen
// before any device computed its checksum (on lo or a veth) carries it.
func UDPPartial(addrs []byte, n int) uint16 { return ^fold(sum(0, addrs) + uint32(n) + 17) }

// sum adds b as big-endian 16-bit words to s (a one's complement partial
// sum, carries kept in the high bits).
func sum(s uint32, b []byte) uint32 {
	for len(b) >= 2 {
		s += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	return s
}

// fold finishes a one's complement sum.
func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
