package main

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/rxego/rxego"
)

// gidArg reads pingpong's -g or perf's -x: an address, or a GID index as
// the C tools take (ibv_rc_pingpong -d rxe0 -g 1). An index names an entry
// of the table rxe would have on the network interface given with -d
// (rxego.InterfaceGIDs: 0 link-local, 1 the IPv4 address, then IPv6
// ones). It returns the invalid Addr and isIndex true for an index with
// no -d, which the caller treats as before (pingpong: needs --addr; perf:
// the exchange's address).
func gidArg(flagName, sel, ifname string) (a netip.Addr, isIndex bool, err error) {
	if sel == "" {
		return netip.Addr{}, false, nil
	}
	n, err := strconv.Atoi(sel)
	if err != nil {
		a, err := netip.ParseAddr(sel)
		if err != nil {
			return netip.Addr{}, false, usageErrorf("-%s %q: neither an address nor a GID index", flagName, sel)
		}
		return a.Unmap(), false, nil
	}
	if ifname == "" {
		return netip.Addr{}, true, nil
	}
	gids, err := rxego.InterfaceGIDs(ifname)
	if err != nil {
		return netip.Addr{}, true, usageErrorf("-%s %d -d %s: %v (rxego's -d names the network interface rxe would sit on)", flagName, n, ifname, err)
	}
	if n < 0 || n >= len(gids) {
		var tab []string
		for i, g := range gids {
			tab = append(tab, fmt.Sprintf("%d %v", i, g))
		}
		return netip.Addr{}, true, usageErrorf("-%s %d: no such GID index on %s (its table, as rxe's: %s)", flagName, n, ifname, strings.Join(tab, ", "))
	}
	return gids[n], true, nil
}
