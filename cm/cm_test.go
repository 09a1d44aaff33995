package cm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/transport"
	"github.com/rxego/rxego/transport/impair"
)

var (
	serverAddr = netip.MustParseAddr("127.0.0.1")
	clientAddr = netip.MustParseAddr("127.0.0.2")
)

// pair is a server and a client node on one in-memory network.
type pair struct {
	srv, cli *node
}

func newPair(t *testing.T, srvCfg, cliCfg *Config, srvWrap, cliWrap func(transport.Conn) transport.Conn) pair {
	n := transport.NewPipeNetwork()
	return pair{newNode(t, n, serverAddr.String(), srvCfg, srvWrap), newNode(t, n, clientAddr.String(), cliCfg, cliWrap)}
}

// connect runs one listener/dialer exchange and returns both ends.
func (p pair) connect(t *testing.T, port uint16, srvEP, cliEP *endpoint, srvParams, cliParams *Params) (srv, cli *Conn) {
	t.Helper()
	ctx := testCtx(t)
	l, err := p.srv.m.Listen(port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	type result struct {
		c   *Conn
		req *Request
		err error
	}
	done := make(chan result, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			done <- result{err: err}
			return
		}
		c, err := req.Accept(ctx, srvEP.q, srvParams)
		done <- result{c, req, err}
	}()
	cli, err = p.cli.m.Dial(ctx, netip.AddrPortFrom(serverAddr, port), cliEP.q, cliParams)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	if r.req.Remote != cli.LocalAddr() || r.req.Local != netip.AddrPortFrom(serverAddr, port) {
		t.Errorf("request from %v to %v; client is %v", r.req.Remote, r.req.Local, cli.LocalAddr())
	}
	return r.c, cli
}

// exchange checks the connected QPs carry data both ways: a SEND each way
// and an RDMA WRITE and READ from the client.
func exchange(t *testing.T, srvEP, cliEP *endpoint) {
	t.Helper()
	msg := []byte("hello over a CM connection")
	srvEP.postRecv(t, 64)
	copy(cliEP.buf[100:], msg)
	if err := cliEP.q.PostSend(rxego.SendWR{ID: 2, Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: cliEP.mr.IOVA() + 100, Length: uint32(len(msg)), LKey: cliEP.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if wc := cliEP.wait(t); wc.Status != rxego.WCSuccess {
		t.Fatalf("client send: %v", wc.Status)
	}
	if wc := srvEP.wait(t); wc.Status != rxego.WCSuccess || wc.Opcode != rxego.WCRecv || !bytes.Equal(srvEP.buf[:wc.ByteLen], msg) {
		t.Fatalf("server recv: %v %v %q", wc.Status, wc.Opcode, srvEP.buf[:wc.ByteLen])
	}
	// WRITE then READ back from the server's buffer.
	copy(cliEP.buf[200:], "written by the client")
	if err := cliEP.q.PostSend(rxego.SendWR{ID: 3, Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
		SGL:        []rxego.SGE{{Addr: cliEP.mr.IOVA() + 200, Length: 21, LKey: cliEP.mr.LKey()}},
		RemoteAddr: srvEP.mr.IOVA() + 300, RKey: srvEP.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := cliEP.wait(t); wc.Status != rxego.WCSuccess {
		t.Fatalf("write: %v", wc.Status)
	}
	if err := cliEP.q.PostSend(rxego.SendWR{ID: 4, Opcode: rxego.WRRead, Flags: rxego.SendSignaled,
		SGL:        []rxego.SGE{{Addr: cliEP.mr.IOVA() + 400, Length: 21, LKey: cliEP.mr.LKey()}},
		RemoteAddr: srvEP.mr.IOVA() + 300, RKey: srvEP.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := cliEP.wait(t); wc.Status != rxego.WCSuccess || string(cliEP.buf[400:421]) != "written by the client" {
		t.Fatalf("read: %v %q", wc.Status, cliEP.buf[400:421])
	}
	// And a SEND back.
	cliEP.postRecv(t, 64)
	copy(srvEP.buf[500:], "reply")
	if err := srvEP.q.PostSend(rxego.SendWR{ID: 5, Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: srvEP.mr.IOVA() + 500, Length: 5, LKey: srvEP.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if wc := srvEP.wait(t); wc.Status != rxego.WCSuccess {
		t.Fatalf("server send: %v", wc.Status)
	}
	if wc := cliEP.wait(t); wc.Status != rxego.WCSuccess || string(cliEP.buf[:wc.ByteLen]) != "reply" {
		t.Fatalf("client recv: %v %q", wc.Status, cliEP.buf[:wc.ByteLen])
	}
}

// counts returns the manager counters named, for compact assertions.
func counts(m *Manager, names ...string) string {
	c := m.Counters()
	var s []string
	for _, n := range names {
		s = append(s, fmt.Sprintf("%s=%d", n, c[n]))
	}
	return fmt.Sprint(s)
}

// TestConnectExchangeDisconnect is the whole life of one connection: REQ,
// REP, RTU with private data both ways, data over the QPs, DREQ and DREP
// tearing down both sides.
func TestConnectExchangeDisconnect(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig(), nil, nil)
	srvEP, cliEP := p.srv.newEndpoint(t, 4096), p.cli.newEndpoint(t, 4096)
	psnS, psnC := uint32(0x123456), uint32(0xfffffe)
	srv, cli := p.connect(t, 7174, srvEP, cliEP,
		&Params{PrivateData: []byte("server says hi"), PSN: &psnS},
		&Params{PrivateData: []byte("client says hi"), PSN: &psnC})
	if got := srv.PrivateData(); len(got) != REQPrivateDataSize-IPHeaderSize || !bytes.HasPrefix(got, []byte("client says hi")) {
		t.Errorf("server got private data %q", got)
	}
	if got := cli.PrivateData(); len(got) != REPPrivateDataSize || !bytes.HasPrefix(got, []byte("server says hi")) {
		t.Errorf("client got private data %q", got)
	}
	sa, ca := srvEP.q.Query(), cliEP.q.Query()
	if sa.State != rxego.StateRTS || ca.State != rxego.StateRTS || sa.DestQPN != cliEP.q.Num() || ca.DestQPN != srvEP.q.Num() {
		t.Fatalf("QPs: server %v -> %d, client %v -> %d", sa.State, sa.DestQPN, ca.State, ca.DestQPN)
	}
	// Each side sends from the PSN the other announced (Linux's CM).
	if sa.SQPSN != psnC || ca.RQPSN != psnC || ca.SQPSN != psnS || sa.RQPSN != psnS {
		t.Errorf("PSNs: server sq %#x rq %#x, client sq %#x rq %#x", sa.SQPSN, sa.RQPSN, ca.SQPSN, ca.RQPSN)
	}
	if sa.PathMTU != rxego.MTU1024 || sa.Timeout != 15 || sa.RetryCnt != 7 || sa.RNRRetry != 7 || sa.MaxDestRdAtomic != 1 {
		t.Errorf("server QP attributes %+v", sa)
	}
	exchange(t, srvEP, cliEP)

	if err := cli.Disconnect(testCtx(t)); err != nil {
		t.Fatalf("disconnect: %v", err)
	}
	waitClosed(t, srv.Done(), "server Done")
	if !errors.Is(srv.Err(), ErrDisconnected) || !errors.Is(cli.Err(), ErrLocalDisconnect) {
		t.Errorf("ends: server %v, client %v", srv.Err(), cli.Err())
	}
	if srvEP.q.State() != rxego.StateErr || cliEP.q.State() != rxego.StateErr {
		t.Errorf("QPs after disconnect: %v %v", srvEP.q.State(), cliEP.q.State())
	}
	if err := srv.Disconnect(testCtx(t)); err != nil {
		t.Errorf("disconnect after the peer's: %v", err)
	}
	for _, c := range []struct {
		m    *Manager
		want string
	}{
		{p.cli.m, "[cm_sent_req=1 cm_rcvd_rep=1 cm_sent_rtu=1 cm_sent_dreq=1 cm_rcvd_drep=1 cm_retransmits=0]"},
		{p.srv.m, "[cm_rcvd_req=1 cm_sent_rep=1 cm_rcvd_rtu=1 cm_rcvd_dreq=1 cm_sent_drep=1 cm_retransmits=0]"},
	} {
		n := []string{"cm_sent_req", "cm_rcvd_rep", "cm_sent_rtu", "cm_sent_dreq", "cm_rcvd_drep", "cm_retransmits"}
		if c.m == p.srv.m {
			n = []string{"cm_rcvd_req", "cm_sent_rep", "cm_rcvd_rtu", "cm_rcvd_dreq", "cm_sent_drep", "cm_retransmits"}
		}
		if got := counts(c.m, n...); got != c.want {
			t.Errorf("counters %s, want %s", got, c.want)
		}
	}
}

// TestNoListener: a REQ for a port nobody listens on gets REJ reason 8.
func TestNoListener(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig(), nil, nil)
	ep := p.cli.newEndpoint(t, 64)
	_, err := p.cli.m.Dial(testCtx(t), netip.AddrPortFrom(serverAddr, 9999), ep.q, nil)
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Reason != RejInvalidServiceID {
		t.Fatalf("dial: %v, want REJ reason 8", err)
	}
	if ep.q.State() != rxego.StateErr {
		t.Errorf("QP after REJ: %v", ep.q.State())
	}
	if got := counts(p.srv.m, "cm_sent_rej", "cm_rcvd_req"); got != "[cm_sent_rej=1 cm_rcvd_req=1]" {
		t.Errorf("server %s", got)
	}
}

// TestReject: the application rejects with private data.
func TestReject(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig(), nil, nil)
	l, _ := p.srv.m.Listen(1)
	go func() {
		r, err := l.Accept(testCtx(t))
		if err == nil {
			r.Reject([]byte("go away"))
		}
	}()
	ep := p.cli.newEndpoint(t, 64)
	_, err := p.cli.m.Dial(testCtx(t), netip.AddrPortFrom(serverAddr, 1), ep.q, nil)
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Reason != RejConsumerDefined || !bytes.HasPrefix(rej.PrivateData, []byte("go away")) {
		t.Fatalf("dial: %v", err)
	}
}

// TestLostREP: the server's first REP is lost; it retransmits and the
// connection is made.
func TestLostREP(t *testing.T) {
	var f *madFilter
	p := newPair(t, fastConfig(), fastConfig(), func(c transport.Conn) transport.Conn {
		f = newMADFilter(c, map[uint16]int{AttrREP: 1})
		return f
	}, nil)
	srvEP, cliEP := p.srv.newEndpoint(t, 4096), p.cli.newEndpoint(t, 4096)
	srv, cli := p.connect(t, 5, srvEP, cliEP, nil, nil)
	if f.droppedOf(AttrREP) != 1 {
		t.Fatalf("dropped %d REPs", f.droppedOf(AttrREP))
	}
	if c := p.srv.m.Counters(); c["cm_sent_rep"] < 2 || c["cm_retransmits"] < 1 {
		t.Errorf("server %s", counts(p.srv.m, "cm_sent_rep", "cm_retransmits"))
	}
	if c := p.cli.m.Counters(); c["cm_rcvd_rep"] < 1 || c["cm_sent_rtu"] != 1 {
		t.Errorf("client %s", counts(p.cli.m, "cm_rcvd_rep", "cm_sent_rtu"))
	}
	exchange(t, srvEP, cliEP)
	if err := srv.Disconnect(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, cli.Done(), "client Done")
}

// TestLostRTU: the client's RTU is lost; the server's REP retransmission
// is answered with the RTU again (a duplicate REP), and the server was
// able to receive before that because its QP was in RTS before the REP.
func TestLostRTU(t *testing.T) {
	var f *madFilter
	p := newPair(t, fastConfig(), fastConfig(), nil, func(c transport.Conn) transport.Conn {
		f = newMADFilter(c, map[uint16]int{AttrRTU: 2})
		return f
	})
	srvEP, cliEP := p.srv.newEndpoint(t, 4096), p.cli.newEndpoint(t, 4096)
	srvEP.postRecv(t, 64)
	srv, cli := p.connect(t, 5, srvEP, cliEP, nil, nil)
	if f.droppedOf(AttrRTU) != 2 {
		t.Fatalf("dropped %d RTUs", f.droppedOf(AttrRTU))
	}
	// Two lost RTUs take at least two REP retransmissions; on a loaded
	// machine the server's timer can fire once more before the third RTU
	// lands (ci16: 4 REPs, 2 RTUs taken), so the counts must agree with
	// each other rather than be exactly 3 and 1. Each duplicate REP the
	// client took was answered with an RTU, every RTU but the two dropped
	// may have reached the server, and no REP arrived that was not sent.
	cc, sc := p.cli.m.Counters(), p.srv.m.Counters()
	if cc["cm_duplicates"] < 2 || cc["cm_sent_rtu"] != cc["cm_duplicates"]+1 || cc["cm_duplicates"]+1 > sc["cm_sent_rep"] {
		t.Errorf("client %s, server %s", counts(p.cli.m, "cm_sent_rtu", "cm_duplicates"), counts(p.srv.m, "cm_sent_rep"))
	}
	if sc["cm_sent_rep"] < 3 || sc["cm_rcvd_rtu"] < 1 || sc["cm_rcvd_rtu"] > cc["cm_sent_rtu"]-2 {
		t.Errorf("server %s, client %s", counts(p.srv.m, "cm_sent_rep", "cm_rcvd_rtu"), counts(p.cli.m, "cm_sent_rtu"))
	}
	cli.Disconnect(testCtx(t))
	waitClosed(t, srv.Done(), "server Done")
}

// TestLostDREP: the first DREP is lost; the DREQ is retransmitted and the
// side in time-wait answers it again.
func TestLostDREP(t *testing.T) {
	var f *madFilter
	p := newPair(t, fastConfig(), fastConfig(),
		func(c transport.Conn) transport.Conn {
			f = newMADFilter(c, map[uint16]int{AttrDREP: 1})
			return f
		}, nil)
	srvEP, cliEP := p.srv.newEndpoint(t, 4096), p.cli.newEndpoint(t, 4096)
	srv, cli := p.connect(t, 5, srvEP, cliEP, nil, nil)
	if err := cli.Disconnect(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, srv.Done(), "server Done")
	if f.droppedOf(AttrDREP) != 1 {
		t.Fatalf("dropped %d DREPs", f.droppedOf(AttrDREP))
	}
	// The server answered the retransmitted DREQ from time-wait.
	if c := p.srv.m.Counters(); c["cm_rcvd_dreq"] < 2 || c["cm_sent_drep"] < 2 || c["cm_duplicates"] < 1 {
		t.Errorf("server %s", counts(p.srv.m, "cm_rcvd_dreq", "cm_sent_drep", "cm_duplicates"))
	}
}

// TestCrossedDREQs: both sides disconnect at once, the DREQs crossing
// (the client's first one lost, so that the server's arrives while the
// client is in DREQ_SENT). The client answers the server's DREQ but
// Disconnect keeps waiting for the DREP its own DREQ is owed, which the
// server, already in time-wait, sends for the retransmitted DREQ: a
// disconnecting process that returned at once left the peer's DREP to
// arrive at a closed port (TestRstreamSizes against rdma_rxe).
func TestCrossedDREQs(t *testing.T) {
	var f *madFilter
	p := newPair(t, fastConfig(), fastConfig(), nil, func(c transport.Conn) transport.Conn {
		f = newMADFilter(c, map[uint16]int{AttrDREQ: 1})
		return f
	})
	srvEP, cliEP := p.srv.newEndpoint(t, 64), p.cli.newEndpoint(t, 64)
	srv, cli := p.connect(t, 5, srvEP, cliEP, nil, nil)
	cliDone := make(chan error, 1)
	go func() { cliDone <- cli.Disconnect(testCtx(t)) }()
	if !eventually(func() bool { return f.droppedOf(AttrDREQ) == 1 }) {
		t.Fatal("the client's first DREQ was not sent")
	}
	if err := srv.Disconnect(testCtx(t)); err != nil {
		t.Fatalf("server disconnect: %v", err)
	}
	if err := <-cliDone; err != nil {
		t.Fatalf("client disconnect: %v", err)
	}
	// Disconnect returned only once the DREP to the client's own DREQ
	// came, and nothing timed out.
	if got := counts(p.cli.m, "cm_sent_dreq", "cm_rcvd_dreq", "cm_sent_drep", "cm_rcvd_drep", "cm_timeouts"); got !=
		"[cm_sent_dreq=2 cm_rcvd_dreq=1 cm_sent_drep=1 cm_rcvd_drep=1 cm_timeouts=0]" {
		t.Errorf("client %s", got)
	}
	if got := counts(p.srv.m, "cm_sent_dreq", "cm_rcvd_dreq", "cm_sent_drep", "cm_rcvd_drep"); got !=
		"[cm_sent_dreq=1 cm_rcvd_dreq=1 cm_sent_drep=1 cm_rcvd_drep=1]" {
		t.Errorf("server %s", got)
	}
	if !errors.Is(cli.Err(), ErrLocalDisconnect) || !errors.Is(srv.Err(), ErrLocalDisconnect) {
		t.Errorf("Err: client %v, server %v; both disconnected first", cli.Err(), srv.Err())
	}
}

// TestDialTimeout: nobody answers; the REQ is sent 1 + MaxRetries times
// and Dial fails with ErrTimeout.
func TestDialTimeout(t *testing.T) {
	n := transport.NewPipeNetwork()
	cfg := &Config{ResponseTimeout: 8, PacketLifeTime: 8, MaxRetries: 3}
	cli := newNode(t, n, clientAddr.String(), cfg, nil)
	// The server's device exists but has no CM: its QP1 does not exist.
	c, _ := n.Listen(netip.AddrPortFrom(serverAddr, transport.Port), transport.Options{})
	dev, _ := rxego.Open(serverAddr.String(), &rxego.Options{Conn: c})
	defer dev.Close()
	ep := cli.newEndpoint(t, 64)
	_, err := cli.m.Dial(testCtx(t), netip.AddrPortFrom(serverAddr, 1), ep.q, nil)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("dial: %v", err)
	}
	if got := counts(cli.m, "cm_sent_req", "cm_retransmits", "cm_timeouts"); got != "[cm_sent_req=4 cm_retransmits=3 cm_timeouts=1]" {
		t.Errorf("client %s", got)
	}
}

// TestMRA: the server's application is slow to accept; the duplicate REQ
// is answered with an MRA, the client stops retransmitting, and the REP
// still completes the connection.
func TestMRA(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig(), nil, nil)
	l, _ := p.srv.m.Listen(3)
	srvEP, cliEP := p.srv.newEndpoint(t, 64), p.cli.newEndpoint(t, 64)
	accepted := make(chan error, 1)
	go func() {
		ctx := testCtx(t)
		r, err := l.Accept(ctx)
		if err != nil {
			accepted <- err
			return
		}
		// Wait until the client's retransmitted REQ drew an MRA.
		eventually(func() bool { return p.cli.m.Counters()["cm_rcvd_mra"] != 0 })
		_, err = r.Accept(ctx, srvEP.q, nil)
		accepted <- err
	}()
	if _, err := p.cli.m.Dial(testCtx(t), netip.AddrPortFrom(serverAddr, 3), cliEP.q, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	if c := p.srv.m.Counters(); c["cm_sent_mra"] < 1 || c["cm_duplicates"] < 1 {
		t.Errorf("server %s", counts(p.srv.m, "cm_sent_mra", "cm_duplicates"))
	}
	// After the MRA the client waits 2^24 * 4 us: it sent no further REQ.
	if c := p.cli.m.Counters(); c["cm_sent_req"] != c["cm_rcvd_mra"]+1 {
		t.Errorf("client %s", counts(p.cli.m, "cm_sent_req", "cm_rcvd_mra"))
	}
}

// TestDialCanceled: the initiator gives up; the pending request on the
// server fails instead of connecting.
func TestDialCanceled(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig(), nil, nil)
	l, _ := p.srv.m.Listen(3)
	ctx, cancel := context.WithCancel(context.Background())
	ep := p.cli.newEndpoint(t, 64)
	dialed := make(chan error, 1)
	go func() {
		_, err := p.cli.m.Dial(ctx, netip.AddrPortFrom(serverAddr, 3), ep.q, nil)
		dialed <- err
	}()
	r, err := l.Accept(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-dialed; !errors.Is(err, context.Canceled) {
		t.Fatalf("dial: %v", err)
	}
	// The REJ (timeout) reaches the server and ends the request.
	waitClosed(t, r.c.ready, "request")
	srvEP := p.srv.newEndpoint(t, 64)
	var rej *RejectError
	if _, err := r.Accept(testCtx(t), srvEP.q, nil); !errors.As(err, &rej) || rej.Reason != RejTimeout {
		t.Errorf("accept after the initiator gave up: %v", err)
	}
}

// TestManyConnections makes several connections at once between the same
// two devices, as ucmatose -c does, and tears them down from the server.
func TestManyConnections(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig(), nil, nil)
	l, _ := p.srv.m.Listen(7471)
	const n = 8
	ctx := testCtx(t)
	srvConns := make(chan *Conn, n)
	go func() {
		for range n {
			r, err := l.Accept(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			ep := p.srv.newEndpoint(t, 64)
			go func() {
				c, err := r.Accept(ctx, ep.q, nil)
				if err != nil {
					t.Error(err)
				}
				srvConns <- c
			}()
		}
	}()
	var wg sync.WaitGroup
	cliConns := make([]*Conn, n)
	for i := range n {
		ep := p.cli.newEndpoint(t, 64)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := p.cli.m.Dial(ctx, netip.AddrPortFrom(serverAddr, 7471), ep.q, nil)
			if err != nil {
				t.Error(err)
			}
			cliConns[i] = c
		}()
	}
	wg.Wait()
	ports := map[uint16]bool{}
	for i := range n {
		c := <-srvConns
		if c == nil || cliConns[i] == nil {
			t.FailNow()
		}
		ports[c.RemoteAddr().Port()] = true
		if err := c.Disconnect(ctx); err != nil {
			t.Error(err)
		}
	}
	if len(ports) != n {
		t.Errorf("%d distinct client ports for %d connections", len(ports), n)
	}
	for _, c := range cliConns {
		waitClosed(t, c.Done(), "client Done")
	}
}

// TestRandomLoss: with a quarter of all packets lost both ways (CM MADs
// and RC traffic alike), connections still come up, carry data and tear
// down.
func TestRandomLoss(t *testing.T) {
	lossy := func(seed uint64) func(transport.Conn) transport.Conn {
		return func(c transport.Conn) transport.Conn {
			return impair.Wrap(c, impair.Config{Seed: seed, Dir: impair.Send, Loss: 0.25})
		}
	}
	cfg := &Config{ResponseTimeout: 13, PacketLifeTime: 10, MaxRetries: 15}
	p := newPair(t, cfg, cfg, lossy(1), lossy(2))
	for i := range 3 {
		srvEP, cliEP := p.srv.newEndpoint(t, 4096), p.cli.newEndpoint(t, 4096)
		srv, cli := p.connect(t, uint16(100+i), srvEP, cliEP, nil, nil)
		exchange(t, srvEP, cliEP)
		cli.Disconnect(testCtx(t))
		waitClosed(t, srv.Done(), "server Done")
	}
	if p.srv.m.Counters()["cm_retransmits"]+p.cli.m.Counters()["cm_retransmits"] == 0 {
		t.Errorf("no CM retransmission under 25%% loss: server %v client %v", p.srv.m.Counters(), p.cli.m.Counters())
	}
}

// TestManagerErrors covers the API's refusals.
func TestManagerErrors(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig(), nil, nil)
	if _, err := New(p.srv.dev, nil); err == nil {
		t.Error("a second manager on one device")
	}
	if _, err := New(p.srv.dev, &Config{MaxRetries: 16}); !errors.Is(err, ErrField) {
		t.Errorf("max retries 16: %v", err)
	}
	l, err := p.srv.m.Listen(10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.srv.m.Listen(10); !errors.Is(err, ErrInUse) {
		t.Errorf("listen twice: %v", err)
	}
	ep := p.cli.newEndpoint(t, 64)
	ctx := testCtx(t)
	if _, err := p.cli.m.Dial(ctx, netip.AddrPortFrom(serverAddr, 10), ep.q, &Params{PrivateData: make([]byte, 57)}); !errors.Is(err, ErrPrivData) {
		t.Errorf("57 bytes of REQ private data: %v", err)
	}
	if _, err := p.cli.m.Dial(ctx, netip.MustParseAddrPort("[::1]:10"), ep.q, nil); err == nil {
		t.Error("dial IPv6 from an IPv4 device")
	}
	seven := uint8(8)
	if _, err := p.cli.m.Dial(ctx, netip.AddrPortFrom(serverAddr, 10), ep.q, &Params{RetryCount: &seven}); !errors.Is(err, ErrField) {
		t.Errorf("retry count 8: %v", err)
	}
	if ep.q.State() != rxego.StateReset {
		t.Errorf("a refused dial moved the QP to %v", ep.q.State())
	}
	ud, _ := p.cli.dev.AllocPD()
	cq, _ := p.cli.dev.CreateCQ(4)
	udq, _ := ud.CreateQP(rxego.QPInitAttr{Type: rxego.UD, SendCQ: cq, RecvCQ: cq, Caps: rxego.Caps{MaxSendWR: 1, MaxRecvWR: 1}})
	if _, err := p.cli.m.Dial(ctx, netip.AddrPortFrom(serverAddr, 10), udq, nil); err == nil {
		t.Error("dial with a UD QP")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("close twice: %v", err)
	}
	if _, err := l.Accept(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("accept after close: %v", err)
	}
	if err := p.cli.m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.cli.m.Dial(ctx, netip.AddrPortFrom(serverAddr, 10), ep.q, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("dial after close: %v", err)
	}
	// QP1 is free again: a new manager can start.
	m2, err := New(p.cli.dev, nil)
	if err != nil {
		t.Fatalf("manager after close: %v", err)
	}
	m2.Close()
}

// TestMalformedMADs: garbage on QP1 is counted and changes nothing.
func TestMalformedMADs(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig(), nil, nil)
	bad := [MADSize]byte{1, ClassCM, 1, MethodSend} // class version 1
	p.cli.m.send(serverAddr, &bad)
	lap, _ := Marshal(1, &RTU{})
	lap[17] = byte(AttrLAP)
	p.cli.m.send(serverAddr, &lap)
	rtu, _ := Marshal(1, &RTU{LocalCommID: 5, RemoteCommID: 6}) // for no connection
	p.cli.m.send(serverAddr, &rtu)
	if eventually(func() bool {
		c := p.srv.m.Counters()
		return c["cm_malformed"] == 1 && c["cm_unsupported"] == 1 && c["cm_unmatched"] == 1
	}) {
		return
	}
	t.Errorf("server %s", counts(p.srv.m, "cm_malformed", "cm_unsupported", "cm_unmatched"))
}

// TestDisconnectUnanswered: every DREP is lost; Disconnect gives up after
// the retries with ErrTimeout, and the connection is gone all the same.
func TestDisconnectUnanswered(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig(), func(c transport.Conn) transport.Conn {
		return newMADFilter(c, map[uint16]int{AttrDREP: 100})
	}, nil)
	srvEP, cliEP := p.srv.newEndpoint(t, 64), p.cli.newEndpoint(t, 64)
	srv, cli := p.connect(t, 5, srvEP, cliEP, nil, nil)
	if err := cli.Disconnect(testCtx(t)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("disconnect: %v", err)
	}
	waitClosed(t, srv.Done(), "server Done")
	if got := counts(p.cli.m, "cm_sent_dreq", "cm_timeouts"); got != "[cm_sent_dreq=7 cm_timeouts=1]" {
		t.Errorf("client %s", got)
	}
}
