package icrc

import "encoding/binary"

// V6 holds what an IPv6 RoCEv2 packet's ICRC covers besides the packet:
// addresses and ports. Everything else the ICRC covers in an IPv6 header
// follows from the packet, so a UDP-socket receiver can check the full CRC.
type V6 struct {
	Src, Dst         [16]byte
	SrcPort, DstPort uint16
}

// Sum returns the ICRC of pkt (BTH through ICRC).
func (v *V6) Sum(pkt []byte) uint32 {
	if !valid(pkt) {
		return 0
	}
	var h [40 + 8]byte
	h[0], h[1], h[2], h[3] = 0x6f, 0xff, 0xff, 0xff
	binary.BigEndian.PutUint16(h[4:], uint16(8+len(pkt)))
	h[6] = 17   // UDP
	h[7] = 0xff // hop limit
	copy(h[8:24], v.Src[:])
	copy(h[24:40], v.Dst[:])
	putUDP(h[40:], v.SrcPort, v.DstPort, 8+len(pkt))
	return sum(h[:], pkt)
}

// Fill computes and stores pkt's ICRC.
func (v *V6) Fill(pkt []byte) {
	if valid(pkt) {
		Put(pkt, v.Sum(pkt))
	}
}

// Check reports whether pkt's ICRC is right.
func (v *V6) Check(pkt []byte) bool { return valid(pkt) && v.Sum(pkt) == Get(pkt) }
