package transport

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// InterfaceMTU returns the MTU of the network interface that holds addr,
// in the calling thread's network namespace, for the port's active MTU
// (rxe takes it from its netdev). A loopback address not assigned
// anywhere (127.0.0.2) belongs to the loopback interface, as the kernel
// routes it there.
func InterfaceMTU(addr netip.Addr) (int, error) {
	addr = addr.Unmap().WithZone("") // a link-local address's zone: the interface's addresses have none
	ifs, err := net.Interfaces()
	if err != nil {
		return 0, fmt.Errorf("transport: interface MTU of %v: %w", addr, err)
	}
	loop := 0
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagLoopback != 0 && loop == 0 {
			loop = ifi.MTU
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if p, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(p.IP); ok && ip.Unmap() == addr {
					return ifi.MTU, nil
				}
			}
		}
	}
	if addr.IsLoopback() && loop > 0 {
		return loop, nil
	}
	return 0, fmt.Errorf("transport: no interface holds %v", addr)
}

// Unsendable reports whether a Send error means the message can never be
// sent as it is, so retransmitting it is pointless: EMSGSIZE, a datagram
// with DF over the interface's MTU. Linux answers so for a GSO run whose
// segments are too long as well (seen on a veth at MTU 576).
func Unsendable(err error) bool { return errors.Is(err, syscall.EMSGSIZE) }
