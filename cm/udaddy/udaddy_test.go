package udaddy

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego/cm/internal/burst"
	"github.com/rxego/rxego/cm/internal/cmtest"
)

// TestServeDial runs rxego's udaddy server against its client with
// several UD "connections": every datagram arrives both ways and every
// reply carries the client's message after the server's GRH, as
// udaddy's echo does.
func TestServeDial(t *testing.T) {
	srv, cli := cmtest.Pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := srv.ListenUD(DefaultPort)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		r   Result
		err error
	}
	done := make(chan result, 1)
	cfg := Config{Connections: 3, Count: 10, Size: 300}
	go func() {
		r, err := Serve(ctx, srv, l, cfg)
		done <- result{r, err}
	}()
	res, err := Dial(ctx, cli, netip.AddrPortFrom(cmtest.ServerAddr, DefaultPort), cfg)
	if err != nil || res != (Result{Connections: 3, Sent: 30, Received: 30, Verified: 30}) {
		t.Fatalf("client: %+v %v", res, err)
	}
	s := <-done
	if s.err != nil || s.r != (Result{Connections: 3, Sent: 30, Received: 30}) {
		t.Fatalf("server: %+v %v", s.r, s.err)
	}
}

// TestConfig refuses out-of-range settings.
func TestConfig(t *testing.T) {
	for _, c := range []Config{{Connections: -1}, {Count: burst.MaxCount + 1}, {Size: -1}, {Size: 5000}} {
		if _, err := withDefaults(c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
