package transport

import (
	"net/netip"

	"github.com/rxego/rxego/bth"
)

// ICRCs fills and checks the ICRCs of the packets one local address sends
// and receives, byte for byte as this package's Conns do: for a Conn of
// another package that handles packets itself, as the impairment shim
// (transport/impair) does when it corrupts them after their ICRC.
type ICRCs struct{ e endpoint }

// NewICRCs returns the ICRCs of local's packets.
func NewICRCs(local netip.AddrPort) *ICRCs { return &ICRCs{e: newEndpoint(local)} }

// Local returns the local address.
func (c *ICRCs) Local() netip.AddrPort { return c.e.local }

// Peer returns p in the local address's family (an IPv4-mapped address
// unmapped for an IPv4 one), or false when it cannot be reached from it.
func (c *ICRCs) Peer(p netip.AddrPort) (netip.AddrPort, bool) { return c.e.peer(p) }

// Fill writes the ICRC of pkt, sent to peer with IPv4 ID id (ignored for
// IPv6).
func (c *ICRCs) Fill(pkt []byte, peer netip.AddrPort, id uint16) { c.e.fill(pkt, peer, id) }

// Check checks a packet received from peer with IPv4 ID id as Recv does,
// and returns it parsed, or why it is dropped.
func (c *ICRCs) Check(pkt []byte, peer netip.AddrPort, id uint16) (bth.Packet, DropReason, bool) {
	return c.e.check(pkt, peer, id)
}

// RunSegments validates a Message of n bytes with Seg seg, as Send does,
// and returns how many packets it holds.
func (c *ICRCs) RunSegments(n, seg int) (int, error) { return c.e.runSegments(n, seg) }
