package rsocket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"

	"github.com/rxego/rxego/cm"
)

// cmParams are the connection parameters rsocket asks for (rs_do_connect):
// flow control, 7 transport retries, RNR retries forever; rsocket relies
// on RNR NAKs for its control messages, which take no credits.
func cmParams(priv []byte) *cm.Params {
	seven := uint8(7)
	return &cm.Params{PrivateData: priv, FlowControl: true, RetryCount: &seven, RNRRetry: &seven}
}

// resolve turns host:port into an address of the device's family.
func resolve(ctx context.Context, m *cm.Manager, addr string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return netip.AddrPort{}, err
	}
	p, err := net.LookupPort("tcp", port)
	if err != nil {
		return netip.AddrPort{}, err
	}
	want4 := m.Device().Addr().Addr().Unmap().Is4()
	if host == "" {
		return netip.AddrPortFrom(m.Device().Addr().Addr().Unmap(), uint16(p)), nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return netip.AddrPortFrom(ip.Unmap(), uint16(p)), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	for _, ip := range ips {
		if ip.Unmap().Is4() == want4 {
			return netip.AddrPortFrom(ip.Unmap(), uint16(p)), nil
		}
	}
	return netip.AddrPort{}, fmt.Errorf("rsocket: %s has no address of the device's family", host)
}

// Dial connects to the rsocket listener at addr (host:port, the rdma_cm
// port in the TCP port space) through m's device.
func Dial(m *cm.Manager, addr string, cfg *Config) (*Conn, error) {
	return DialContext(context.Background(), m, addr, cfg)
}

// DialContext is Dial with a context bounding the connection setup.
func DialContext(ctx context.Context, m *cm.Manager, addr string, cfg *Config) (*Conn, error) {
	o, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	raddr, err := resolve(ctx, m, addr)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "rsocket", Err: err}
	}
	c, err := newConn(m, o)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "rsocket", Addr: Addr{raddr}, Err: err}
	}
	cmc, err := m.Dial(ctx, raddr, c.q, cmParams(c.connData().marshal()))
	if err != nil {
		c.release()
		return nil, &net.OpError{Op: "dial", Net: "rsocket", Addr: Addr{raddr}, Err: err}
	}
	peer, err := parseConnData(cmc.PrivateData())
	if err != nil {
		dctx, cancel := context.WithTimeout(context.Background(), closeWait)
		cmc.Disconnect(dctx)
		cancel()
		c.release()
		return nil, &net.OpError{Op: "dial", Net: "rsocket", Addr: Addr{raddr}, Err: err}
	}
	c.start(cmc, peer)
	return c, nil
}

// Listener accepts rsocket connections on one rdma_cm port. It
// implements net.Listener.
type Listener struct {
	m      *cm.Manager
	l      *cm.Listener
	mu     sync.Mutex
	cfg    Config // guarded by mu
	addr   Addr
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
}

// Listen listens on addr (":port", or the device's address and a port; port
// 0 picks a free one) of m's device. Accepted connections get cfg's
// resources.
func Listen(m *cm.Manager, addr string, cfg *Config) (*Listener, error) {
	o, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ap, err := resolve(context.Background(), m, addr)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: "rsocket", Err: err}
	}
	local := m.Device().Addr().Addr().Unmap()
	if ip := ap.Addr(); !ip.IsUnspecified() && ip != local {
		return nil, &net.OpError{Op: "listen", Net: "rsocket", Addr: Addr{ap},
			Err: fmt.Errorf("rsocket: %v is not the device's address %v", ip, local)}
	}
	var l *cm.Listener
	port := ap.Port()
	for try := 0; ; try++ {
		if ap.Port() == 0 {
			port = uint16(32768 + rand.IntN(28232))
		}
		l, err = m.Listen(port)
		if err == nil || ap.Port() != 0 || !errors.Is(err, cm.ErrInUse) || try == 100 {
			break
		}
	}
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: "rsocket", Addr: Addr{ap}, Err: err}
	}
	ln := &Listener{m: m, l: l, cfg: o, addr: Addr{netip.AddrPortFrom(local, port)}}
	ln.ctx, ln.cancel = context.WithCancel(context.Background())
	return ln, nil
}

// Accept waits for the next connection and returns it (a *Conn). A
// request that is no rsocket's is rejected and not returned.
func (ln *Listener) Accept() (net.Conn, error) { return ln.AcceptRsocket() }

// AcceptRsocket is Accept returning the *Conn.
func (ln *Listener) AcceptRsocket() (*Conn, error) {
	for {
		req, err := ln.l.Accept(ln.ctx)
		if err != nil {
			if ln.ctx.Err() != nil {
				err = net.ErrClosed
			}
			return nil, &net.OpError{Op: "accept", Net: "rsocket", Addr: ln.addr, Err: err}
		}
		peer, err := parseConnData(req.PrivateData)
		if err != nil {
			req.Reject(nil)
			continue
		}
		ln.mu.Lock()
		cfg := ln.cfg
		ln.mu.Unlock()
		c, err := newConn(ln.m, cfg)
		if err != nil {
			req.Reject(nil)
			return nil, &net.OpError{Op: "accept", Net: "rsocket", Addr: ln.addr, Err: err}
		}
		cmc, err := req.Accept(ln.ctx, c.q, cmParams(c.connData().marshal()))
		if err != nil {
			c.release()
			if ln.ctx.Err() != nil {
				return nil, &net.OpError{Op: "accept", Net: "rsocket", Addr: ln.addr, Err: net.ErrClosed}
			}
			continue // the initiator went away; serve the next
		}
		c.start(cmc, peer)
		return c, nil
	}
}

// Close stops listening; a blocked Accept returns net.ErrClosed.
// Connections accepted stay up.
func (ln *Listener) Close() error {
	err := error(net.ErrClosed)
	ln.once.Do(func() {
		ln.cancel()
		err = ln.l.Close()
	})
	if err != nil {
		return &net.OpError{Op: "close", Net: "rsocket", Addr: ln.addr, Err: err}
	}
	return nil
}

// SetConfig sets the resources of the connections accepted from now on,
// as rsocket's options set on a listening socket are inherited.
func (ln *Listener) SetConfig(cfg *Config) error {
	o, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	ln.mu.Lock()
	ln.cfg = o
	ln.mu.Unlock()
	return nil
}

// Addr returns the listening address.
func (ln *Listener) Addr() net.Addr { return ln.addr }
