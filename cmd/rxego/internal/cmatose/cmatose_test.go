package cmatose

import (
	"strings"
	"testing"

	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cmd/rxego/internal/cmtest"
)

// TestServeDial runs rxego's ucmatose server against its client with
// several connections: every message arrives and the echoes match.
func TestServeDial(t *testing.T) {
	cfg := Config{Connections: 4, Count: 10, Size: 300}
	srv, serr, cli, cerr := cmtest.ServeDial(t, DefaultPort, cfg, (*cm.Manager).Listen, Serve, Dial)
	want := Result{Connections: 4, Sent: 40, Received: 40, Verified: 40}
	if cerr != nil || cli != want {
		t.Fatalf("client: %+v %v", cli, cerr)
	}
	if serr != nil || srv != want {
		t.Fatalf("server: %+v %v", srv, serr)
	}
}

// TestConfig: messages up to 1 MiB (ucmatose's limit is its memory);
// the other limits are package exchange's.
func TestConfig(t *testing.T) {
	if err := Tool.Check(Config{Size: 1 << 20}); err != nil {
		t.Errorf("1 MiB refused: %v", err)
	}
	if err := Tool.Check(Config{Size: 1<<20 + 1}); err == nil || !strings.HasPrefix(err.Error(), "cmatose: ") {
		t.Errorf("1 MiB + 1: %v", err)
	}
}
