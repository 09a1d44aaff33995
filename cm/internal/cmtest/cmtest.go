// Package cmtest gives the tests of cm's peer packages two rxego devices
// with connection managers on an in-memory network.
package cmtest

import (
	"net/netip"
	"testing"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/transport"
)

// Addresses of the two nodes.
var (
	ServerAddr = netip.MustParseAddr("127.0.0.1")
	ClientAddr = netip.MustParseAddr("127.0.0.2")
)

// FastConfig retransmits CM messages within tens of milliseconds.
func FastConfig() *cm.Config {
	return &cm.Config{ResponseTimeout: 13, PacketLifeTime: 10, MaxRetries: 6}
}

// Pair returns a server and a client manager on one in-memory network;
// both close when the test ends.
func Pair(t *testing.T) (srv, cli *cm.Manager) {
	t.Helper()
	n := transport.NewPipeNetwork()
	return Node(t, n, ServerAddr, FastConfig()), Node(t, n, ClientAddr, FastConfig())
}

// Node opens a device at a on n with a manager configured by cfg; both
// close when the test ends.
func Node(t *testing.T, n *transport.PipeNetwork, a netip.Addr, cfg *cm.Config) *cm.Manager {
	t.Helper()
	c, err := n.Listen(netip.AddrPortFrom(a, transport.Port), transport.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := rxego.Open(a.String(), &rxego.Options{Conn: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	m, err := cm.New(dev, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}
