package udaddy

import (
	"strings"
	"testing"

	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cmd/rxego/internal/cmtest"
)

// TestServeDial runs rxego's udaddy server against its client with
// several UD "connections": every datagram arrives both ways and every
// reply carries the client's message after the server's GRH, as
// udaddy's echo does.
func TestServeDial(t *testing.T) {
	cfg := Config{Connections: 3, Count: 10, Size: 300}
	srv, serr, cli, cerr := cmtest.ServeDial(t, DefaultPort, cfg, (*cm.Manager).ListenUD, Serve, Dial)
	if cerr != nil || cli != (Result{Connections: 3, Sent: 30, Received: 30, Verified: 30}) {
		t.Fatalf("client: %+v %v", cli, cerr)
	}
	if serr != nil || srv != (Result{Connections: 3, Sent: 30, Received: 30}) {
		t.Fatalf("server: %+v %v", srv, serr)
	}
}

// TestConfig: datagrams up to 4096 bytes (the largest RoCE MTU); the
// other limits are package exchange's.
func TestConfig(t *testing.T) {
	if err := Tool.Check(Config{Size: 4097}); err == nil || !strings.Contains(err.Error(), "udaddy: ") {
		t.Errorf("4097 bytes: %v", err)
	}
	if err := Tool.Check(Config{Size: 4096, Connections: 2}); err != nil {
		t.Errorf("4096 bytes refused: %v", err)
	}
}
