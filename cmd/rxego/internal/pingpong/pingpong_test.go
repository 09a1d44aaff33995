package pingpong

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/internal/testenv/testaddr"
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

// TestSRQCompletionOrder checks the receive side of SRQ verification as
// ibv_srq_pingpong with several QPs exercises it: receive completions
// come in the order the QPs consume the shared queue, not the posting
// order, so each names its slot in its wr_id; and the tool echoes from one
// buffer all its QPs receive into, so an echo of a two-packet message may
// hold one packet of each of two of our messages, or be torn inside a
// packet.
func TestSRQCompletionOrder(t *testing.T) {
	cfg := Config{Kind: SRQ, Size: 2048, MTU: 1024, RxDepth: 4, NumQP: 8, Verify: true, Local: testaddr.Loopback()}
	if err := cfg.defaults(); err != nil {
		t.Fatal(err)
	}
	c := &conn{cfg: &cfg, slot: cfg.Size, buf: make([]byte, 5*cfg.Size), history: make([][]byte, 4)}
	for i := cfg.RxDepth - 1; i >= 0; i-- {
		c.free = append(c.free, i)
	}
	a, b := make([]byte, cfg.Size), make([]byte, cfg.Size)
	pattern(a, 1)
	pattern(b, 2)
	c.history[0], c.history[1] = a, b
	slot := func(i int) []byte { return c.buf[i*c.slot : (i+1)*c.slot] }
	copy(slot(2), a)
	copy(slot(0), b[:1024])
	copy(slot(0)[1024:], a[1024:]) // torn: B's first packet, A's second
	copy(slot(3), a[:1500])
	copy(slot(3)[1500:], b[1500:]) // torn inside a packet (a copy racing a send)
	slot(1)[5] ^= 0xff             // neither
	wc := func(i int) rxego.WC { return rxego.WC{ID: uint64(i)<<wrKindBits | recvWRID, ByteLen: uint32(cfg.Size)} }
	c.free = c.free[:0] // all four posted
	for _, i := range []int{2, 0, 3} {
		c.checkRecv(wc(i))
	}
	if c.mismatch != 0 {
		t.Fatalf("%d mismatches for an intact and a torn echo", c.mismatch)
	}
	c.checkRecv(wc(1))
	if c.mismatch != 1 {
		t.Fatalf("a corrupted message: %d mismatches, want 1", c.mismatch)
	}
	if want := []int{2, 0, 3, 1}; !slices.Equal(c.free, want) {
		t.Fatalf("free slots %v, want %v", c.free, want)
	}
}

// TestLimits checks sizes, counts and depths before anything is
// allocated.
func TestLimits(t *testing.T) {
	l := testaddr.Loopback()
	for _, bad := range []Config{
		{Local: l, Size: 99999999999}, {Local: l, Size: -1}, {Local: l, Iters: -5}, {Local: l, RxDepth: maxRxDepth + 1},
		{Local: l, Kind: SRQ, NumQP: 257}, {Local: l, Size: 1 << 20, RxDepth: 2000}, {Local: l, TCPPort: 70000},
		{Local: l, Kind: UD, Size: 2048}, {Local: l, MTU: 1500},
	} {
		if err := bad.Check(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	c := Config{Local: l, Kind: UD, MTU: 512}
	if err := c.defaults(); err != nil || c.Size != 512 {
		t.Errorf("ud at MTU 512: size %d, %v", c.Size, err)
	}
}

// TestCheckedFirst: the first message of ibv_rc_pingpong -c (the fill
// byte with each page's first byte zeroed) passes the check, for one
// page or several, and a message that differs anywhere else does not.
func TestCheckedFirst(t *testing.T) {
	for _, size := range []int{1, 100, 4096, 3*4096 + 5} {
		msg := bytes.Repeat([]byte{fillByte}, size)
		for i := 0; i < size; i += 4096 {
			msg[i] = 0
		}
		if !checkedFirst(msg, fillByte) {
			t.Fatalf("size %d: the -c client's first message rejected", size)
		}
		if size > 4096 {
			bad := bytes.Clone(msg)
			bad[4096] = fillByte // a page start not zeroed
			if checkedFirst(bad, fillByte) {
				t.Fatalf("size %d: a page start left at the fill accepted", size)
			}
		}
		bad := bytes.Clone(msg)
		bad[size-1] ^= 1
		if size > 1 && checkedFirst(bad, fillByte) {
			t.Fatalf("size %d: a changed byte accepted", size)
		}
	}
	if checkedFirst(bytes.Repeat([]byte{fillByte}, 64), fillByte) {
		t.Fatal("the plain fill passes as the -c message (it has its own check)")
	}
}

// TestPatternPageStarts: rxego's messages keep the first byte of every
// 4 KiB page 0, as ibv_rc_pingpong -c checks in what it receives, and
// still describe themselves (consistent), at every size; a changed byte
// anywhere is caught where the message is longer than what describes it
// (up to 9 bytes any seq is a pattern).
func TestPatternPageStarts(t *testing.T) {
	for _, size := range []int{8, 9, 100, 4096, 4097, 3*4096 + 1} {
		b := make([]byte, size)
		pattern(b, 77)
		if !consistent(b) {
			t.Fatalf("size %d: rxego's own pattern not consistent", size)
		}
		for i := 0; size > 8 && i < size; i += 4096 {
			if b[i] != 0 {
				t.Fatalf("size %d: byte %d is %#x, want 0 (a page start)", size, i, b[i])
			}
		}
		for _, i := range []int{0, size / 2, size - 1} {
			if size <= 9 {
				break
			}
			c := bytes.Clone(b)
			c[i] ^= 0x40
			if consistent(c) {
				t.Fatalf("size %d: byte %d changed, still consistent", size, i)
			}
		}
	}
}
