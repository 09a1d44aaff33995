package capfile

import (
	"encoding/binary"

	"github.com/gopacket/gopacket/layers"

	"github.com/rxego/rxego/icrc"
	"github.com/rxego/rxego/internal/inetsum"
)

// A packet socket sees a UDP GSO datagram (one sendmsg with UDP_SEGMENT)
// whole where the kernel has not cut it yet: always on loopback, and on a
// NIC that segments in hardware. rxego sends every multi-packet message
// that way, its packets back to back, each with its ICRC computed over the
// IPv4 Identification the kernel will give its segment (the datagram's ID,
// plus one per segment). SplitGSO rebuilds the frames the peer receives.

// SplitGSO cuts the frame data (link type link) of a GSO UDP datagram into
// the frames of its segments of segSize UDP payload bytes each (the last
// may be shorter), built as the kernel's UDP segmentation builds them:
// the link header copied; IPv4 total length, Identification (the
// datagram's plus the segment's index) and header checksum, or the IPv6
// payload length; UDP length and checksum (left zero when the datagram's
// was zero over IPv4). It returns nil when data is not UDP to or from
// port 4791 or is not longer than one segment.
func SplitGSO(link layers.LinkType, data []byte, segSize int) [][]byte {
	fr, ok := Split(link, data)
	if !ok || segSize <= 0 || len(fr.RoCE) <= segSize {
		return nil
	}
	var out [][]byte
	for i, off := 0, 0; off < len(fr.RoCE); i, off = i+1, off+segSize {
		out = append(out, segment(fr, i, fr.RoCE[off:min(off+segSize, len(fr.RoCE))]))
	}
	return out
}

// segment builds the frame of segment i, whose UDP payload is pay.
func segment(fr Frame, i int, pay []byte) []byte {
	ipOff := fr.IPOffset
	hdr := ipOff + len(fr.IP) + 8
	b := make([]byte, hdr+len(pay))
	copy(b, fr.Data[:hdr])
	copy(b[hdr:], pay)
	ip, udp := b[ipOff:ipOff+len(fr.IP)], b[hdr-8:hdr]
	ulen := 8 + len(pay)
	binary.BigEndian.PutUint16(udp[4:], uint16(ulen))
	v4 := ip[0]>>4 == 4
	if v4 {
		binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)+ulen))
		binary.BigEndian.PutUint16(ip[4:], binary.BigEndian.Uint16(ip[4:])+uint16(i))
		binary.BigEndian.PutUint16(ip[10:], 0)
		binary.BigEndian.PutUint16(ip[10:], inetsum.IPv4(ip))
	} else {
		binary.BigEndian.PutUint16(ip[4:], uint16(ulen))
	}
	if !v4 || binary.BigEndian.Uint16(fr.UDP[6:]) != 0 {
		var addrs []byte
		if v4 {
			addrs = ip[12:20]
		} else {
			addrs = ip[8:40]
		}
		binary.BigEndian.PutUint16(udp[6:], 0)
		binary.BigEndian.PutUint16(udp[6:], inetsum.UDP(addrs, b[hdr-8:]))
	}
	return b
}

// InferGSOSize finds the segment size of a GSO datagram of RoCE packets
// when the kernel does not say (kernels before 6.2 cannot describe UDP
// GSO to a packet socket): the size S at which every S bytes a BTH for
// the same QP follows with the next PSN (the last, shorter segment may be
// another packet to the same peer, such as an ACK) and at which every
// segment's ICRC checks under the headers the kernel gives it. It returns
// 0 when the datagram is one packet (or nothing fits).
func InferGSOSize(link layers.LinkType, data []byte) int {
	fr, ok := Split(link, data)
	p := fr.RoCE
	if !ok || len(p) < 2*(bthLen+icrc.Len) {
		return 0
	}
	for s := bthLen + icrc.Len; s < len(p) && s <= maxSegment; s += 4 {
		if follows(p, s) && segmentChecks(link, segment(fr, 0, p[:s])) &&
			segmentsCheck(link, SplitGSO(link, data, s)) {
			return s
		}
	}
	return 0
}

// maxSegment bounds the segment sizes InferGSOSize tries: a RoCE packet
// carries at most 4096 payload bytes (the largest path MTU) and its
// headers. The first segment's ICRC is checked before all are cut, so a
// forged datagram that looks like BTHs at many sizes costs a few
// megabytes of CRC, not its length squared.
const maxSegment = 4096 + 128

// segmentsCheck reports whether there are several segments and every
// one's ICRC checks.
func segmentsCheck(link layers.LinkType, segs [][]byte) bool {
	for _, d := range segs {
		if !segmentChecks(link, d) {
			return false
		}
	}
	return len(segs) > 1
}

// segmentChecks reports whether the frame d is RoCE with a good ICRC.
func segmentChecks(link layers.LinkType, d []byte) bool {
	fr, ok := Split(link, d)
	if !ok {
		return false
	}
	crc, ok := icrc.FromHeaders(fr.IP, fr.UDP, fr.RoCE)
	return ok && crc == icrc.Get(fr.RoCE)
}

// bthLen is the length of the Base Transport Header.
const bthLen = 12

// follows reports whether cutting p every s bytes gives a BTH at each cut
// with the first packet's TVer and P_Key, and, but for a shorter last
// segment, its QP and the next PSN.
func follows(p []byte, s int) bool {
	qpn := func(b []byte) uint32 { return binary.BigEndian.Uint32(b[4:8]) & 0xffffff }
	psn := func(b []byte) uint32 { return binary.BigEndian.Uint32(b[8:12]) & 0xffffff }
	for i, off := 1, s; off < len(p); i, off = i+1, off+s {
		b := p[off:]
		if len(b) < bthLen+icrc.Len || b[1]&0xf != p[1]&0xf || b[2] != p[2] || b[3] != p[3] {
			return false
		}
		if len(b) >= s && (qpn(b) != qpn(p) || psn(b) != (psn(p)+uint32(i))&0xffffff) {
			return false
		}
	}
	return true
}
