package rping

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cmd/rxego/internal/cmtest"
	"github.com/rxego/rxego/transport"
)

// TestFillPing matches rping's pattern: the text, then letters from
// 'A'+n cycling through 'A'..'z', NUL at the end.
func TestFillPing(t *testing.T) {
	b := make([]byte, 30)
	FillPing(b, 1)
	if want := "rdma-ping-1: BCDEFGHIJKLMNOPQ\x00"; string(b) != want {
		t.Errorf("%q, want %q", b, want)
	}
	b = make([]byte, 80)
	FillPing(b, 57)
	if !strings.HasPrefix(string(b), "rdma-ping-57: z") || b[15] != 'A' || b[79] != 0 {
		t.Errorf("%q", b)
	}
}

// served is what a background Serve returned.
type served struct {
	r   Result
	err error
}

// serveInBackground listens on srv at DefaultPort and serves one client
// there with cfg from a goroutine; the channel gets what Serve returned.
func serveInBackground(t *testing.T, ctx context.Context, srv *cm.Manager, cfg Config) <-chan served {
	t.Helper()
	l, err := srv.Listen(DefaultPort)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan served, 1)
	go func() {
		r, err := Serve(ctx, srv, l, cfg)
		done <- served{r, err}
	}()
	return done
}

// TestServeDial pings rxego's server with rxego's client: every ping is
// checked on both sides.
func TestServeDial(t *testing.T) {
	srv, cli := cmtest.Pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	done := serveInBackground(t, ctx, srv, Config{Verbose: true, Out: &out})
	res, err := Dial(ctx, cli, netip.AddrPortFrom(cmtest.ServerAddr, DefaultPort), Config{Size: 100, Count: 5, Validate: true})
	if err != nil || res.Pings != 5 || res.Verified != 5 {
		t.Fatalf("client: %+v %v", res, err)
	}
	s := <-done
	if s.err != nil || s.r.Pings != 5 || s.r.Verified != 5 {
		t.Fatalf("server: %+v %v", s.r, s.err)
	}
	if !strings.Contains(out.String(), "server ping data: rdma-ping-4: EFGH") {
		t.Errorf("server output:\n%s", out.String())
	}
}

// TestDialNoServer: nobody listens; the REJ ends the client.
func TestDialNoServer(t *testing.T) {
	_, cli := cmtest.Pair(t)
	_, err := Dial(context.Background(), cli, netip.AddrPortFrom(cmtest.ServerAddr, DefaultPort), Config{Count: 1})
	if err == nil || !strings.Contains(err.Error(), "reason 8") {
		t.Fatalf("dial: %v", err)
	}
	if _, err := Dial(context.Background(), cli, netip.AddrPortFrom(cmtest.ServerAddr, 1), Config{Size: MaxSize + 1}); err == nil {
		t.Error("size over the limit")
	}
}

// TestEndless: Count 0 pings until ctx ends, which is a normal end.
func TestEndless(t *testing.T) {
	srv, cli := cmtest.Pair(t)
	l, _ := srv.Listen(1)
	sctx, scancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer scancel()
	go Serve(sctx, srv, l, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	res, err := Dial(ctx, cli, netip.AddrPortFrom(cmtest.ServerAddr, 1), Config{Validate: true})
	if err != nil || res.Pings == 0 || res.Verified != res.Pings {
		t.Fatalf("%+v %v", res, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
}

// TestServeSkipsHalfOpen: the first REQ comes from an initiator whose RTU
// never arrives (as from a forged source). The server's only slot is
// given back after the half-open timeout and the next client is served.
func TestServeSkipsHalfOpen(t *testing.T) {
	n := transport.NewPipeNetwork()
	scfg := cmtest.FastConfig()
	scfg.HalfOpenTimeout = 100 * time.Millisecond
	srv := cmtest.Node(t, n, cmtest.ServerAddr, scfg)
	cli := cmtest.Node(t, n, cmtest.ClientAddr, cmtest.FastConfig())
	gcfg := cmtest.FastConfig()
	gcfg.DropMAD = func(out bool, h cm.Header) bool { return out && h.AttrID == cm.AttrRTU }
	ghost := cmtest.Node(t, n, netip.MustParseAddr("127.0.0.3"), gcfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := serveInBackground(t, ctx, srv, Config{})
	gp, err := newPeer(ghost.Device(), 64, 64)
	if err != nil {
		t.Fatal(err)
	}
	gctx, gcancel := context.WithTimeout(ctx, time.Second)
	defer gcancel()
	go ghost.Dial(gctx, netip.AddrPortFrom(cmtest.ServerAddr, DefaultPort), gp.q, nil)
	for srv.Counters()["cm_rcvd_req"] == 0 { // the ghost's REQ is first
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	res, err := Dial(ctx, cli, netip.AddrPortFrom(cmtest.ServerAddr, DefaultPort), Config{Size: 100, Count: 3, Validate: true})
	if err != nil || res.Verified != 3 {
		t.Fatalf("client: %+v %v", res, err)
	}
	if s := <-done; s.err != nil || s.r.Verified != 3 {
		t.Fatalf("server: %+v %v, want 3 pings verified", s.r, s.err)
	}
	if got := srv.Counters()["cm_half_open"]; got != 1 {
		t.Errorf("cm_half_open %d, want 1", got)
	}
	t.Logf("client served %v after the half-open REQ", time.Since(start))
}

// TestMinSize: rping's smallest size, 23, works from rxego's client to
// rxego's server (the ping number and its letters fill it exactly), and
// one byte less is refused with the range named, changing nothing.
func TestMinSize(t *testing.T) {
	srv, cli := cmtest.Pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := serveInBackground(t, ctx, srv, Config{})
	to := netip.AddrPortFrom(cmtest.ServerAddr, DefaultPort)
	if _, err := Dial(ctx, cli, to, Config{Size: MinSize - 1, Count: 1}); err == nil || !strings.Contains(err.Error(), "outside 23..") {
		t.Fatalf("size 22: %v, want a range error", err)
	}
	res, err := Dial(ctx, cli, to, Config{Size: MinSize, Count: 3, Validate: true})
	if err != nil || res.Verified != 3 {
		t.Fatalf("size 23: %+v %v", res, err)
	}
	if s := <-done; s.err != nil {
		t.Fatalf("server: %v", s.err)
	}
}
