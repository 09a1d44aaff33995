package job

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"
)

// The TCP baselines' connections: n of them between two ranks, set up
// before the measured part starts.

// acceptN takes n connections from ln, giving up when ctx ends.
func acceptN(ctx context.Context, ln net.Listener, n int) ([]net.Conn, error) {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var conns []net.Conn
	for range n {
		c, err := ln.Accept()
		if err != nil {
			closeAll(conns)
			return nil, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// dialN opens n connections to addr.
func dialN(ctx context.Context, addr string, n int) ([]net.Conn, error) {
	var d net.Dialer
	var conns []net.Conn
	for range n {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			closeAll(conns)
			return nil, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// closeAll closes conns.
func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// deadline makes every conn's reads and writes fail once ctx ends, so a
// goroutine blocked on one notices; call the returned stop when done.
func deadline(ctx context.Context, conns []net.Conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() {
		for _, c := range conns {
			c.SetDeadline(time.Now())
		}
	})
}

// TCP sets up a TCP baseline's connections before its measured part:
// every rank listens on 127.0.0.1 and the addresses are all-gathered
// (every rank must call TCP at the same point); then this rank opens n
// connections to each rank in dial, and accepts accept connections.
// done closes them all (once, however often it is called); until then they fail once ctx ends, so no
// goroutine stays blocked on one.
func (r *Rank) TCP(ctx context.Context, dial []int, n, accept int) (out, in []net.Conn, done func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, nil, err
	}
	defer ln.Close()
	var addrs []string
	if err := r.AllGather(ln.Addr().String(), &addrs); err != nil {
		return nil, nil, nil, err
	}
	for _, to := range dial {
		if to < 0 || to >= len(addrs) {
			closeAll(out)
			return nil, nil, nil, fmt.Errorf("job: no rank %d to dial", to)
		}
		cs, err := dialN(ctx, addrs[to], n)
		out = append(out, cs...)
		if err != nil {
			closeAll(out)
			return nil, nil, nil, err
		}
	}
	if in, err = acceptN(ctx, ln, accept); err != nil {
		closeAll(out)
		return nil, nil, nil, err
	}
	all := append(append([]net.Conn(nil), out...), in...)
	stop := deadline(ctx, all)
	var once sync.Once
	return out, in, func() { once.Do(func() { stop(); closeAll(all) }) }, nil
}
