// Package reliability_test proves rxego's reliability and hardening end to
// end: the public API (package rxego) over the real transport (UDP sockets
// on loopback, or veth pairs in private network namespaces), with faults
// from the transport's seeded impairment shim, from nftables, and from
// packets the tests craft by hand. docs/reliability.md tabulates what each
// test tried and what came out.
package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
	"github.com/rxego/rxego/transport/impair"
)

// allAccess is every remote right.
const allAccess = rxego.AccessLocalWrite | rxego.AccessRemoteWrite | rxego.AccessRemoteRead | rxego.AccessRemoteAtomic

// addrSeq hands out loopback address pairs no other test package uses
// (127.77.0.0/16 and up), so tests of several packages running at once
// never compete for a port.
var addrSeq atomic.Uint32

// nextLoopback returns two fresh IPv4 loopback addresses on port 4791.
func nextLoopback() (netip.AddrPort, netip.AddrPort) {
	n := addrSeq.Add(1)
	hi, lo := byte(77+n/250), byte(n%250)
	a := netip.AddrFrom4([4]byte{127, hi, lo, 1})
	b := netip.AddrFrom4([4]byte{127, hi, lo, 2})
	return netip.AddrPortFrom(a, transport.Port), netip.AddrPortFrom(b, transport.Port)
}

// listen opens a transport Conn on addr, trying the next fresh address (or
// port, for IPv6) when another process holds it.
func listen(t testing.TB, addr netip.AddrPort, opts transport.Options) transport.Conn {
	t.Helper()
	for range 32 {
		c, err := transport.Listen(addr, opts)
		if err == nil {
			return c
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatal(err)
		}
		if addr.Addr().Is6() {
			addr = netip.AddrPortFrom(addr.Addr(), addr.Port()+1)
		} else {
			next, _ := nextLoopback()
			addr = netip.AddrPortFrom(next.Addr(), addr.Port())
		}
	}
	t.Fatalf("no free address near %v", addr)
	return nil
}

// end is one side of a test connection: a device, its PD, CQs, one QP and
// one registered buffer.
type end struct {
	dev   *rxego.Device
	pd    *rxego.PD
	scq   *rxego.CQ // send completions
	rcq   *rxego.CQ // receive completions
	qp    *rxego.QP
	mr    *rxego.MR
	buf   []byte
	imp   *impair.Conn   // nil without impairments
	inner transport.Conn // the socket under the impairment shim
}

// endConfig describes one end.
type endConfig struct {
	addr   netip.AddrPort
	opts   transport.Options
	conn   transport.Conn // already open (e.g. in a namespace); addr and opts are then unused
	impair *impair.Config // nil: none
	size   int            // registered buffer bytes
	depth  int            // send queue and CQ depth
	rdepth int            // receive queue depth (0: depth)
	window int            // engine window (0: default)
	stall  time.Duration  // rxego.Options.RetryStallTime (0: default)
}

// openEnd opens a device on c.addr with an RC QP in RESET.
func openEnd(t testing.TB, c endConfig) *end {
	t.Helper()
	conn := c.conn
	if conn == nil {
		conn = listen(t, c.addr, c.opts)
	}
	e := &end{inner: conn}
	if c.impair != nil {
		e.imp = impair.Wrap(conn, *c.impair)
		conn = e.imp
	}
	dev, err := rxego.Open(conn.LocalAddr().String(), &rxego.Options{Conn: conn, Window: c.window, RetryStallTime: c.stall})
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	e.dev = dev
	e.pd, _ = dev.AllocPD()
	depth := max(c.depth, 16)
	rdepth := depth
	if c.rdepth > 0 {
		rdepth = c.rdepth
	}
	if e.scq, err = dev.CreateCQ(depth); err != nil {
		t.Fatal(err)
	}
	if e.rcq, err = dev.CreateCQ(rdepth); err != nil {
		t.Fatal(err)
	}
	e.qp, err = e.pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: e.scq, RecvCQ: e.rcq,
		Caps: rxego.Caps{MaxSendWR: depth, MaxRecvWR: rdepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	e.buf = make([]byte, max(c.size, 64))
	if e.mr, err = e.pd.RegMR(e.buf, allAccess); err != nil {
		t.Fatal(err)
	}
	return e
}

// connect joins a and b with RC QPs using o (MaxRdAtomic applies both ways).
func connect(t testing.TB, a, b *end, o rxego.ConnectOptions) {
	t.Helper()
	oa, ob := o, o
	oa.LocalPSN, ob.LocalPSN = 0xfffff0, 0x123 // a's PSNs wrap during the run
	if err := a.qp.Connect(rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qp.Num(), PSN: ob.LocalPSN}, &oa); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(rxego.RemoteQP{Addr: a.dev.Addr(), QPN: a.qp.Num(), PSN: oa.LocalPSN}, &ob); err != nil {
		t.Fatal(err)
	}
}

// sge is the SGE of n bytes at offset off of e's buffer.
func (e *end) sge(off, n int) []rxego.SGE {
	return []rxego.SGE{{Addr: e.mr.IOVA() + uint64(off), Length: uint32(n), LKey: e.mr.LKey()}}
}

// addr is the IOVA of offset off in e's buffer.
func (e *end) addr(off int) uint64 { return e.mr.IOVA() + uint64(off) }

// aligned8 returns the first offset at or after off whose IOVA is 8-byte
// aligned.
func (e *end) aligned8(off int) int {
	return off + int((8-(e.addr(off)%8))%8)
}

// pollN polls cq until n completions arrived or the deadline passed, and
// checks each with check.
func pollN(t testing.TB, cq *rxego.CQ, n int, timeout time.Duration, check func(i int, wc rxego.WC)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	wcs := make([]rxego.WC, 64)
	for got := 0; got < n; {
		k, err := cq.PollWait(ctx, wcs[:min(len(wcs), n-got)])
		if err != nil {
			t.Fatalf("after %d of %d completions: %v", got, n, err)
		}
		for _, wc := range wcs[:k] {
			check(got, wc)
			got++
		}
	}
}

// stats formats what is worth logging about an end.
func (e *end) stats() string {
	s := e.dev.Stats()
	var drops []string
	for _, r := range qp.DropReasons() {
		if n := s.Drops[r]; n > 0 {
			drops = append(drops, fmt.Sprintf("%v=%d", r, n))
		}
	}
	ts := e.dev.Transport().Stats()
	var tdrops []string
	for r := transport.DropReason(0); r < transport.NumDropReasons; r++ {
		if ts.Drops[r] > 0 {
			tdrops = append(tdrops, fmt.Sprintf("%v=%d", r, ts.Drops[r]))
		}
	}
	out := fmt.Sprintf("sent=%d rcvd=%d retrans=%d retries=%d seqNAKrcvd=%d dupReq=%d oosReq=%d engine-drops=%v transport-drops=%v",
		s.SentPkts, s.RcvdPkts, s.Retransmits, s.CompleterRetryErr, s.RcvdSeqErr,
		s.DuplicateRequest, s.OutOfSeqRequest, drops, tdrops)
	if e.imp != nil {
		is := e.imp.ImpairStats()
		out += fmt.Sprintf(" impair-recv=%+v impair-send=%+v", is.Recv, is.Send)
	}
	return out
}

// ciOrSkip skips a test that needs what the machine lacks, unless CI=true
// says the environment must provide it.
func ciOrSkip(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}
