package device

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// UD multicast input, as rxe does it: a multicast GID is an IP multicast group
// (an IPv4-mapped MGID ::ffff:239.a.b.c is the IPv4 group 239.a.b.c); a
// device joins the group on the interface of its first GID of the
// group's family when a QP first attaches, with a socket of its own bound
// to the group (transport.ListenMulticast), and leaves it when the last
// QP detaches. Datagrams to a group carry destination QPN 0xFFFFFF (the
// sender's SendWR.RemoteQPN, as in verbs); the device hands each one to
// every QP attached to the group, each with its own copy, as rxe's
// rxe_rcv_mcast_pkt does. Sending needs nothing special: an AH to the
// group's address and RemoteQPN MulticastQPN.

// MulticastQPN is the destination QP number of a datagram to a multicast
// group (IB_MULTICAST_QPN).
const MulticastQPN = 0xFFFFFF

// mcastGroup is one joined group of a device.
type mcastGroup struct {
	conn transport.Conn
	rcv  *Receiver
	in   *mcastIn
	done chan struct{} // closed when the group's receive loop ended
}

// mcastIn is a group's Input: it delivers every datagram to each
// attached QP.
type mcastIn struct {
	d       *Device
	mu      sync.Mutex
	qps     []*qp.QP // attached, guarded by mu
	scratch []byte   // one QP's copy of the packet being delivered
	one     []qp.InPacket
	snap    []*qp.QP // qps, copied for one batch
	// noRecv counts the group's datagrams an attached QP dropped for want
	// of a posted receive (one per QP copy).
	noRecv atomic.Uint64
}

// AttachMcast adds q to group g (an unmapped multicast address), joining
// it first if needed; attaching a QP twice changes nothing.
func (d *Device) AttachMcast(q *qp.QP, g netip.Addr) error {
	d.mcMu.Lock()
	defer d.mcMu.Unlock()
	if d.closed.Load() {
		return qp.ErrClosed
	}
	grp := d.mcast[g]
	if grp != nil {
		grp.in.mu.Lock()
		in := slices.Contains(grp.in.qps, q)
		grp.in.mu.Unlock()
		if in {
			return nil
		}
	}
	// Counted in the QP first (this fails on a destroyed QP), so that
	// QP.Destroy refuses from now on; mcMu keeps qps as read above.
	if err := q.AttachGroup(); err != nil {
		return fmt.Errorf("rxego: attach QP %d to %v: %w", q.Num(), g, err)
	}
	if grp == nil {
		var err error
		if grp, err = d.join(g); err != nil {
			q.DetachGroup()
			return err
		}
	}
	grp.in.mu.Lock()
	grp.in.qps = append(grp.in.qps, q)
	grp.in.mu.Unlock()
	return nil
}

// join opens the group's socket on the first GID of its family and starts
// its receive loop.
func (d *Device) join(g netip.Addr) (*mcastGroup, error) {
	if d.given {
		return nil, errors.New("rxego: multicast needs the device's own sockets (not Options.Conn)")
	}
	var local netip.AddrPort
	for _, a := range d.gids {
		if a.Addr().Is4() == g.Is4() {
			local = a
			break
		}
	}
	if !local.IsValid() {
		return nil, fmt.Errorf("rxego: group %v: the device has no %s GID to join it on", g, family(g))
	}
	c, err := transport.ListenMulticast(netip.AddrPortFrom(g, local.Port()), local.Addr(), d.topts)
	if err != nil {
		return nil, fmt.Errorf("rxego: join %v: %w", g, err)
	}
	if d.tap != nil {
		c.SetTap(d.tap)
	}
	in := &mcastIn{d: d, scratch: make([]byte, qp.MaxPacket), one: make([]qp.InPacket, 1)}
	grp := &mcastGroup{conn: c, in: in, done: make(chan struct{}),
		rcv: NewReceiver(ReceiverConfig{Conn: c, In: in, Local: g, Stop: d.stop})}
	if d.mcast == nil {
		d.mcast = map[netip.Addr]*mcastGroup{}
	}
	d.mcast[g] = grp
	d.wg.Add(1)
	go func() { defer d.wg.Done(); defer close(grp.done); grp.rcv.Run() }()
	return grp, nil
}

// DetachMcast removes q from group g, leaving the group after its last
// QP.
func (d *Device) DetachMcast(q *qp.QP, g netip.Addr) error {
	d.mcMu.Lock()
	defer d.mcMu.Unlock()
	grp := d.mcast[g]
	if grp == nil {
		return fmt.Errorf("rxego: QP %d is not attached to %v", q.Num(), g)
	}
	grp.in.mu.Lock()
	i := slices.Index(grp.in.qps, q)
	if i >= 0 {
		grp.in.qps = slices.Delete(grp.in.qps, i, i+1)
	}
	left := len(grp.in.qps)
	grp.in.mu.Unlock()
	if i < 0 {
		return fmt.Errorf("rxego: QP %d is not attached to %v", q.Num(), g)
	}
	q.DetachGroup()
	if left == 0 {
		delete(d.mcast, g)
		d.leaveLocked(grp)
	}
	return nil
}

// leave closes the group's socket (the kernel leaves the group) and waits
// for its receive loop to end.
func (grp *mcastGroup) leave() {
	grp.conn.Close()
	<-grp.done
	grp.rcv.Close()
}

// leaveLocked leaves grp, keeping its socket's counters in the device's
// totals; d.mcMu is held.
func (d *Device) leaveLocked(grp *mcastGroup) {
	grp.leave()
	d.mcastLeft.Add(grp.conn.Stats())
}

// McastNoRecvDrops returns, for each multicast group the device has
// joined, how many of its datagrams an attached QP dropped because it had
// no receive posted (see rxego.Device.McastNoRecvDrops).
func (d *Device) McastNoRecvDrops() map[netip.Addr]uint64 {
	d.mcMu.Lock()
	defer d.mcMu.Unlock()
	m := make(map[netip.Addr]uint64, len(d.mcast))
	for g, grp := range d.mcast {
		m[g] = grp.in.noRecv.Load()
	}
	return m
}

// leaveAll leaves every group: the device is closing.
func (d *Device) leaveAll() {
	d.mcMu.Lock()
	defer d.mcMu.Unlock()
	for g, grp := range d.mcast {
		delete(d.mcast, g)
		d.leaveLocked(grp)
	}
}

// deliver hands every multicast datagram of pkts to each attached QP, a
// copy each with the QP's number as destination, through the QP's
// shard's engine (input is that engine's InputWoke or InputPolled).
// Anything not addressed to MulticastQPN is dropped.
func (x *mcastIn) deliver(pkts []qp.InPacket, polled bool) bool {
	x.mu.Lock()
	x.snap = append(x.snap[:0], x.qps...)
	x.mu.Unlock()
	woke := false
	for i := range pkts {
		p := &pkts[i]
		if p.Pkt.BTH().DestQP() != MulticastQPN || len(p.Pkt.Raw) > len(x.scratch) {
			x.d.shards[0].eng.Stats.RcvdPkts.Add(1)
			x.d.shards[0].eng.Stats.Drops[qp.DropUnknownQP].Add(1)
			continue
		}
		for _, q := range x.snap {
			n := copy(x.scratch, p.Pkt.Raw)
			b := bth.BTH(x.scratch[:bth.Len])
			b.SetDestQP(q.Num())
			x.one[0] = qp.InPacket{Pkt: bth.Packet{Raw: x.scratch[:n], Info: p.Pkt.Info}, Src: p.Src, TOS: p.TOS, Dest: p.Dest}
			eng := x.d.shards[x.d.ShardOf(q.Num())].eng
			before := q.McastNoRecvDrops()
			if polled {
				woke = eng.InputPolled(x.one) || woke
				eng.FlushAcks()
			} else {
				woke = eng.InputWoke(x.one) || woke
			}
			x.noRecv.Add(q.McastNoRecvDrops() - before)
		}
	}
	clear(x.snap)
	return woke
}

// InputWoke implements Input.
func (x *mcastIn) InputWoke(pkts []qp.InPacket) bool { return x.deliver(pkts, false) }

// InputPolled implements Input.
func (x *mcastIn) InputPolled(pkts []qp.InPacket) bool { return x.deliver(pkts, true) }

// FlushAcks implements Input: UD has no ACKs, and deliver flushed.
func (x *mcastIn) FlushAcks() {}
