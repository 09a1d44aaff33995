package rxego

import (
	"net/netip"
	"time"

	"github.com/rxego/rxego/transport"
)

// SetTap installs t as the observer of every packet the device sends,
// receives and drops (nil removes it): a transport/pcaptap Writer records
// them as pcapng, `rxego trace` and the demo draw them. It replaces the
// Tap given in Options. Packets already in flight when SetTap returns may
// still reach the previous Tap. The sockets of multicast groups the
// device joins (AttachMcast) get it too.
func (d *Device) SetTap(t Tap) {
	if d.dev != nil {
		d.dev.SetTap(t)
	}
}

// Tap observes a device's traffic: for pcap writing (a transport/pcaptap
// Writer is one), live tracing and metrics. Its methods are called from
// the goroutine that sends or receives, with a timestamp taken once per
// batch; pkt (the packet from the BTH through the ICRC) is only valid
// during the call. Keep them fast.
type Tap interface {
	// Packet is called for every packet sent (after its ICRC is filled in,
	// once per GSO segment, with the IP ID it will carry) and every packet
	// received that passed the checks.
	Packet(dir TapDir, at time.Time, local, remote netip.AddrPort, tos uint8, ipID uint16, pkt []byte)
	// Drop is called for every received packet the transport dropped
	// (bad ICRC, malformed, ...), except those the kernel dropped, which
	// have no packet.
	Drop(reason TapDropReason, at time.Time, local, remote netip.AddrPort, tos uint8, pkt []byte)
}

// TapDir says whether a Tap sees a packet sent (TapOut) or received
// (TapIn).
type TapDir = transport.Dir

// Directions of Tap.Packet.
const (
	TapOut = transport.Out // sent
	TapIn  = transport.In  // received and verified
)

// TapDropReason says why the transport dropped a received packet.
type TapDropReason = transport.DropReason
