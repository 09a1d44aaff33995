package pingpong

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/rxego/rxego/cm"
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

// TestLoopbackRDMACM runs rc and srq with rdma_cm connecting the QPs (one
// connection per QP) instead of the TCP exchange, verification on, and
// checks both sides' connections ended.
func TestLoopbackRDMACM(t *testing.T) {
	for _, k := range []Kind{RC, SRQ} {
		t.Run(string(k), func(t *testing.T) {
			srvAddr, cliAddr := testaddr.Loopback(), testaddr.Loopback()
			// A REQ sent before the server's device opened is lost: retry
			// after about 0.6 s rather than rdma_cm's 4.6 s.
			fast := &cm.Config{ResponseTimeout: 14}
			base := Config{Kind: k, TCPPort: 7000 + rand.N(1000), Size: 3000, Iters: 100, Verify: true,
				NumQP: 3, RxDepth: 32, RDMACM: true, CMConfig: fast}
			srv, cli := base, base
			var sout, cout bytes.Buffer
			srv.Local, srv.Out = srvAddr, &sout
			cli.Local, cli.Server, cli.Out = cliAddr, srvAddr.String(), &cout
			errc := make(chan error, 1)
			go func() {
				_, err := Run(context.Background(), srv)
				errc <- err
			}()
			res, err := Run(context.Background(), cli)
			if err != nil {
				t.Fatalf("client: %v\n%s", err, cout.String())
			}
			if err := <-errc; err != nil {
				t.Fatalf("server: %v\n%s", err, sout.String())
			}
			if res.Iters != 100 || res.Mismatches != 0 {
				t.Fatalf("result %+v", res)
			}
			wantConns := 1
			if k == SRQ {
				wantConns = 3
			}
			for side, out := range map[string]string{"server": sout.String(), "client": cout.String()} {
				if n := strings.Count(out, "rdma_cm: QPN"); n != wantConns {
					t.Errorf("%s: %d rdma_cm connections, want %d:\n%s", side, n, wantConns, out)
				}
			}
			if !strings.Contains(sout.String(), CMListening) {
				t.Errorf("server did not say it listens:\n%s", sout.String())
			}
		})
	}
}

// TestRDMACMKinds: rdma_cm mode refuses the kinds it cannot connect.
func TestRDMACMKinds(t *testing.T) {
	for _, k := range []Kind{UC, UD} {
		c := Config{Kind: k, Local: testaddr.Loopback(), RDMACM: true}
		if err := c.defaults(); err == nil {
			t.Errorf("%s accepted with rdma_cm", k)
		}
	}
}
