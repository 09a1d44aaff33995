package cmatose

import (
	"context"
	"net/netip"
	"testing"

	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cm/internal/cmtest"
)

// TestServeDial runs rxego's ucmatose server against its client with
// several connections: every message arrives and the echoes match.
func TestServeDial(t *testing.T) {
	cfg := Config{Connections: 4, Count: 10, Size: 300}
	srv, serr, cli, cerr := cmtest.ServeDial(t, func(m *cm.Manager) (func(context.Context) (Result, error), error) {
		l, err := m.Listen(DefaultPort)
		return func(ctx context.Context) (Result, error) { return Serve(ctx, m, l, cfg) }, err
	}, func(ctx context.Context, m *cm.Manager) (Result, error) {
		return Dial(ctx, m, netip.AddrPortFrom(cmtest.ServerAddr, DefaultPort), cfg)
	})
	want := Result{Connections: 4, Sent: 40, Received: 40, Verified: 40}
	if cerr != nil || cli != want {
		t.Fatalf("client: %+v %v", cli, cerr)
	}
	if serr != nil || srv != want {
		t.Fatalf("server: %+v %v", srv, serr)
	}
}

// TestConfig refuses out-of-range settings.
func TestConfig(t *testing.T) {
	for _, c := range []Config{{Connections: -1}, {Count: maxCount + 1}, {Size: -1}} {
		if err := c.Check(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if err := (Config{}).Check(); err != nil {
		t.Errorf("defaults refused: %v", err)
	}
}
