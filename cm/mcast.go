package cm

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/rxego/rxego"
)

// rdma_cm's multicast join on RoCE (rdma_join_multicast, the kernel's
// cma_iboe_join_multicast) sends no MAD: there is no SA to ask. It maps
// the IP group to an MGID, joins the IP group on the bound interface
// (IGMP) unless the join is send-only, and hands the application, in the
// MULTICAST_JOIN event, what it needs to send to the group: an address
// handle to the MGID, QPN 0xFFFFFF and the port space's Q_Key. librdmacm
// then attaches the ID's QP to the MGID (ibv_attach_mcast), except for a
// send-only join. JoinMulticast does all of that in one call.

// JoinOptions tunes JoinMulticast. The zero value is a full join from the
// device's first GID of the group's address family.
type JoinOptions struct {
	// SendOnly joins as a send-only full member
	// (RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER): the QP can send to the
	// group, but it is not attached and the device joins no IP group, so
	// nothing sent to the group reaches it.
	SendOnly bool
	// Source is the device address the join is bound to (rdma_bind_addr,
	// mckey's -b): the group's address handle sends from that GID. The
	// zero Addr means the device's first GID of the group's family.
	Source netip.Addr
}

// Membership is one QP's join of a multicast group: the parameters
// rdma_cm's MULTICAST_JOIN event carries (struct rdma_ud_param). Send to
// the group with a UD SendWR whose AH, RemoteQPN and RemoteQKey are AH,
// QPN and QKey.
type Membership struct {
	// Group is the IP multicast group joined.
	Group netip.Addr
	// MGID is the group's multicast GID: ::ffff:a.b.c.d for an IPv4
	// group (RoCEv2's mapping, cma_iboe_set_mgid), the address itself for
	// an IPv6 one.
	MGID netip.Addr
	// QPN is the destination QP number of datagrams to the group
	// (rxego.MulticastQPN).
	QPN uint32
	// QKey is the Q_Key of the UDP port space's groups (UDPQKey).
	QKey uint32
	// AH addresses the group from the join's source GID.
	AH *rxego.AH
	// SendOnly says the join was send-only: the QP is not attached.
	SendOnly bool

	m *Manager
	q *rxego.QP
}

// ErrJoined is JoinMulticast's error for a QP already joined to the group
// (rdma_join_multicast: EADDRINUSE).
var ErrJoined = errors.New("cm: the QP has already joined this group")

// MGID returns the multicast GID rdma_cm maps an IP multicast group to on
// RoCEv2: ::ffff:a.b.c.d for the IPv4 group a.b.c.d (given plain or
// IPv4-mapped), the group itself for an IPv6 one.
func MGID(group netip.Addr) (netip.Addr, error) {
	g := group.Unmap()
	if !g.IsMulticast() {
		return netip.Addr{}, fmt.Errorf("cm: %v is not an IP multicast group", group)
	}
	if g.Is4() {
		return netip.AddrFrom16(g.As16()), nil
	}
	return g, nil
}

// JoinMulticast joins the UD QP q to the IP multicast group on q's
// device, as rdma_join_multicast does on RoCE, and returns what sending
// to the group takes. q must be active with Q_Key UDPQKey (what
// rdma_create_qp gives a UDP port space QP), unless the join is
// send-only; pd makes the group's address handle. An IPv6 group is
// joined too (its MGID is the address itself), which goes beyond the
// Linux kernel: its RoCEv2 join refuses IPv6 groups (EOPNOTSUPP), so an
// rxe peer reaches one only through ibv_attach_mcast.
func (m *Manager) JoinMulticast(pd *rxego.PD, q *rxego.QP, group netip.Addr, opts *JoinOptions) (*Membership, error) {
	var o JoinOptions
	if opts != nil {
		o = *opts
	}
	mgid, err := MGID(group)
	if err != nil {
		return nil, err
	}
	g := group.Unmap()
	if pd == nil || q == nil {
		return nil, errors.New("cm: JoinMulticast needs a PD and a QP")
	}
	if q.Type() != rxego.UD {
		return nil, fmt.Errorf("cm: QP %d is %v: only UD QPs join multicast groups", q.Num(), q.Type())
	}
	if k := q.Query().QKey; !o.SendOnly && k != UDPQKey {
		return nil, fmt.Errorf("cm: QP %d has Q_Key %#x; rdma_cm's multicast groups use %#x (cm.UDPQKey): activate it with that Q_Key", q.Num(), k, UDPQKey)
	}
	sgid, err := m.sourceGID(g, o.Source)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	key := mcastKey{q, g}
	if _, ok := m.joins[key]; ok {
		return nil, fmt.Errorf("%w: QP %d, %v", ErrJoined, q.Num(), g)
	}
	var ah *rxego.AH
	if o.Source.IsValid() {
		ah, err = pd.CreateAHFrom(sgid, netip.AddrPortFrom(g, 0))
	} else {
		ah, err = pd.CreateAH(netip.AddrPortFrom(g, 0))
	}
	if err != nil {
		return nil, err
	}
	if !o.SendOnly {
		if err := q.AttachMcast(mgid); err != nil {
			return nil, err
		}
	}
	ms := &Membership{Group: g, MGID: mgid, QPN: rxego.MulticastQPN, QKey: UDPQKey, AH: ah, SendOnly: o.SendOnly, m: m, q: q}
	if m.joins == nil {
		m.joins = map[mcastKey]*Membership{}
	}
	m.joins[key] = ms
	m.stats.mcastJoins.Add(1)
	return ms, nil
}

// mcastKey names one QP's join of one group.
type mcastKey struct {
	q     *rxego.QP
	group netip.Addr
}

// sourceGID returns the index of the device GID a join of group g sends
// from: src's, or the first of g's family.
func (m *Manager) sourceGID(g, src netip.Addr) (int, error) {
	src = src.Unmap()
	for i, a := range m.dev.GIDs() {
		ga := a.Addr().Unmap()
		if src.IsValid() && ga == src || !src.IsValid() && ga.Is4() == g.Is4() {
			if ga.Is4() != g.Is4() {
				return 0, fmt.Errorf("cm: source %v is %s; group %v is %s", src, family(src), g, family(g))
			}
			return i, nil
		}
	}
	if src.IsValid() {
		return 0, fmt.Errorf("cm: source %v is none of the device's GIDs", src)
	}
	return 0, fmt.Errorf("cm: the device has no %s GID to join %v from", family(g), g)
}

// family names a's address family.
func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// Leave leaves the group (rdma_leave_multicast): the QP is detached, and
// the device leaves the IP group when no other QP of it is attached.
// Leaving twice fails with ErrClosed.
func (ms *Membership) Leave() error {
	m := ms.m
	m.mu.Lock()
	defer m.mu.Unlock()
	key := mcastKey{ms.q, ms.Group}
	if m.joins[key] != ms {
		return ErrClosed
	}
	delete(m.joins, key)
	return ms.leaveLocked()
}

// leaveLocked detaches the QP; m.mu is held.
func (ms *Membership) leaveLocked() error {
	ms.m.stats.mcastLeaves.Add(1)
	if ms.SendOnly {
		return nil
	}
	return ms.q.DetachMcast(ms.MGID)
}

// leaveAllLocked leaves every group joined through m, as rdma_destroy_id
// does; m.mu is held.
func (m *Manager) leaveAllLocked() {
	for k, ms := range m.joins {
		delete(m.joins, k)
		ms.leaveLocked()
	}
}
