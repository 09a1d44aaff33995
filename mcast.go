package rxego

import (
	"net/netip"

	"github.com/rxego/rxego/internal/device"
)

// UD multicast, as rxe does it: a multicast GID is an IP multicast group
// (an IPv4-mapped MGID ::ffff:239.a.b.c is the IPv4 group 239.a.b.c); a
// device joins the group on the interface of its first GID of the
// group's family when a QP first attaches, with a socket of its own bound
// to the group, and leaves it when the last
// QP detaches. Datagrams to a group carry destination QPN 0xFFFFFF (the
// sender's SendWR.RemoteQPN, as in verbs); the device hands each one to
// every QP attached to the group, each with its own copy, as rxe's
// rxe_rcv_mcast_pkt does. Sending needs nothing special: an AH to the
// group's address and RemoteQPN MulticastQPN.

// MulticastQPN is the destination QP number of a datagram to a multicast
// group (IB_MULTICAST_QPN).
const MulticastQPN = device.MulticastQPN

// McastNoRecvDrops returns, for each multicast group the device has
// joined, how many of its datagrams an attached QP dropped because it had
// no receive posted (one per QP copy; all groups together are the drop
// reason mcast_no_recv_wqe). UD takes datagrams from any sender, so a
// flood of forged ones to a group uses up the receives; this is where the
// legit datagrams lost then are counted. A QP attached to several groups
// that receive at the same moment may have a drop counted under the wrong
// one of them.
func (d *Device) McastNoRecvDrops() map[netip.Addr]uint64 {
	if d.dev == nil {
		return map[netip.Addr]uint64{}
	}
	return d.dev.McastNoRecvDrops()
}
