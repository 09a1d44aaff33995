package rstream

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// pipeRun runs a client and a server over net.Pipe connections.
func pipeRun(t *testing.T, cfg Config, tamper func(net.Conn) net.Conn) (cli, srv string, cerr, serr error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conns := make(chan net.Conn, 2)
	var cb, sb bytes.Buffer
	done := make(chan error, 1)
	scfg := cfg
	scfg.Out = &sb
	go func() {
		done <- Run(ctx, false, func(ctx context.Context, _ bool) (net.Conn, error) {
			select {
			case c := <-conns:
				return c, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}, scfg)
	}()
	ccfg := cfg
	ccfg.Out = &cb
	cerr = Run(ctx, true, func(context.Context, bool) (net.Conn, error) {
		a, b := net.Pipe()
		if tamper != nil {
			a = tamper(a)
		}
		conns <- b
		return a, nil
	}, ccfg)
	serr = <-done
	return cb.String(), sb.String(), cerr, serr
}

func TestCustomVerified(t *testing.T) {
	cli, srv, cerr, serr := pipeRun(t, Config{Custom: true, Size: 3000, Count: 20, Iterations: 2, Verify: true}, nil)
	if cerr != nil || serr != nil {
		t.Fatalf("client %v, server %v", cerr, serr)
	}
	for _, out := range []string{cli, srv} {
		if !strings.HasPrefix(out, "custom    2.9k    20      2       234k    ") {
			t.Errorf("row: %q", out)
		}
	}
}

// corrupter flips one byte of what the client sends, after skip bytes.
type corrupter struct {
	net.Conn
	skip int
}

func (c *corrupter) Write(b []byte) (int, error) {
	if c.skip >= 0 && c.skip < len(b) {
		b = bytes.Clone(b)
		b[c.skip] ^= 0x40
	}
	c.skip -= len(b)
	return c.Conn.Write(b)
}

func TestVerifyCatchesCorruption(t *testing.T) {
	_, srv, _, serr := pipeRun(t, Config{Custom: true, Size: 1000, Count: 5, Verify: true},
		func(c net.Conn) net.Conn { return &corrupter{Conn: c, skip: 16 + 2500} })
	if !errors.Is(serr, ErrVerify) || !strings.Contains(srv, "data verification failed byte 2516\n") {
		t.Fatalf("server: %v\n%s", serr, srv)
	}
}

func TestSizeStr(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{{64, "64"}, {192, "192"}, {1536, "1.5k"}, {4096, "4k"}, {98304, "96k"}, {6 << 20, "6m"}, {3 << 29, "1.5g"}} {
		if got := sizeStr(c.n, 4); got != c.want {
			t.Errorf("sizeStr(%d) = %q, want %q", c.n, got, c.want)
		}
	}
	if cntStr(100000) != "100k" || cntStr(999) != "999" || cntStr(2_000_000) != "2m" {
		t.Error("cntStr")
	}
	var w bytes.Buffer
	Header(&w)
	if w.String() != "name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer\n" {
		t.Errorf("header %q", w.String())
	}
}
