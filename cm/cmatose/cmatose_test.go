package cmatose

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego/cm/internal/cmtest"
)

// TestServeDial runs rxego's ucmatose server against its client with
// several connections: every message arrives and the echoes match.
func TestServeDial(t *testing.T) {
	srv, cli := cmtest.Pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := srv.Listen(DefaultPort)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		r   Result
		err error
	}
	done := make(chan result, 1)
	cfg := Config{Connections: 4, Count: 10, Size: 300}
	go func() {
		r, err := Serve(ctx, srv, l, cfg)
		done <- result{r, err}
	}()
	res, err := Dial(ctx, cli, netip.AddrPortFrom(cmtest.ServerAddr, DefaultPort), cfg)
	if err != nil || res != (Result{Connections: 4, Sent: 40, Received: 40, Verified: 40}) {
		t.Fatalf("client: %+v %v", res, err)
	}
	s := <-done
	if s.err != nil || s.r != (Result{Connections: 4, Sent: 40, Received: 40, Verified: 40}) {
		t.Fatalf("server: %+v %v", s.r, s.err)
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
