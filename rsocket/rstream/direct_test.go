//go:build !race

// The receiver of direct placement watches its buffer for the bytes the
// engine's RDMA WRITE puts there, as riostream does; the race detector
// counts that as a race by design, so these tests run without it.

package rstream

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/rsocket"
	"github.com/rxego/rxego/transport"
)

func manager(t *testing.T, n *transport.PipeNetwork, addr string) *cm.Manager {
	c, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), transport.Port), transport.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := rxego.Open(addr, &rxego.Options{Conn: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	m, err := cm.New(dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestDirect runs riostream's custom test, verified, between two rxego
// rsockets with iomap entries, as riostream sets them (RDMA_IOMAPSIZE 1).
func TestDirect(t *testing.T) {
	n := transport.NewPipeNetwork()
	srvM, cliM := manager(t, n, "10.1.0.1"), manager(t, n, "10.1.0.2")
	rcfg := &rsocket.Config{IOMapSize: 1}
	ln, err := rsocket.Listen(srvM, ":0", rcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := Config{Custom: true, Size: 50_000, Count: 10, Iterations: 5, Verify: true, Direct: true}
	var sout, cout bytes.Buffer
	done := make(chan error, 1)
	go func() {
		scfg := cfg
		scfg.Out = &sout
		done <- Run(ctx, false, func(context.Context, bool) (net.Conn, error) { return ln.Accept() }, scfg)
	}()
	cfg.Out = &cout
	cerr := Run(ctx, true, func(ctx context.Context, _ bool) (net.Conn, error) {
		return rsocket.DialContext(ctx, cliM, ln.Addr().String(), rcfg)
	}, cfg)
	serr := <-done
	if cerr != nil || serr != nil {
		t.Fatalf("client %v, server %v", cerr, serr)
	}
	for _, out := range []string{cout.String(), sout.String()} {
		if !strings.HasPrefix(out, "custom    48k     10      5       4.7m    ") {
			t.Errorf("row %q", out)
		}
	}
}
