//go:build !linux

package transport

import (
	"errors"
	"net/netip"
)

// Listen needs Linux: UDP GSO/GRO, sendmmsg/recvmmsg and the IP ID
// behaviour the ICRCs rely on were only established there. Tests elsewhere
// can use NewPipeNetwork.
func Listen(local netip.AddrPort, opts Options) (Conn, error) {
	return nil, errors.New("transport: UDP Conns need Linux; use NewPipeNetwork in tests")
}

// MaxGroup is the most Conns ListenGroup opens on one address.
const MaxGroup = 64

// ListenGroup needs Linux, as Listen does.
func ListenGroup(local netip.AddrPort, opts Options, n int) ([]Conn, error) {
	return nil, errors.New("transport: UDP Conns need Linux; use NewPipeNetwork in tests")
}

// ListenMulticast needs Linux, as Listen does.
func ListenMulticast(group netip.AddrPort, iface netip.Addr, opts Options) (Conn, error) {
	return nil, errors.New("transport: UDP Conns need Linux")
}
