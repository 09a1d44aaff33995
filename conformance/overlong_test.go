package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/conformance/lab"
	"github.com/rxego/rxego/qp"
)

// TestOverlongSend sends a SEND longer than the receive posted for it,
// each side receiving once, with ibv_rc_pingpong in the guest and rxego in
// the test process. rxe's responder answers NAK remote operational error
// (its copy_data fails with -EINVAL, a malformed WQE, class A) and
// completes the receive LOC_QP_OP_ERR; rxego must do the same, and must
// complete its own SEND REM_OP_ERR when rxe refuses it.
func TestOverlongSend(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		p.Case(t, Case{Name: "overlong send", Role: "rxego server",
			Expect:  []string{"naks_sent", "drop_bad_length", "flushed_work_requests"},
			Require: []string{"rxego:drop_bad_length"}, Tail: true},
			func(t *testing.T) Outcome { return p.overlongRxegoReceives(t) })
		p.Case(t, Case{Name: "overlong send", Role: "rxego client",
			// rxego counts a WR that completes in error in send_err.
			Expect: []string{"flushed_work_requests", "send_err"}, Tail: true},
			func(t *testing.T) Outcome { return p.overlongRxeReceives(t) })
	})
}

// overlongLen is what the sender sends; the receive takes rnrMsgSize.
const overlongLen = 4 * rnrMsgSize

// firstWC waits for x's next completion.
func (x *inproc) firstWC(t *testing.T, ctx context.Context) rxego.WC {
	t.Helper()
	n, err := x.cq.PollWait(ctx, x.wcs[:1])
	if err != nil || n != 1 {
		t.Fatalf("no completion: %v", err)
	}
	return x.wcs[0]
}

// toolFailed waits for the guest tool, which must fail naming want.
func toolFailed(t *testing.T, ctx context.Context, proc *lab.Proc, want string) string {
	t.Helper()
	_, err := proc.Wait(ctx)
	var ee *lab.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("ibv_rc_pingpong: %v; want it to fail naming %q", err, want)
	}
	for _, l := range strings.Split(string(ee.Result.Stdout)+string(ee.Result.Stderr), "\n") {
		if strings.Contains(l, want) {
			return strings.TrimSpace(l)
		}
	}
	t.Fatalf("ibv_rc_pingpong failed without naming %q: %s%s", want, ee.Result.Stdout, ee.Result.Stderr)
	return ""
}

// overlongRxegoReceives: the tool sends overlongLen bytes into rxego's
// rnrMsgSize-byte receive.
func (p *Peer) overlongRxegoReceives(t *testing.T) Outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	x := p.openInproc(t, 4)
	ln, err := p.Lab.Listen("tcp4", net.JoinHostPort(p.HostIP, strconv.Itoa(p.Port)))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	proc, err := p.Guest.Start("ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-p", strconv.Itoa(p.Port),
		"-s", strconv.Itoa(overlongLen), "-n", "1", p.HostIP)
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(30 * time.Second))
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	remote, err := readPPDest(conn)
	if err != nil {
		t.Fatal(err)
	}
	x.postRecv(t)
	x.connect(t, p, remote)
	if _, err := conn.Write(ppDest{qpn: x.qp.Num(), psn: x.psn, gid: netip.MustParseAddr(p.HostIP)}.encode()); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(conn, make([]byte, len("done\x00"))); err != nil {
		t.Fatal(err)
	}
	if wc := x.firstWC(t, ctx); wc.Status != qp.WCLocQPOpErr {
		t.Fatalf("rxego's receive completed %s, want %s as rxe's", wc.Status, qp.WCLocQPOpErr)
	}
	tool := toolFailed(t, ctx, proc, "remote operation error")
	return Outcome{Note: fmt.Sprintf("%d bytes into a %d-byte receive: rxego's receive LOC_QP_OP_ERR, the tool's send %q", overlongLen, rnrMsgSize, tool),
		Rxego: x.stats()}
}

// overlongRxeReceives: rxego sends overlongLen bytes into the tool's
// rnrMsgSize-byte receive.
func (p *Peer) overlongRxeReceives(t *testing.T) Outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	x := p.openInproc(t, 4)
	proc, err := p.Guest.Start("ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-p", strconv.Itoa(p.Port),
		"-s", strconv.Itoa(rnrMsgSize), "-n", "1")
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	if err := p.Guest.WaitTCPListen(ctx, p.Port); err != nil {
		t.Fatal(err)
	}
	conn, err := p.Lab.Dial(ctx, "tcp4", net.JoinHostPort(p.Guest.IP(), strconv.Itoa(p.Port)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write(ppDest{qpn: x.qp.Num(), psn: x.psn, gid: netip.MustParseAddr(p.HostIP)}.encode()); err != nil {
		t.Fatal(err)
	}
	remote, err := readPPDest(conn)
	if err != nil {
		t.Fatal(err)
	}
	x.connect(t, p, remote)
	if _, err := conn.Write([]byte("done\x00")); err != nil {
		t.Fatal(err)
	}
	// overlongLen bytes from the send half of the buffer.
	sge := rxego.SGE{Addr: x.mr.IOVA() + uint64(len(x.buf)/2), Length: overlongLen, LKey: x.mr.LKey()}
	if err := x.qp.PostSend(rxego.SendWR{ID: 1 << 32, Opcode: rxego.WRSend, Flags: rxego.SendSignaled, SGL: []rxego.SGE{sge}}); err != nil {
		t.Fatal(err)
	}
	if wc := x.firstWC(t, ctx); wc.Status != qp.WCRemOpErr {
		t.Fatalf("rxego's SEND completed %s, want %s", wc.Status, qp.WCRemOpErr)
	}
	tool := toolFailed(t, ctx, proc, "local QP operation error")
	return Outcome{Note: fmt.Sprintf("%d bytes into the tool's %d-byte receive: rxego's SEND REM_OP_ERR, the tool's receive %q", overlongLen, rnrMsgSize, tool),
		Rxego: x.stats()}
}
