package pingpong

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/rxego/rxego/internal/testaddr"
)

// TestLoopback runs every kind between two rxego endpoints on loopback,
// with verification on: this checks the exchange and the message loop;
// the conformance suite checks them against the real tools.
func TestLoopback(t *testing.T) {
	for _, k := range []Kind{RC, UC, UD, SRQ} {
		t.Run(string(k), func(t *testing.T) {
			srvAddr, cliAddr := testaddr.Loopback(), testaddr.Loopback()
			ln, err := net.Listen("tcp", netip.AddrPortFrom(srvAddr, 0).String())
			if err != nil {
				t.Fatal(err)
			}
			port := ln.Addr().(*net.TCPAddr).Port
			size := 5000
			if k == UD {
				size = 1000
			}
			var sout, cout bytes.Buffer
			errc := make(chan error, 1)
			go func() {
				_, err := Run(context.Background(), Config{Kind: k, Local: srvAddr, Listener: ln,
					Size: size, Iters: 200, Verify: true, Out: &sout, NumQP: 4, RxDepth: 64})
				errc <- err
			}()
			res, err := Run(context.Background(), Config{Kind: k, Local: cliAddr, Server: srvAddr.String(),
				TCPPort: port, Size: size, Iters: 200, Verify: true, Out: &cout, NumQP: 4, RxDepth: 64})
			if err != nil {
				t.Fatalf("client: %v\n%s", err, cout.String())
			}
			if err := <-errc; err != nil {
				t.Fatalf("server: %v\n%s", err, sout.String())
			}
			if res.Iters != 200 || res.Mismatches != 0 {
				t.Fatalf("result %+v", res)
			}
			if !bytes.Contains(cout.Bytes(), []byte("iters in")) {
				t.Fatalf("no result line:\n%s", cout.String())
			}
		})
	}
}
