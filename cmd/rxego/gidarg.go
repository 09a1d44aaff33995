package main

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"

	"github.com/rxego/rxego"
)

// gidSel is pingpong's -g or perf's -x, read by gidArg.
type gidSel struct {
	addr   netip.Addr   // the address to serve on; invalid when none is known
	index  int          // the GID index given (as rxe numbers -d's table), or -1
	ifname string       // -d
	table  []netip.Addr // -d's GID table as rxe's (rxego.InterfaceGIDs), with an index
}

// gidTableUsage is pingpong's and perf's --gid-table.
const gidTableUsage = "with -d IF and a GID index, serve IF's whole GID table as rxe's device does (the index typed is then the device's own) " +
	"rather than only that entry: this process then holds port 4791 on every address of IF, which no other rxego process on IF can then use"

// gidArg reads pingpong's -g or perf's -x: an address, or a GID index as
// the C tools take (ibv_rc_pingpong -d rxe0 -g 1). An index names an entry
// of the table rxe would have on the network interface given with -d
// (rxego.InterfaceGIDs: 0 link-local, 1 the IPv4 address, then IPv6
// ones); the device then serves that entry's address, or, with
// wholeTable (--gid-table), the whole table (gidSel.open). Serving one
// address is the default because an rxego process is a device of its
// own: one that held every address of the interface would lock out every
// other rxego process there, where rxe's one device serves them all. An
// index with no -d leaves addr invalid, which the caller treats as before
// (pingpong: needs --addr; perf: the exchange's address).
func gidArg(flagName, sel, ifname string, wholeTable bool) (gidSel, error) {
	s := gidSel{index: -1, ifname: ifname}
	if sel == "" {
		return s, nil
	}
	n, err := strconv.Atoi(sel)
	if err != nil {
		a, err := netip.ParseAddr(sel)
		if err != nil {
			return s, usageErrorf("-%s %q: neither an address nor a GID index", flagName, sel)
		}
		s.addr = a.Unmap()
		return s, nil
	}
	s.index = n
	if ifname == "" {
		return s, nil
	}
	gids, err := rxego.InterfaceGIDs(ifname)
	if err != nil {
		return s, usageErrorf("-%s %d -d %s: %v (rxego's -d names the network interface rxe would sit on)", flagName, n, ifname, err)
	}
	if n < 0 || n >= len(gids) {
		return s, usageErrorf("-%s %d: no such GID index on %s (its table, as rxe's: %s)", flagName, n, ifname, gidList(gids, nil))
	}
	s.addr = gids[n]
	if wholeTable {
		s.table = gids
	}
	return s, nil
}

// gidList formats a GID table as "0 ADDR, 1 ADDR, ..."; idx gives each
// entry's index (nil: its position).
func gidList(gids []netip.Addr, idx []int) string {
	var tab []string
	for i, g := range gids {
		if idx != nil {
			i = idx[i]
		}
		tab = append(tab, fmt.Sprintf("%d %v", i, g))
	}
	return strings.Join(tab, ", ")
}

// maxDeviceGIDs is the most GIDs rxego.Open takes (Options.GIDs and
// Open's address together).
const maxDeviceGIDs = 16

// open opens the device of a run given -d IF with a GID index: it serves
// IF's whole GID table as rxe's would, in rxe's order (Open's address is
// its index 0, the rest Options.GIDs), so that the index the user typed
// is the device's own (QueryGID, SGIDIndex). An address that cannot be
// bound on port 4791 (a link-local one the interface does not hold, a
// tentative or deprecated IPv6 address, the port taken) is left out with
// a line on log; the entries after it then move down one, and the line
// says where the chosen one went. It returns the device and the device's
// index of the chosen GID. who prefixes the log lines.
func (s gidSel) open(log io.Writer, who string, opts rxego.Options) (*rxego.Device, int, error) {
	var (
		serve []netip.Addr
		rxe   []int // rxe's index of each entry of serve
		mine  = -1  // the device's index of the chosen GID
	)
	for i, g := range s.table {
		if len(serve) == maxDeviceGIDs && i != s.index {
			fmt.Fprintf(log, "%s: -d %s: GID index %d (%v) not served: rxego serves at most %d GIDs\n", who, s.ifname, i, g, maxDeviceGIDs)
			continue
		}
		if err := probeBind(g); err != nil {
			if i == s.index {
				return nil, 0, fmt.Errorf("GID index %d of %s (%v) cannot be served: %v", i, s.ifname, g, err)
			}
			fmt.Fprintf(log, "%s: -d %s: GID index %d (%v) not served: %v\n", who, s.ifname, i, g, err)
			continue
		}
		if len(serve) == maxDeviceGIDs { // the chosen one takes the last place
			fmt.Fprintf(log, "%s: -d %s: GID index %d (%v) not served: rxego serves at most %d GIDs\n", who, s.ifname, rxe[len(rxe)-1], serve[len(serve)-1], maxDeviceGIDs)
			serve, rxe = serve[:len(serve)-1], rxe[:len(rxe)-1]
		}
		if i == s.index {
			mine = len(serve)
		}
		serve, rxe = append(serve, g), append(rxe, i)
	}
	for _, g := range serve[1:] {
		opts.GIDs = append(opts.GIDs, netip.AddrPortFrom(g, rxego.DefaultPort).String())
	}
	dev, err := rxego.Open(netip.AddrPortFrom(serve[0], rxego.DefaultPort).String(), &opts)
	if err != nil {
		return nil, 0, err
	}
	idx := make([]int, len(serve))
	for i := range idx {
		idx[i] = i
	}
	fmt.Fprintf(log, "%s: device on %s serves GIDs %s; source GID index %d\n", who, s.ifname, gidList(serve, idx), mine)
	if mine != s.index {
		fmt.Fprintf(log, "%s: -d %s: rxe's GID index %d is this device's index %d (rxe's indexes of the GIDs served: %v)\n", who, s.ifname, s.index, mine, rxe)
	}
	return dev, mine, nil
}

// probeBind tells whether a device can bind a's port 4791 now. It holds
// syscall.ForkLock (for reading) while its socket is open: a child forked
// meanwhile would keep a copy bound until its exec, and the device's bind
// right after could fail (see transport's checkFree).
func probeBind(a netip.Addr) error {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, rxego.DefaultPort)))
	if err != nil {
		if oe, ok := err.(*net.OpError); ok {
			return oe.Err
		}
		return err
	}
	return c.Close()
}
