package rsocket

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/transport"
)

// newManager opens a device at addr on the in-memory network, its
// transport passed through wrap when given, with a connection manager.
func newManager(t testing.TB, n *transport.PipeNetwork, addr string, wrap func(transport.Conn) transport.Conn) *cm.Manager {
	t.Helper()
	c, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), transport.Port), transport.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		c = wrap(c)
	}
	dev, err := rxego.Open(addr, &rxego.Options{Conn: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	m, err := cm.New(dev, &cm.Config{ResponseTimeout: 13, PacketLifeTime: 10, MaxRetries: 6})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// pair is two managers on one in-memory network: a server and a client.
type pair struct{ srv, cli *cm.Manager }

func newPair(t testing.TB, wrap func(transport.Conn) transport.Conn) pair {
	n := transport.NewPipeNetwork()
	return pair{newManager(t, n, "10.0.0.1", wrap), newManager(t, n, "10.0.0.2", wrap)}
}

// connect makes one connection: the client's end and the server's.
func (p pair) connect(t testing.TB, scfg, ccfg *Config) (cli, srv *Conn) {
	t.Helper()
	ln, err := Listen(p.srv, ":0", scfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *Conn, 1)
	errs := make(chan error, 1)
	go func() {
		c, err := ln.AcceptRsocket()
		if err != nil {
			errs <- err
			return
		}
		accepted <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cli, err = DialContext(ctx, p.cli, ln.Addr().String(), ccfg)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case srv = <-accepted:
	case err := <-errs:
		t.Fatal(err)
	case <-ctx.Done():
		t.Fatal("accept timed out")
	}
	return cli, srv
}
