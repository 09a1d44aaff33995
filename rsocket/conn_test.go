package rsocket

import (
	"net"
	"testing"

	"golang.org/x/net/nettest"
)

func TestNettest(t *testing.T) {
	p := newPair(t, nil)
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		cli, srv := p.connect(t, nil, nil)
		return cli, srv, func() { cli.Close(); srv.Close() }, nil
	})
}
