package job

import (
	"context"
	"net"
	"time"
)

// The TCP baselines' connections: n of them between two ranks, set up
// before the measured part starts.

// Accept takes n connections from ln, giving up when ctx ends.
func Accept(ctx context.Context, ln net.Listener, n int) ([]net.Conn, error) {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var conns []net.Conn
	for range n {
		c, err := ln.Accept()
		if err != nil {
			CloseAll(conns)
			return nil, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// Dial opens n connections to addr.
func Dial(ctx context.Context, addr string, n int) ([]net.Conn, error) {
	var d net.Dialer
	var conns []net.Conn
	for range n {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			CloseAll(conns)
			return nil, err
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// CloseAll closes conns.
func CloseAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// Deadline makes every conn's reads and writes fail once ctx ends, so a
// goroutine blocked on one notices; call the returned stop when done.
func Deadline(ctx context.Context, conns []net.Conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() {
		for _, c := range conns {
			c.SetDeadline(time.Now())
		}
	})
}
