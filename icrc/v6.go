package icrc

import "github.com/rxego/rxego/internal/iphdr"

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
	return sumFrom(v.head(len(pkt)), pkt)
}

// SumScattered returns the ICRC of the packet hdr, payload, trailer laid
// end to end (BTH through ICRC, as Sum's pkt), without gathering it: for
// a packet whose payload is sent from where it lies. hdr must hold at
// least the BTH and trailer at least the ICRC.
func (v *V6) SumScattered(hdr, payload, trailer []byte) uint32 {
	if len(hdr) < bthLen || len(trailer) < Len {
		return 0
	}
	return sumScattered(v.head(len(hdr)+len(payload)+len(trailer)), hdr, payload, trailer)
}

// head returns the register after the LRH stand-in and the masked IPv6
// and UDP headers of an n-byte packet.
func (v *V6) head(n int) uint32 {
	var h [iphdr.IPv6Len + iphdr.UDPLen]byte
	// Traffic class, flow label and hop limit masked to all ones.
	iphdr.IPv6(h[:]).Encode(&iphdr.IPv6Fields{TrafficClass: 0xff, FlowLabel: 0xfffff,
		PayloadLength: uint16(iphdr.UDPLen + n), NextHeader: iphdr.ProtoUDP, HopLimit: 0xff,
		Src: v.Src, Dst: v.Dst})
	putUDP(h[iphdr.IPv6Len:], v.SrcPort, v.DstPort, iphdr.UDPLen+n)
	return prefix(h[:])
}

// Fill computes and stores pkt's ICRC.
func (v *V6) Fill(pkt []byte) {
	if valid(pkt) {
		Put(pkt, v.Sum(pkt))
	}
}

// Check reports whether pkt's ICRC is right.
func (v *V6) Check(pkt []byte) bool { return valid(pkt) && v.Sum(pkt) == Get(pkt) }
