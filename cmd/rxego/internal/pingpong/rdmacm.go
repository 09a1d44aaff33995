package pingpong

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
)

// With Config.RDMACM the QPs connect with rdma_cm (package cm) instead of
// the C tools' TCP exchange: the server listens on the rdma_cm port of the
// same number as the TCP port and accepts one connection per QP, in order;
// the client dials once per QP (again while the server does not listen
// yet). The ping-pong that follows is the same. The C tools themselves
// have no rdma_cm mode, so the peer is another rxego (or any rdma_cm
// application that connects one RC QP per connection and ping-pongs SENDs
// the same way).

// CMListening starts the line an RDMACM server prints once it listens.
const CMListening = "rxego: rdma_cm listening on "

// checkRDMACM checks what RDMACM needs.
func (c *Config) checkRDMACM() error {
	if c.Kind != RC && c.Kind != SRQ {
		return fmt.Errorf("pingpong: rdma_cm connects RC QPs (kinds rc and srq), not %s", c.Kind)
	}
	if c.TCPPort > 0xffff {
		return fmt.Errorf("pingpong: rdma_cm port %d", c.TCPPort)
	}
	return nil
}

// connectCM connects every QP with rdma_cm; a client posts its receives
// once connected (a rejected attempt would have flushed them).
func (c *conn) connectCM(ctx context.Context) error {
	cfg := c.cfg
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	m, err := cm.New(c.dev, cfg.CMConfig)
	if err != nil {
		return err
	}
	c.cm = m
	mtu, _ := rxego.MTUFromBytes(cfg.MTU)
	p := &cm.Params{MTU: mtu, MinRNRTimer: 12}
	port := uint16(cfg.TCPPort)
	if cfg.Server == "" {
		l, err := m.Listen(port)
		if err != nil {
			return err
		}
		defer l.Close()
		fmt.Fprintf(cfg.Out, "%s%v\n", CMListening, netip.AddrPortFrom(c.dev.Addr().Addr(), port))
		for _, q := range c.qps {
			req, err := l.Accept(ctx)
			if err != nil {
				return fmt.Errorf("pingpong: waiting for a connection: %w", err)
			}
			conn, err := req.Accept(ctx, q, p)
			if err != nil {
				return err
			}
			c.conns = append(c.conns, conn)
		}
	} else {
		server, err := netip.ParseAddr(cfg.Server)
		if err != nil {
			return fmt.Errorf("pingpong: rdma_cm needs the server's address: %w", err)
		}
		for _, q := range c.qps {
			conn, err := m.DialRetry(ctx, netip.AddrPortFrom(server.Unmap(), port), q, p, cm.DefaultDialRetry, nil)
			if err != nil {
				return err
			}
			c.conns = append(c.conns, conn)
		}
		if err := c.postRecvs(); err != nil {
			return err
		}
	}
	for _, conn := range c.conns {
		fmt.Fprintf(cfg.Out, "  rdma_cm: QPN 0x%06x connected, local %v, remote %v\n", conn.QP().Num(), conn.LocalAddr(), conn.RemoteAddr())
	}
	return nil
}

// closeCM disconnects at the end. The server hangs up first: its loop
// ends last, once its final replies are acknowledged (with several QPs it
// may send replies the client no longer waits for, and a client that
// disconnected first would leave them unacknowledged). The client gives it
// cm.DefaultHangUpGrace; then the manager stops.
func (c *conn) closeCM() error {
	if c.cm == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), cm.DefaultHangUpWait)
	defer cancel()
	peerFirst := cm.DefaultHangUpGrace
	if c.cfg.Server == "" {
		peerFirst = 0
	}
	err := cm.HangUp(ctx, c.conns, peerFirst)
	return errors.Join(err, c.cm.Close())
}
