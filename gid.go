package rxego

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// A device's GID table is the addresses it serves, in order: Open's
// address at index 0, then Options.GIDs. Each has its own socket group
// (one socket per shard on its address, port 4791); the shards' engines
// serve every GID, and a packet leaves from the GID its QP chose:
//
//   - an RC or UC QP connected with QP.Connect, RemoteQP.SGIDIndex (the
//     sgid_index of ibv_ah_attr's GRH);
//   - a UD send, the SGIDIndex of the AH (CreateAHFrom);
//   - a QP moved by hand with QP.Modify, the index SetSourceGID gave;
//   - anything else (the connection manager's replies), the first GID of
//     the peer's address family.
//
// The choice is made where packets leave the engine, by the peer's
// address and QP number (internal/device's route.go).

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
func (d *Device) gidIndex(i int) error { return d.dev.GIDIndex(i) }

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
