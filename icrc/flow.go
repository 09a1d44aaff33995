package icrc

import "github.com/rxego/rxego/internal/iphdr"

// Flow is what a packet's ICRC covers besides the packet, folded into the
// CRC register ahead of time: the addresses, the ports and (IPv4) the DF
// bit, which one flow's packets share. A packet's Sum, Fill or Check then
// looks up only its lengths and (IPv4) IP ID, 4 to 6 bytes of the
// headers, where a V4 folds 18 and a V6 feeds all 48 for each packet.
// Build one (V4.Flow, V6.Flow) for the many packets of a GSO run or a GRO
// batch. The zero Flow describes no real flow.
type Flow struct {
	reg uint32 // the register with every length and the ID zero
	v6  bool
}

// head returns the register after the LRH stand-in and the masked IP and
// UDP headers of an n-byte packet of the flow, sent with IPv4 ID id (IPv6
// has none).
func (f Flow) head(id uint16, n int) uint32 {
	// wide[j] for header byte k is wide[len-1-k]: the UDP length is the
	// last header's bytes 4-5 in both families.
	w := wide
	udpLen := uint16(iphdr.UDPLen + n)
	r := f.reg ^ w[3][udpLen>>8] ^ w[2][byte(udpLen)]
	if f.v6 {
		// The payload length (k 4-5 of 48) equals the UDP length.
		return r ^ w[43][udpLen>>8] ^ w[42][byte(udpLen)]
	}
	// The total length (k 2-3 of 28) and the ID (4-5).
	ipLen := iphdr.IPv4Len + udpLen
	return r ^ w[25][ipLen>>8] ^ w[24][byte(ipLen)] ^ w[23][id>>8] ^ w[22][byte(id)]
}

// Sum returns the ICRC of pkt (BTH through ICRC) sent with IPv4 ID id
// (ignored for IPv6).
func (f Flow) Sum(id uint16, pkt []byte) uint32 {
	if !valid(pkt) {
		return 0
	}
	return sumFrom(f.head(id, len(pkt)), pkt)
}

// SumScattered returns the ICRC of the packet hdr, payload, trailer laid
// end to end (BTH through ICRC, as Sum's pkt) sent with IPv4 ID id,
// without gathering it: for a packet whose payload is sent from where it
// lies. hdr must hold at least the BTH and trailer at least the ICRC.
func (f Flow) SumScattered(id uint16, hdr, payload, trailer []byte) uint32 {
	if len(hdr) < bthLen || len(trailer) < Len {
		return 0
	}
	return sumScattered(f.head(id, len(hdr)+len(payload)+len(trailer)), hdr, payload, trailer)
}

// Fill computes the ICRC for IPv4 ID id and stores it in pkt.
func (f Flow) Fill(id uint16, pkt []byte) {
	if valid(pkt) {
		Put(pkt, f.Sum(id, pkt))
	}
}

// Check reports whether pkt's ICRC is right for IPv4 ID id.
func (f Flow) Check(id uint16, pkt []byte) bool {
	return valid(pkt) && f.Sum(id, pkt) == Get(pkt)
}

// Recover is V4.Recover for a packet of the flow. An IPv6 packet has no
// ID to find: ok says whether its ICRC is right, and id is 0.
func (f Flow) Recover(pkt []byte) (id uint16, ok bool) {
	if !valid(pkt) {
		return 0, false
	}
	got := Get(pkt)
	c0 := f.Sum(0, pkt)
	if c0 == got || f.v6 {
		return 0, c0 == got
	}
	// Bytes processed after the two ID bytes: the rest of the IP header
	// (14), the UDP header (8) and the packet up to the ICRC.
	n := 14 + 8 + len(pkt) - Len
	u := unshift(n, got^c0)
	b0, b1, ok := solveID(u)
	if !ok {
		return 0, false
	}
	return uint16(b0)<<8 | uint16(b1), true
}
