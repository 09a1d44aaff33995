package harness

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/rsocket"
)

func init() {
	runners[RsocketBW] = func(p *peer) (Result, error) { return streamBW(p, rsocketConnect) }
	runners[RsocketPP] = func(p *peer) (Result, error) { return streamPing(p, rsocketConnect) }
}

type rsocketHello struct{ Addr string }

// rsocketConn is an rsocket connection that also closes its side's
// device and connection manager.
type rsocketConn struct {
	*rsocket.Conn
	m   *cm.Manager
	dev *rxego.Device
}

func (c *rsocketConn) Close() error {
	err := c.Conn.Close()
	c.m.Close()
	c.dev.Close()
	return err
}

// rsocketConnect makes the data connection: each side opens an rxego
// device on a loopback address of its own; the server listens and tells
// the client where. rsocket's default buffers (128 KiB each way).
func rsocketConnect(p *peer) (net.Conn, error) {
	dev, err := openDevice(false, p)
	if err != nil {
		return nil, err
	}
	m, err := cm.New(dev, nil)
	if err != nil {
		dev.Close()
		return nil, err
	}
	fail := func(err error) (net.Conn, error) {
		m.Close()
		dev.Close()
		return nil, err
	}
	if p.server {
		ln, err := rsocket.Listen(m, ":0", nil)
		if err != nil {
			return fail(err)
		}
		defer ln.Close()
		if err := p.ctl.send(rsocketHello{ln.Addr().String()}); err != nil {
			return fail(err)
		}
		stop := time.AfterFunc(acceptTimeout, func() { ln.Close() })
		defer stop.Stop()
		c, err := ln.AcceptRsocket()
		if err != nil {
			return fail(err)
		}
		return &rsocketConn{c, m, dev}, nil
	}
	var h rsocketHello
	if err := p.ctl.recv(&h); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), acceptTimeout)
	defer cancel()
	c, err := rsocket.DialContext(ctx, m, h.Addr, nil)
	if err != nil {
		return fail(errors.Join(errors.New("rsocket dial"), err))
	}
	return &rsocketConn{c, m, dev}, nil
}
