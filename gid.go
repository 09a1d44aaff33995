package rxego

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// A device's GID table is the addresses it serves, in order: Open's
// address at index 0, then Options.GIDs. Each has its own socket group
// (one socket per shard on its address, port 4791); the shards' engines
// serve every GID, and a packet leaves from the GID its QP chose:
//
//   - an RC or UC QP connected with ConnectRC, RemoteQP.SGIDIndex (the
//     sgid_index of ibv_ah_attr's GRH);
//   - a UD send, the SGIDIndex of the AH (CreateAHFrom);
//   - a QP moved by hand with QP.Modify, the index SetSourceGID gave;
//   - anything else (the connection manager's replies), the first GID of
//     the peer's address family.
//
// The choice is made where packets leave the engine (shardOut.Emit), by
// the peer's address and QP number: see routeTable.

// gidTable parses the further addresses and returns the table, local
// first. A device on a given Conn has the Conn's one address.
func gidTable(local netip.AddrPort, more []string, conn bool) ([]netip.AddrPort, error) {
	if conn && len(more) > 0 {
		return nil, errors.New("rxego: Options.GIDs cannot be used with Options.Conn")
	}
	gids := []netip.AddrPort{local}
	for _, s := range more {
		a, err := ParseAddr(s)
		if err != nil {
			return nil, err
		}
		for i, g := range gids {
			if g.Addr() == a.Addr() {
				return nil, fmt.Errorf("rxego: GID %v given twice (index %d)", a.Addr(), i)
			}
		}
		gids = append(gids, a)
	}
	if len(gids) > maxGIDs {
		return nil, fmt.Errorf("rxego: %d GIDs (at most %d)", len(gids), maxGIDs)
	}
	return gids, nil
}

// maxGIDs is the largest GID table: rxe's is 1024 entries, but each of
// rxego's costs a socket group.
const maxGIDs = 16

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

// GIDs returns the device's GID table as addresses (IPv4 ones unmapped),
// index order: Options.GIDs after Open's address.
func (d *Device) GIDs() []netip.AddrPort {
	if d == nil {
		return nil
	}
	return append([]netip.AddrPort(nil), d.gids...)
}

// QueryGID returns the GID of index i (ibv_query_gid): an IPv4-mapped
// (::ffff:a.b.c.d) or IPv6 address.
func (d *Device) QueryGID(i int) ([16]byte, error) {
	if err := d.check(); err != nil {
		return [16]byte{}, err
	}
	if err := d.gidIndex(i); err != nil {
		return [16]byte{}, err
	}
	return d.gids[i].Addr().As16(), nil
}

// gidIndex checks that i indexes the GID table.
func (d *Device) gidIndex(i int) error {
	if i < 0 || i >= len(d.gids) {
		return fmt.Errorf("rxego: GID index %d: the device has %d GIDs (0..%d)", i, len(d.gids), len(d.gids)-1)
	}
	return nil
}

// routeKey is a peer: its address and the QP number packets to it carry
// (anyQPN for every QP there, as an AH names).
type routeKey struct {
	peer netip.AddrPort
	qpn  uint32
}

// anyQPN is the QP number of an AH's route: beyond the 24-bit QPNs.
const anyQPN = 1 << 24

// routeTable maps peers to the GID index their packets leave from. A
// route set for a QP (ConnectRC, SetSourceGID) goes when the last QP that
// set it is destroyed; an AH's route (anyQPN) stays. Emit takes the read
// lock once per batch of packets, and connections change the map in
// place, so neither copies the table.
type routeTable struct {
	mu sync.RWMutex
	m  map[routeKey]int
	// refs counts the QPs that set each QP route, and byQP has the
	// routes each QP set.
	refs map[routeKey]int
	byQP map[*qp.QP][]routeKey
}

// setRoute makes packets to k leave from GID i, for QP q (nil for an
// AH). An AH's route (anyQPN) may not change while it stands: two AHs to
// one peer from different GIDs would make that peer's datagrams
// ambiguous.
func (d *Device) setRoute(k routeKey, i int, q *qp.QP) error {
	if err := d.gidIndex(i); err != nil {
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
	if j, ok := t.m[k]; ok && k.qpn == anyQPN && j != i {
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

// forgetQP drops what the device keeps about q, which is being destroyed:
// its entry in qpDevices and the routes no other QP set.
func (d *Device) forgetQP(q *qp.QP) {
	qpDevices.Delete(q)
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
	if i, ok := m[routeKey{peer, anyQPN}]; ok {
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

// qpDevices maps a QP to its device, so that ConnectRC, which takes only
// the QP, finds the routes to set. Entries go when the QP is destroyed
// (forgetQP), or the device closes.
var qpDevices sync.Map // *qp.QP -> *Device

// forgetQPs drops d's entries from qpDevices.
func (d *Device) forgetQPs() {
	qpDevices.Range(func(k, v any) bool {
		if v == d {
			qpDevices.Delete(k)
		}
		return true
	})
}

// connectRoute records that q's packets to remote leave from its
// SGIDIndex.
func connectRoute(q *QP, remote RemoteQP) error {
	v, ok := qpDevices.Load(q)
	if !ok && q.Destroyed() {
		return fmt.Errorf("QP destroyed: %w", ErrClosed)
	}
	if !ok {
		if remote.SGIDIndex != 0 {
			return fmt.Errorf("SGID index %d on a QP of no open device", remote.SGIDIndex)
		}
		return nil
	}
	d := v.(*Device)
	if err := d.setRoute(routeKey{remote.Addr, remote.QPN}, remote.SGIDIndex, q); err != nil {
		return err
	}
	if q.Destroyed() { // destroyed meanwhile, maybe before the route was set
		d.forgetQP(q)
		return fmt.Errorf("QP destroyed: %w", ErrClosed)
	}
	return nil
}

// InterfaceGIDs returns the GID table rxe would have on the network
// interface name, in its order (ib_core's roce_gid_mgmt: the default GID,
// then the interface's IPv4 addresses, then its IPv6 ones; rxe lists
// RoCEv2 entries only): index 0 the link-local fe80::/64 GID made from the
// MAC address (EUI-64; all zeros without one), then every IPv4 address
// (which Device.QueryGID shows as ::ffff:a.b.c.d), then every IPv6 address
// but one equal to index 0. Link-local addresses carry the interface as
// their zone. It tells a tool's "-g 1" which address rxe's index 1 names.
func InterfaceGIDs(name string) ([]netip.Addr, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return nil, fmt.Errorf("rxego: interface %q: %w", name, err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return nil, fmt.Errorf("rxego: addresses of %q: %w", name, err)
	}
	var mac [6]byte
	copy(mac[:], ifc.HardwareAddr)
	def := netip.AddrFrom16([16]byte{0: 0xfe, 1: 0x80, 8: mac[0] ^ 2, 9: mac[1], 10: mac[2], 11: 0xff, 12: 0xfe,
		13: mac[3], 14: mac[4], 15: mac[5]}).WithZone(name)
	gids := []netip.Addr{def}
	var v6 []netip.Addr
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := p.Addr().Unmap()
		switch {
		case ip.Is4():
			gids = append(gids, ip)
		case ip.WithZone(name) == def:
		case ip.IsLinkLocalUnicast():
			v6 = append(v6, ip.WithZone(name))
		default:
			v6 = append(v6, ip)
		}
	}
	return append(gids, v6...), nil
}
