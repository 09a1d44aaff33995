package cm

import (
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxego/rxego"
)

// TestDialRetry: a client dials a port nobody listens on yet; each REJ
// (reason 8) puts its QP back to RESET and runs rearm, which posts the
// receive again; once the server listens the connection is made, and a
// SEND lands in the receive posted by the last rearm.
func TestDialRetry(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig(), nil, nil)
	cli, srv := p.cli.newEndpoint(t, 64), p.srv.newEndpoint(t, 64)
	cli.postRecv(t, 64)
	var rearms atomic.Int32
	rearm := func() error {
		rearms.Add(1)
		if err := cli.q.Init(0); err != nil {
			return err
		}
		return cli.q.PostRecv(rxego.RecvWR{ID: 2, SGL: []rxego.SGE{{Addr: cli.mr.IOVA(), Length: 64, LKey: cli.mr.LKey()}}})
	}
	const port = 4242
	go func() {
		// Listen after two rejections, then accept and send.
		eventually(func() bool { return p.srv.m.Counters()["cm_sent_rej"] >= 2 })
		l, err := p.srv.m.Listen(port)
		if err != nil {
			return
		}
		req, err := l.Accept(testCtx(t))
		if err != nil {
			return
		}
		if _, err := req.Accept(testCtx(t), srv.q, nil); err != nil {
			return
		}
		copy(srv.buf, "after retries")
		srv.q.PostSend(rxego.SendWR{Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
			SGL: []rxego.SGE{{Addr: srv.mr.IOVA(), Length: 13, LKey: srv.mr.LKey()}}})
	}()
	conn, err := p.cli.m.DialRetry(testCtx(t), netip.AddrPortFrom(serverAddr, port), cli.q, nil, 20*time.Millisecond, rearm)
	if err != nil {
		t.Fatal(err)
	}
	// The first receive was flushed by the first REJ.
	for {
		wc := cli.wait(t)
		if wc.Status == rxego.WCWRFlushErr {
			continue
		}
		if wc.Status != rxego.WCSuccess || wc.ID != 2 || string(cli.buf[:13]) != "after retries" {
			t.Fatalf("completion %+v, buffer %q", wc, cli.buf[:13])
		}
		break
	}
	if n := rearms.Load(); n < 2 {
		t.Errorf("rearm ran %d times, want at least 2", n)
	}
	if got := p.srv.m.Counters()["cm_sent_rej"]; int(got) != int(rearms.Load()) {
		t.Errorf("%d rejections, %d rearms", got, rearms.Load())
	}
	if err := conn.Disconnect(testCtx(t)); err != nil {
		t.Error(err)
	}
}

// TestDialRetryOtherReject: a rejection for another reason ends DialRetry
// at once.
func TestDialRetryOtherReject(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig(), nil, nil)
	l, _ := p.srv.m.Listen(7)
	go func() {
		if r, err := l.Accept(testCtx(t)); err == nil {
			r.Reject(nil)
		}
	}()
	ep := p.cli.newEndpoint(t, 64)
	_, err := p.cli.m.DialRetry(testCtx(t), netip.AddrPortFrom(serverAddr, 7), ep.q, nil, time.Millisecond, nil)
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Reason != RejConsumerDefined {
		t.Fatalf("dial: %v, want REJ reason 28", err)
	}
}

// TestHangUp: a server's HangUp with a grace period lets the client's
// disconnect go first and sends no DREQ of its own; the client's HangUp
// disconnects at once.
func TestHangUp(t *testing.T) {
	p := newPair(t, fastConfig(), fastConfig(), nil, nil)
	l, _ := p.srv.m.Listen(8)
	accepted := make(chan *Conn, 1)
	go func() {
		srv := p.srv.newEndpoint(t, 64)
		if r, err := l.Accept(testCtx(t)); err == nil {
			c, _ := r.Accept(testCtx(t), srv.q, nil)
			accepted <- c
		}
	}()
	cli := p.cli.newEndpoint(t, 64)
	cc, err := p.cli.m.Dial(testCtx(t), netip.AddrPortFrom(serverAddr, 8), cli.q, nil)
	if err != nil {
		t.Fatal(err)
	}
	sc := <-accepted
	if sc == nil {
		t.Fatal("no accepted connection")
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- HangUp(testCtx(t), []*Conn{sc}, 5*time.Second) }()
	if err := HangUp(testCtx(t), []*Conn{cc}, 0); err != nil {
		t.Fatal(err)
	}
	if err := <-srvDone; err != nil {
		t.Fatal(err)
	}
	if got := counts(p.srv.m, "cm_sent_dreq", "cm_rcvd_dreq", "cm_sent_drep"); got != "[cm_sent_dreq=0 cm_rcvd_dreq=1 cm_sent_drep=1]" {
		t.Errorf("server %s", got)
	}
	if !errors.Is(sc.Err(), ErrDisconnected) {
		t.Errorf("server connection ended with %v", sc.Err())
	}
}
