// Package icrc computes and checks the RoCEv2 invariant CRC.
//
// The ICRC is CRC-32 (IEEE, reflected, as hash/crc32) over: 8 bytes of 0xFF
// standing in for the InfiniBand LRH; the IP header with the fields routers
// change set to all ones (IPv4: TOS, TTL, header checksum; IPv6: traffic
// class, flow label, hop limit); the UDP header with its checksum all ones;
// the BTH with byte 4 (FECN, BECN, reserved) all ones; and the rest of the
// packet up to the ICRC. It is stored little-endian in the last four bytes.
// These are the rules of IBTA Annex A17 as rdma_rxe implements them, and
// were checked on every packet of the captures in testdata/pcaps.
//
// The IPv4 Identification field is covered. A sender must therefore know
// the ID the kernel will write (see package transport for what each send
// path puts there), and a receiver that reads through a UDP socket never
// sees it: [V4.Recover] finds the one ID that makes a packet's ICRC match,
// which is sound because the CRC is linear in the ID bits (see its doc for
// what that costs in detection strength).
package icrc

import (
	"encoding/binary"
	"hash/crc32"
)

// Len is the length of the ICRC trailer.
const Len = 4

const bthLen = 12

// table is the reflected IEEE table hash/crc32 also uses.
var table = crc32.MakeTable(crc32.IEEE)

// lrhState is the CRC register (pre-inversion form) after the 8 bytes of
// 0xFF that stand in for the LRH: rdma_rxe's 0xdebb20e3 seed.
var lrhState = func() uint32 {
	s := ^uint32(0)
	for i := 0; i < 8; i++ {
		s = step(s, 0xff)
	}
	return s
}()

// step feeds one byte into a CRC register held in non-inverted form.
func step(s uint32, c byte) uint32 { return table[byte(s)^c] ^ s>>8 }

// feed runs bytes through the register one at a time. It is used for the
// short masked prefix, which lives on the stack: handing a stack buffer to
// crc32.Update would make it escape and allocate.
func feed(s uint32, b []byte) uint32 {
	for _, c := range b {
		s = step(s, c)
	}
	return s
}

// tail finishes the CRC over the packet body (BTH byte 12 to the ICRC) with
// hash/crc32's accelerated code and returns the final ICRC value.
func tail(s uint32, pkt []byte) uint32 {
	// crc32.Update takes and returns the inverted (final) form.
	return crc32.Update(^s, table, pkt[bthLen:len(pkt)-Len])
}

// maskedBTH feeds the BTH with byte 4 set to all ones.
func maskedBTH(s uint32, pkt []byte) uint32 {
	s = feed(s, pkt[:4])
	s = step(s, 0xff)
	return feed(s, pkt[5:bthLen])
}

// udp feeds a UDP header with the checksum all ones.
func udp(s uint32, sport, dport uint16, length int) uint32 {
	var h [8]byte
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint16(h[4:], uint16(length))
	h[6], h[7] = 0xff, 0xff
	return feed(s, h[:])
}

// Put stores crc in the last four bytes of pkt.
func Put(pkt []byte, crc uint32) { binary.LittleEndian.PutUint32(pkt[len(pkt)-Len:], crc) }

// Get reads the ICRC stored in the last four bytes of pkt.
func Get(pkt []byte) uint32 { return binary.LittleEndian.Uint32(pkt[len(pkt)-Len:]) }

// valid reports whether pkt can hold a BTH and an ICRC.
func valid(pkt []byte) bool { return len(pkt) >= bthLen+Len }

// FromHeaders computes the ICRC of pkt (a UDP payload from the BTH through
// the ICRC) from the real IP and UDP headers it travelled under, as read
// from a capture or a raw socket. ip is an IPv4 header (options included)
// or an IPv6 header; udpHdr is the 8-byte UDP header. ok is false when the
// headers are not well formed.
func FromHeaders(ip, udpHdr, pkt []byte) (crc uint32, ok bool) {
	if len(udpHdr) < 8 || !valid(pkt) || len(ip) < 1 {
		return 0, false
	}
	s := lrhState
	switch ip[0] >> 4 {
	case 4:
		ihl := int(ip[0]&0xf) * 4
		if ihl < 20 || len(ip) < ihl {
			return 0, false
		}
		s = feed(s, ip[0:1])
		s = step(s, 0xff) // TOS
		s = feed(s, ip[2:8])
		s = step(s, 0xff) // TTL
		s = step(s, ip[9])
		s = step(s, 0xff) // checksum
		s = step(s, 0xff)
		s = feed(s, ip[12:ihl])
	case 6:
		if len(ip) < 40 {
			return 0, false
		}
		s = step(s, ip[0]|0x0f) // version kept, traffic class and flow label ones
		s = step(s, 0xff)
		s = step(s, 0xff)
		s = step(s, 0xff)
		s = feed(s, ip[4:7]) // payload length, next header
		s = step(s, 0xff)    // hop limit
		s = feed(s, ip[8:40])
	default:
		return 0, false
	}
	s = feed(s, udpHdr[0:6])
	s = step(s, 0xff)
	s = step(s, 0xff)
	s = maskedBTH(s, pkt)
	return tail(s, pkt), true
}
