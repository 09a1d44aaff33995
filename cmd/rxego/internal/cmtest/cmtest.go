// Package cmtest gives the tests of cm's peer packages two rxego devices
// with connection managers on an in-memory network.
package cmtest

import (
	"context"
	"net/netip"
	"testing"
	"time"

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

// ServeDial runs a peer package's two roles with configuration cfg on a
// fresh Pair: listen opens the server's listener on port, serve serves
// it in a goroutine, and dial connects the client to the server's port,
// both under one 20-second context. It returns both results once both
// have ended.
func ServeDial[L, C, R any](t *testing.T, port uint16, cfg C, listen func(m *cm.Manager, port uint16) (L, error),
	serve func(ctx context.Context, m *cm.Manager, l L, cfg C) (R, error),
	dial func(ctx context.Context, m *cm.Manager, raddr netip.AddrPort, cfg C) (R, error)) (srv R, srvErr error, cli R, cliErr error) {
	t.Helper()
	s, c := Pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := listen(s, port)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv, srvErr = serve(ctx, s, l, cfg)
	}()
	cli, cliErr = dial(ctx, c, netip.AddrPortFrom(ServerAddr, port), cfg)
	<-done
	return srv, srvErr, cli, cliErr
}
