package harness

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// The yardsticks of the multi-QP rows: N TCP streams and N raw UDP
// GSO/GRO flows between the same two processes, each flow on its own
// goroutine and sockets, the bytes of all of them counted over one
// measured interval (Case.QPs is N).

// flowCounter sums what N receiving goroutines take in while the
// interval is on.
type flowCounter struct {
	on    atomic.Bool
	bytes atomic.Uint64
	msgs  atomic.Uint64
}

// measure runs the server's window over a timed interval while the flows
// count, and fills res.
func (f *flowCounter) measure(p *peer) Result {
	time.Sleep(p.c.Warmup)
	p.markStart()
	start := time.Now()
	f.on.Store(true)
	time.Sleep(p.c.Duration)
	f.on.Store(false)
	return Result{Elapsed: time.Since(start), CPU: p.cpu(), Bytes: f.bytes.Load(), Msgs: f.msgs.Load()}
}

type multiHello struct{ Addrs []string }

// tcpBWN: the client writes on N connections as fast as it can; the
// server reads them all and counts the bytes of the measured interval.
func tcpBWN(p *peer) (Result, error) {
	n := p.c.QPs
	if p.server {
		ln, err := net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
		if err != nil {
			return Result{}, err
		}
		defer ln.Close()
		if err := p.ctl.send(multiHello{[]string{ln.Addr().String()}}); err != nil {
			return Result{}, err
		}
		ln.SetDeadline(time.Now().Add(acceptTimeout))
		var f flowCounter
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for range n {
			c, err := ln.Accept()
			if err != nil {
				return Result{}, err
			}
			conns = append(conns, c)
			go func() {
				buf := make([]byte, tcpChunk)
				for {
					k, err := c.Read(buf)
					if err != nil {
						return
					}
					if f.on.Load() {
						f.bytes.Add(uint64(k))
					}
				}
			}()
		}
		res := f.measure(p)
		if res.Bytes == 0 {
			return res, errors.New("no data arrived")
		}
		return res, p.ctl.send(signal{"stop"})
	}
	var h multiHello
	if err := p.ctl.recv(&h); err != nil || len(h.Addrs) != 1 {
		return Result{}, errors.Join(err, errors.New("bad hello"))
	}
	stop := p.ctl.watch()
	var wg sync.WaitGroup
	for range n {
		c, err := net.DialTimeout("tcp", h.Addrs[0], acceptTimeout)
		if err != nil {
			return Result{}, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			buf := make([]byte, tcpChunk)
			for !stop.stop.Load() {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
	<-stop.ended
	wg.Wait()
	return Result{CPU: stop.cpu()}, nil
}

// udpBWN: N raw UDP flows in c.Mode (gso: 64 KiB GSO sends, GRO on
// receive), each its own socket pair and goroutine on both sides.
func udpBWN(p *peer) (Result, error) {
	c := p.c
	socks := make([]*udpSock, c.QPs)
	for i := range socks {
		s, err := newUDPSock()
		if err != nil {
			return Result{}, err
		}
		defer s.conn.Close()
		socks[i] = s
	}
	if p.server {
		var h multiHello
		for _, s := range socks {
			h.Addrs = append(h.Addrs, s.addr().String())
		}
		if err := p.ctl.send(h); err != nil {
			return Result{}, err
		}
		var f flowCounter
		var closing atomic.Bool
		errs := make(chan error, len(socks))
		for _, s := range socks {
			go func() {
				s.conn.SetReadDeadline(time.Now().Add(caseTimeout(c)))
				errs <- udpRecvLoop(c, s, func(b []byte) {
					if crcOK(b) && f.on.Load() {
						f.msgs.Add(1)
						f.bytes.Add(uint64(len(b)))
					}
				}, closing.Load)
			}()
		}
		res := f.measure(p)
		closing.Store(true)
		if err := p.ctl.send(signal{"stop"}); err != nil {
			return res, err
		}
		// A receiver that failed stopped counting: the figure would be
		// that of the flows still running, so the case fails instead.
		select {
		case err := <-errs:
			if err != nil {
				return res, fmt.Errorf("a receiving flow stopped: %w", err)
			}
		default:
		}
		if res.Msgs == 0 {
			return res, errors.New("no datagram arrived")
		}
		return res, nil
	}
	var h multiHello
	if err := p.ctl.recv(&h); err != nil || len(h.Addrs) != len(socks) {
		return Result{}, errors.Join(err, errors.New("bad hello"))
	}
	stop := p.ctl.watch()
	errs := make(chan error, len(socks))
	for i, s := range socks {
		dst, err := netip.ParseAddrPort(h.Addrs[i])
		if err != nil {
			return Result{}, err
		}
		go func() { errs <- udpSendLoop(c, s, dst, stop.stop.Load) }()
	}
	<-stop.ended
	for range socks {
		if err := <-errs; err != nil {
			return Result{}, err
		}
	}
	return Result{CPU: stop.cpu()}, nil
}
