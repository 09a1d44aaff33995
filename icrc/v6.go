package icrc

import "github.com/rxego/rxego/internal/iphdr"

// V6 holds what an IPv6 RoCEv2 packet's ICRC covers besides the packet:
// addresses and ports. Everything else the ICRC covers in an IPv6 header
// follows from the packet, so a UDP-socket receiver can check the full CRC.
type V6 struct {
	Src, Dst         [16]byte
	SrcPort, DstPort uint16
}

// Flow returns v's addresses and ports folded in ahead, for many packets
// of the flow.
func (v *V6) Flow() Flow {
	var h [iphdr.IPv6Len + iphdr.UDPLen]byte
	// Traffic class, flow label and hop limit masked to all ones; the
	// lengths are left zero for Flow.head to add.
	iphdr.IPv6(h[:]).Encode(&iphdr.IPv6Fields{TrafficClass: 0xff, FlowLabel: 0xfffff,
		NextHeader: iphdr.ProtoUDP, HopLimit: 0xff, Src: v.Src, Dst: v.Dst})
	putUDP(h[iphdr.IPv6Len:], v.SrcPort, v.DstPort, 0)
	return Flow{reg: prefix(h[:]), v6: true}
}

// Sum returns the ICRC of pkt (BTH through ICRC).
func (v *V6) Sum(pkt []byte) uint32 { return v.Flow().Sum(0, pkt) }

// SumScattered is Flow.SumScattered for one packet of v's flow.
func (v *V6) SumScattered(hdr, payload, trailer []byte) uint32 {
	return v.Flow().SumScattered(0, hdr, payload, trailer)
}

// Fill computes and stores pkt's ICRC.
func (v *V6) Fill(pkt []byte) { v.Flow().Fill(0, pkt) }

// Check reports whether pkt's ICRC is right.
func (v *V6) Check(pkt []byte) bool { return v.Flow().Check(0, pkt) }
