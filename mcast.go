package rxego

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/rxego/rxego/internal/device"
	"github.com/rxego/rxego/qp"
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

// AttachMcast attaches the UD QP q to the multicast group mgid
// (ibv_attach_mcast): an IPv4-mapped (::ffff:224.0.0.0/100) or IPv6
// (ff00::/8) multicast GID, or the IPv4 group itself. The device joins
// the group on its first GID of that family; attaching a QP twice is
// allowed and changes nothing. The group's socket is made in the network
// namespace of the calling thread, as Open's are.
func AttachMcast(q *QP, mgid netip.Addr) error {
	d, g, err := mcastArgs(q, mgid)
	if err != nil {
		return err
	}
	return d.dev.AttachMcast(q, g)
}

// DetachMcast detaches q from the group (ibv_detach_mcast); the device
// leaves the group when no QP is attached any more. Detaching a QP that
// is not attached fails. While q is attached to any group, q.Destroy
// fails with ErrBusy (verbs: EBUSY) and changes nothing; Device.Close
// detaches and destroys all the same.
func DetachMcast(q *QP, mgid netip.Addr) error {
	d, g, err := mcastArgs(q, mgid)
	if err != nil {
		return err
	}
	return d.dev.DetachMcast(q, g)
}

// mcastArgs checks an attach or detach and returns q's device and the
// group address.
func mcastArgs(q *QP, mgid netip.Addr) (*Device, netip.Addr, error) {
	g := mgid.Unmap()
	if !g.IsMulticast() {
		return nil, g, fmt.Errorf("rxego: %v is not a multicast GID", mgid)
	}
	if q == nil || q.Type() != qp.UD {
		return nil, g, errors.New("rxego: only UD QPs attach to multicast groups")
	}
	v, ok := qpDevices.Load(q)
	if !ok && q.Destroyed() {
		return nil, g, fmt.Errorf("rxego: QP %d was destroyed: %w", q.Num(), ErrClosed)
	}
	if !ok {
		return nil, g, fmt.Errorf("rxego: QP %d belongs to no open device", q.Num())
	}
	d := v.(*Device)
	return d, g, d.check()
}

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
