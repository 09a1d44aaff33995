package device

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// Routing by source GID. A device's GID table is the addresses it serves,
// in order: Open's address at index 0, then the further ones. Each has its
// own socket group (one socket per shard on its address, port 4791); the
// shards' engines serve every GID, and a packet leaves from the GID its QP
// chose (SetRoute: a connection's or an AH's source GID index), else from
// the first GID of the peer's address family. The choice is made where
// packets leave the engine (shardOut.Emit), by the peer's address and the
// packet's destination QP: see routeTable.

// listenGIDs opens a socket group of n on every GID: the first GID's
// Conns, and per further GID its own.
func listenGIDs(gids []netip.AddrPort, opts transport.Options, n int) ([]transport.Conn, [][]transport.Conn, error) {
	var groups [][]transport.Conn
	for _, g := range gids {
		cs, err := transport.ListenGroup(g, opts, n)
		if err != nil {
			for _, done := range groups {
				for _, c := range done {
					c.Close()
				}
			}
			return nil, nil, fmt.Errorf("rxego: open %v: %w", g, err)
		}
		groups = append(groups, cs)
	}
	return groups[0], groups[1:], nil
}

// gidsMTU is the port's active MTU over every GID's interface: the
// smallest, since one engine serves them all.
func gidsMTU(gids []netip.AddrPort, own bool) (qp.MTU, error) {
	var m qp.MTU
	for _, g := range gids {
		v, err := activeMTU(g, own)
		if err != nil {
			return 0, err
		}
		if v != 0 && (m == 0 || v < m) {
			m = v
		}
	}
	return m, nil
}

// GIDIndex checks that i indexes the GID table.
func (d *Device) GIDIndex(i int) error {
	if i < 0 || i >= len(d.gids) {
		return fmt.Errorf("rxego: GID index %d: the device has %d GIDs (0..%d)", i, len(d.gids), len(d.gids)-1)
	}
	return nil
}

// routeKey is a peer: its address and the QP number packets to it carry
// (AnyQPN for every QP there, as an AH names).
type routeKey struct {
	peer netip.AddrPort
	qpn  uint32
}

// AnyQPN is the QP number of an AH's route: beyond the 24-bit QPNs.
const AnyQPN = 1 << 24

// routeTable maps peers to the GID index their packets leave from. A
// route set for a QP (a connection, QP.SetSourceGID) goes when the last
// QP that set it is destroyed; an AH's route (AnyQPN) stays. Emit takes
// the read lock once per batch of packets, and connections change the map
// in place, so neither copies the table.
type routeTable struct {
	mu sync.RWMutex
	m  map[routeKey]int
	// refs counts the QPs that set each QP route, and byQP has the
	// routes each QP set.
	refs map[routeKey]int
	byQP map[*qp.QP][]routeKey
}

// SetRoute makes packets to QP qpn at peer (AnyQPN: to every QP there)
// leave from GID i, for QP q (nil for an AH). An AH's route may not
// change while it stands: two AHs to one peer from different GIDs would
// make that peer's datagrams ambiguous.
func (d *Device) SetRoute(peer netip.AddrPort, qpn uint32, i int, q *qp.QP) error {
	k := routeKey{peer, qpn}
	if err := d.GIDIndex(i); err != nil {
		return err
	}
	if len(d.gids) == 1 {
		return nil // one GID: nothing to choose, as before GID tables
	}
	if g := d.gids[i].Addr(); g.Is4() != k.peer.Addr().Is4() {
		return fmt.Errorf("rxego: GID %d (%v) is %s and cannot reach %v", i, g, family(g), k.peer.Addr())
	}
	t := &d.routes
	t.mu.Lock()
	defer t.mu.Unlock()
	if j, ok := t.m[k]; ok && k.qpn == AnyQPN && j != i {
		return fmt.Errorf("rxego: peer %v already has an address handle from GID %d; rxego sends to one peer from one GID", k.peer, j)
	}
	if t.m == nil {
		t.m, t.refs, t.byQP = make(map[routeKey]int), make(map[routeKey]int), make(map[*qp.QP][]routeKey)
	}
	t.m[k] = i
	if q != nil && !slices.Contains(t.byQP[q], k) {
		t.byQP[q] = append(t.byQP[q], k)
		t.refs[k]++
	}
	return nil
}

// ForgetQP drops the routes q set that no other QP set: q is being
// destroyed.
func (d *Device) ForgetQP(q *qp.QP) {
	t := &d.routes
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range t.byQP[q] {
		if t.refs[k]--; t.refs[k] == 0 {
			delete(t.refs, k)
			delete(t.m, k)
		}
	}
	delete(t.byQP, q)
}

// family names a's address family.
func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// route returns the GID index a packet to peer for QP qpn leaves from.
// The caller holds d.routes.mu for reading.
func (d *Device) route(peer netip.AddrPort, qpn uint32) int {
	m := d.routes.m
	if i, ok := m[routeKey{peer, qpn}]; ok {
		return i
	}
	if i, ok := m[routeKey{peer, AnyQPN}]; ok {
		return i
	}
	v4 := peer.Addr().Is4()
	for i, g := range d.gids {
		if g.Addr().Is4() == v4 {
			return i
		}
	}
	return 0
}
