// Package iphdr is a view of the IPv4, IPv6 and UDP headers that carry
// RoCEv2, in the style of gVisor's pkg/tcpip/header: a header is a byte
// slice, written from a small Fields value by Encode and read back by
// accessors, without allocating. It serves everything that builds such
// headers itself: the ICRC's masked pseudo-headers, the GRH a UD receiver
// finds, and the frames of packet captures. It imports nothing of ours.
package iphdr

import "encoding/binary"

// Header lengths (IPv4 without options) and the UDP protocol number.
const (
	IPv4Len  = 20
	IPv6Len  = 40
	UDPLen   = 8
	ProtoUDP = 17
)

// IPv4 is an IPv4 header without options, at least IPv4Len bytes.
type IPv4 []byte

// IPv4Fields are the fields of an IPv4 header that Encode writes.
type IPv4Fields struct {
	TOS         uint8
	TotalLength uint16 // IP header and everything after it
	ID          uint16
	DF          bool // don't fragment; the fragment offset is always 0
	TTL         uint8
	Protocol    uint8
	Checksum    uint16 // written as given (see inetsum for computing it)
	Src, Dst    [4]byte
}

// Encode writes the whole header from f: version 4, header length 5 words.
func (h IPv4) Encode(f *IPv4Fields) {
	h[0] = 0x45
	h[1] = f.TOS
	binary.BigEndian.PutUint16(h[2:], f.TotalLength)
	binary.BigEndian.PutUint16(h[4:], f.ID)
	h[6], h[7] = 0, 0
	if f.DF {
		h[6] = 0x40
	}
	h[8] = f.TTL
	h[9] = f.Protocol
	binary.BigEndian.PutUint16(h[10:], f.Checksum)
	copy(h[12:16], f.Src[:])
	copy(h[16:20], f.Dst[:])
}

// HeaderLen returns the header length in bytes from the IHL field.
func (h IPv4) HeaderLen() int { return int(h[0]&0xf) * 4 }

// Protocol returns the protocol of the payload (ProtoUDP for RoCEv2).
func (h IPv4) Protocol() uint8 { return h[9] }

// ID returns the Identification field.
func (h IPv4) ID() uint16 { return binary.BigEndian.Uint16(h[4:]) }

// SetChecksum sets the header checksum.
func (h IPv4) SetChecksum(c uint16) { binary.BigEndian.PutUint16(h[10:], c) }

// Addrs returns the source and destination addresses as they stand in the
// header, the bytes a UDP checksum's pseudo-header starts with.
func (h IPv4) Addrs() []byte { return h[12:20] }

// IPv6 is an IPv6 header, at least IPv6Len bytes.
type IPv6 []byte

// IPv6Fields are the fields of an IPv6 header that Encode writes.
type IPv6Fields struct {
	TrafficClass  uint8
	FlowLabel     uint32 // 20 bits
	PayloadLength uint16 // everything after the header
	NextHeader    uint8
	HopLimit      uint8
	Src, Dst      [16]byte
}

// Encode writes the whole header from f.
func (h IPv6) Encode(f *IPv6Fields) {
	binary.BigEndian.PutUint32(h[0:], 6<<28|uint32(f.TrafficClass)<<20|f.FlowLabel&0xfffff)
	binary.BigEndian.PutUint16(h[4:], f.PayloadLength)
	h[6] = f.NextHeader
	h[7] = f.HopLimit
	copy(h[8:24], f.Src[:])
	copy(h[24:40], f.Dst[:])
}

// Addrs returns the source and destination addresses as they stand in the
// header, the bytes a UDP checksum's pseudo-header starts with.
func (h IPv6) Addrs() []byte { return h[8:40] }

// UDP is a UDP header, at least UDPLen bytes.
type UDP []byte

// UDPFields are the fields of a UDP header.
type UDPFields struct {
	SrcPort, DstPort uint16
	Length           uint16 // header and payload
	Checksum         uint16
}

// Encode writes the whole header from f.
func (u UDP) Encode(f *UDPFields) {
	binary.BigEndian.PutUint16(u[0:], f.SrcPort)
	binary.BigEndian.PutUint16(u[2:], f.DstPort)
	binary.BigEndian.PutUint16(u[4:], f.Length)
	binary.BigEndian.PutUint16(u[6:], f.Checksum)
}

// DstPort returns the destination port.
func (u UDP) DstPort() uint16 { return binary.BigEndian.Uint16(u[2:]) }

// SetChecksum sets the checksum.
func (u UDP) SetChecksum(c uint16) { binary.BigEndian.PutUint16(u[6:], c) }
