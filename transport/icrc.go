package transport

import (
	"net/netip"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/icrc"
)

// endpoint knows what an ICRC covers besides the packet: the local address
// and port, and the address family. Every Conn implementation fills and
// checks ICRCs through it, so they agree byte for byte.
type endpoint struct {
	local netip.AddrPort
	v6    bool
}

func newEndpoint(local netip.AddrPort) endpoint {
	return endpoint{local: local, v6: local.Addr().Is6()}
}

// The largest UDP payloads: 65535 minus the UDP header and, for IPv4, the
// IP header (IPv6's payload length excludes its header). They bound one
// datagram, and so one GSO run.
const (
	maxPayload4 = 65535 - 20 - 8
	maxPayload6 = 65535 - 8
)

// maxPayload is the largest UDP payload of the endpoint's family.
func (e *endpoint) maxPayload() int {
	if e.v6 {
		return maxPayload6
	}
	return maxPayload4
}

// peer returns p in this endpoint's family (IPv4-mapped IPv6 is unmapped
// for an IPv4 endpoint), or false when it cannot be reached from here.
func (e *endpoint) peer(p netip.AddrPort) (netip.AddrPort, bool) {
	a := p.Addr()
	if !e.v6 && a.Is4In6() {
		a = a.Unmap()
		p = netip.AddrPortFrom(a, p.Port())
	}
	if !a.IsValid() || a.Is6() != e.v6 || a.Is4In6() || a.IsUnspecified() || p.Port() == 0 {
		return p, false
	}
	return p, true
}

// v4 describes an IPv4 packet from src to dst as the ICRC sees it. DF is
// always set: rxe sends DF, and so does every Conn of this package.
func v4(src, dst netip.AddrPort) icrc.V4 {
	return icrc.V4{Src: src.Addr().As4(), Dst: dst.Addr().As4(), SrcPort: src.Port(), DstPort: dst.Port(), DF: true}
}

func v6(src, dst netip.AddrPort) icrc.V6 {
	return icrc.V6{Src: src.Addr().As16(), Dst: dst.Addr().As16(), SrcPort: src.Port(), DstPort: dst.Port()}
}

// flow returns the ICRC flow (icrc.Flow) of packets from src to dst in
// this endpoint's family: what their ICRCs cover besides the packets,
// folded once for many packets.
func (e *endpoint) flow(src, dst netip.AddrPort) icrc.Flow {
	if e.v6 {
		v := v6(src, dst)
		return v.Flow()
	}
	v := v4(src, dst)
	return v.Flow()
}

// outbound returns the ICRC flow of packets from this endpoint to peer.
func (e *endpoint) outbound(peer netip.AddrPort) icrc.Flow { return e.flow(e.local, peer) }

// inbound returns the ICRC flow of packets from peer to this endpoint.
func (e *endpoint) inbound(peer netip.AddrPort) icrc.Flow { return e.flow(peer, e.local) }

// fill writes the ICRC of pkt, sent from this endpoint to peer with IPv4
// ID id (ignored for IPv6).
func (e *endpoint) fill(pkt []byte, peer netip.AddrPort, id uint16) {
	e.outbound(peer).Fill(id, pkt)
}

// fillRun fills every segment of a Seg run. gso says the run goes out as
// one GSO datagram, whose segments the kernel numbers id, id+1, ...; sent
// as separate datagrams every one carries id. The flow is folded once for
// the run.
func (e *endpoint) fillRun(buf []byte, seg int, peer netip.AddrPort, id uint16, gso bool) {
	flow := e.outbound(peer)
	for off := 0; off < len(buf); off += seg {
		flow.Fill(id, buf[off:min(off+seg, len(buf))])
		if gso {
			id++
		}
	}
}

// runSegments validates a Seg run of n bytes and returns its packet count.
func (e *endpoint) runSegments(n, seg int) (int, error) {
	if n < minPacket || n > e.maxPayload() {
		return 0, ErrPacketSize
	}
	if seg <= 0 || seg >= n {
		return 1, nil
	}
	k := (n + seg - 1) / seg
	if seg < minPacket || k > MaxSegments || n-(k-1)*seg < minPacket {
		return 0, ErrSegments
	}
	return k, nil
}

// classify runs the checks that need no ICRC: length and the opcode
// table. The parsed packet is what Recv hands up (Message.Pkt): no layer
// above parses it again.
func classify(pkt []byte) (bth.Packet, DropReason, bool) {
	if len(pkt) < minPacket {
		return bth.Packet{}, DropShort, false
	}
	p, err := bth.Parse(pkt)
	if err != nil {
		if err == bth.ErrTruncated {
			return p, DropShort, false
		}
		return p, DropNotRoCE, false
	}
	return p, 0, true
}

// noDF gives the reason to drop an IPv4 packet through a UDP socket whose
// ICRC no ID makes right with DF set (v): DropNoDF when one does with DF
// clear, as its sender computed it, else DropBadICRC. Only failing
// packets pay for the second solve, and both outcomes drop.
func noDF(v *icrc.V4, pkt []byte) DropReason {
	v.DF = false
	if _, ok := v.Recover(pkt); ok {
		return DropNoDF
	}
	return DropBadICRC
}

// noDFWitness decides, in socket mode, whether an IPv4 packet whose ICRC
// matches only with DF clear (recover's DropNoDF) counts as no_df: only
// when the packet before it from the same peer was such a packet too,
// else as bad_icrc. A sender without DF sends every packet so, but a
// corrupted packet passes the DF-clear solve by chance: about 2^-16 for
// random errors, and for single-bit errors far more often, since a few
// positions always do (1 to 2 of the 8,272 to 33,000 single-bit errors of
// a 1040- to 4136-byte packet, about 8 times 2^-16: a property of the
// polynomial and of their distance to the DF and ID bits). Requiring two
// in a row makes a corruption count as no_df only about as often as two
// such corruptions follow each other. Raw mode sees the DF bit itself.
type noDFWitness struct {
	peer netip.AddrPort // the peer of the last no_df candidate
	seen bool           // and no other packet from it came since
}

// observe returns the reason to count for a packet from peer that
// recover judged with reason (0 for a good packet).
func (w *noDFWitness) observe(peer netip.AddrPort, reason DropReason) DropReason {
	switch {
	case reason != DropNoDF:
		if w.seen && peer == w.peer {
			w.seen = false // the run is broken
		}
		return reason
	case w.seen && peer == w.peer:
		return DropNoDF
	}
	w.peer, w.seen = peer, true
	return DropBadICRC
}

// recover checks a packet that came through a UDP socket, where the IPv4
// ID is not visible: IPv4 finds the one ID that makes the ICRC match, IPv6
// checks in full and gives ID 0. guess is the likely ID (0: none): it is
// checked first, and only when it fails is the ID solved for, which a
// right guess saves. flow is inbound(peer), made once for the packets
// that come from peer in a row.
func (e *endpoint) recover(pkt []byte, peer netip.AddrPort, flow icrc.Flow, guess uint16) (p bth.Packet, id uint16, reason DropReason, ok bool) {
	if p, reason, ok = classify(pkt); !ok {
		return p, 0, reason, false
	}
	if guess != 0 && !e.v6 && flow.Check(guess, pkt) {
		return p, guess, 0, true
	}
	if id, ok = flow.Recover(pkt); !ok {
		if e.v6 {
			return p, 0, DropBadICRC, false
		}
		v := v4(peer, e.local)
		return p, 0, noDF(&v, pkt), false
	}
	return p, id, 0, true
}

// check checks a packet whose IPv4 ID is known (raw mode, pipes).
func (e *endpoint) check(pkt []byte, peer netip.AddrPort, id uint16) (bth.Packet, DropReason, bool) {
	p, reason, ok := classify(pkt)
	if !ok {
		return p, reason, false
	}
	if !e.inbound(peer).Check(id, pkt) {
		return p, DropBadICRC, false
	}
	return p, 0, true
}
