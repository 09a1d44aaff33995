package harness

import (
	"errors"
	"net"
	"net/netip"
	"time"
)

func init() {
	runners[TCPBW] = tcpBW
	runners[TCPPing] = func(p *peer) (Result, error) { return streamPing(p, tcpConnect) }
}

// tcpChunk is the bytes per write and read of the TCP stream.
const tcpChunk = 256 << 10

type tcpHello struct{ Addr string }

// tcpConnect makes the data connection: the server listens on loopback
// and tells the client where.
func tcpConnect(p *peer) (net.Conn, error) {
	if p.server {
		ln, err := net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		if err := p.ctl.send(tcpHello{ln.Addr().String()}); err != nil {
			return nil, err
		}
		ln.SetDeadline(time.Now().Add(acceptTimeout))
		return ln.Accept()
	}
	var h tcpHello
	if err := p.ctl.recv(&h); err != nil {
		return nil, err
	}
	return net.DialTimeout("tcp", h.Addr, acceptTimeout)
}

// tcpBW: the client writes as fast as it can; the server counts what it
// reads in the measured interval, then closes the connection.
func tcpBW(p *peer) (Result, error) {
	if p.c.QPs > 1 {
		return tcpBWN(p)
	}
	return streamBW(p, tcpConnect)
}

// streamBW is tcpBW's one stream over the connection connect makes.
func streamBW(p *peer, connect func(*peer) (net.Conn, error)) (Result, error) {
	c := p.c
	conn, err := connect(p)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	buf := make([]byte, tcpChunk)
	if !p.server {
		stop := p.ctl.watch()
		for {
			if _, err := conn.Write(buf); err != nil {
				// The server closes the connection after its "stop".
				for i := 0; i < 100 && !stop.stop.Load(); i++ {
					time.Sleep(10 * time.Millisecond)
				}
				if stop.stop.Load() {
					<-stop.ended
					return Result{CPU: stop.cpu()}, nil
				}
				return Result{}, err
			}
		}
	}
	conn.SetReadDeadline(time.Now().Add(caseTimeout(c)))
	w := p.newWindow()
	var res Result
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return res, err
		}
		now := time.Now()
		measuring, done := w.tick(now)
		if measuring {
			res.Bytes += uint64(n)
		}
		if done {
			res.Elapsed = w.elapsed(now)
			res.CPU = p.cpu()
			break
		}
	}
	if res.Bytes == 0 {
		return res, errors.New("no data arrived")
	}
	return res, p.ctl.send(signal{"stop"})
}

// streamPing: 64-byte ping-pong over one connection connect makes (TCP:
// Nagle off, Go's default), blocking reads.
func streamPing(p *peer, connect func(*peer) (net.Conn, error)) (Result, error) {
	c := p.c
	conn, err := connect(p)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	buf := make([]byte, 64)
	full := func() error {
		for got := 0; got < len(buf); {
			n, err := conn.Read(buf[got:])
			if err != nil {
				return err
			}
			got += n
		}
		return nil
	}
	if p.server {
		for {
			if err := full(); err != nil {
				return Result{}, nil // the client closed: done
			}
			if _, err := conn.Write(buf); err != nil {
				return Result{}, err
			}
		}
	}
	conn.SetDeadline(time.Now().Add(caseTimeout(c)))
	res, err := p.roundTrips(func() error {
		if _, err := conn.Write(buf); err != nil {
			return err
		}
		if err := full(); err != nil {
			return err
		}
		return nil
	})
	return res, err
}
