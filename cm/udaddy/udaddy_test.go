package udaddy

import (
	"context"
	"net/netip"
	"testing"

	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cm/internal/cmtest"
)

// TestServeDial runs rxego's udaddy server against its client with
// several UD "connections": every datagram arrives both ways and every
// reply carries the client's message after the server's GRH, as
// udaddy's echo does.
func TestServeDial(t *testing.T) {
	cfg := Config{Connections: 3, Count: 10, Size: 300}
	srv, serr, cli, cerr := cmtest.ServeDial(t, func(m *cm.Manager) (func(context.Context) (Result, error), error) {
		l, err := m.ListenUD(DefaultPort)
		return func(ctx context.Context) (Result, error) { return Serve(ctx, m, l, cfg) }, err
	}, func(ctx context.Context, m *cm.Manager) (Result, error) {
		return Dial(ctx, m, netip.AddrPortFrom(cmtest.ServerAddr, DefaultPort), cfg)
	})
	if cerr != nil || cli != (Result{Connections: 3, Sent: 30, Received: 30, Verified: 30}) {
		t.Fatalf("client: %+v %v", cli, cerr)
	}
	if serr != nil || srv != (Result{Connections: 3, Sent: 30, Received: 30}) {
		t.Fatalf("server: %+v %v", srv, serr)
	}
}

// TestConfig refuses out-of-range settings.
func TestConfig(t *testing.T) {
	for _, c := range []Config{{Connections: -1}, {Count: maxCount + 1}, {Size: -1}, {Size: 5000}} {
		if err := c.Check(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
