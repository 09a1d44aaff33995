package iphdr

import (
	"bytes"
	"encoding/hex"
	"testing"
)

// TestIPv4 encodes the worked example of RFC 1071 checksums
// (192.168.0.1 -> 192.168.0.199, UDP, DF, TTL 64) byte for byte and reads
// its fields back.
func TestIPv4(t *testing.T) {
	want, _ := hex.DecodeString("450000730000400040110000c0a80001c0a800c7")
	h := IPv4(bytes.Repeat([]byte{0xee}, IPv4Len))
	h.Encode(&IPv4Fields{TotalLength: 0x73, DF: true, TTL: 64, Protocol: ProtoUDP,
		Src: [4]byte{192, 168, 0, 1}, Dst: [4]byte{192, 168, 0, 199}})
	if !bytes.Equal(h, want) {
		t.Fatalf("% x\nwant % x", []byte(h), want)
	}
	h.SetChecksum(0xb861)
	if h[10] != 0xb8 || h[11] != 0x61 || h.HeaderLen() != 20 || h.Protocol() != ProtoUDP || h.ID() != 0 ||
		!bytes.Equal(h.Addrs(), want[12:20]) {
		t.Errorf("read back: % x", []byte(h))
	}
	h.Encode(&IPv4Fields{ID: 0x1234})
	if h.ID() != 0x1234 || h[6] != 0 {
		t.Errorf("ID and no DF: % x", []byte(h))
	}
}

// TestIPv6 encodes a header with every field set, as the ICRC masks it.
func TestIPv6(t *testing.T) {
	h := IPv6(make([]byte, IPv6Len))
	var src, dst [16]byte
	src[15], dst[15] = 1, 2
	h.Encode(&IPv6Fields{TrafficClass: 0xff, FlowLabel: 0xfffff, PayloadLength: 300, NextHeader: ProtoUDP,
		HopLimit: 0xff, Src: src, Dst: dst})
	want := append([]byte{0x6f, 0xff, 0xff, 0xff, 0x01, 0x2c, 17, 0xff}, append(src[:], dst[:]...)...)
	if !bytes.Equal(h, want) || !bytes.Equal(h.Addrs(), want[8:]) {
		t.Fatalf("% x\nwant % x", []byte(h), want)
	}
	h.Encode(&IPv6Fields{TrafficClass: 0x12, FlowLabel: 0xfff12345})
	if h[0] != 0x61 || h[1] != 0x21 || h[2] != 0x23 || h[3] != 0x45 {
		t.Errorf("traffic class and a 20-bit label: % x", h[:4])
	}
}

// TestUDP encodes and reads a UDP header.
func TestUDP(t *testing.T) {
	u := UDP(make([]byte, UDPLen))
	u.Encode(&UDPFields{SrcPort: 0xc001, DstPort: 4791, Length: 36, Checksum: 0xffff})
	if want := []byte{0xc0, 0x01, 0x12, 0xb7, 0, 36, 0xff, 0xff}; !bytes.Equal(u, want) || u.DstPort() != 4791 {
		t.Fatalf("% x, want % x", []byte(u), want)
	}
	u.SetChecksum(0x1234)
	if u[6] != 0x12 || u[7] != 0x34 {
		t.Errorf("checksum % x", u[6:])
	}
}
