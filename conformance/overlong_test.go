package conformance

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/conformance/lab"
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
	x.postRecv(t)
	proc := p.ppServe(t, x, "-s", strconv.Itoa(overlongLen), "-n", "1")
	defer proc.Kill()
	return p.overlongOutcome(t, ctx, x, proc, rxego.WCLocQPOpErr, "remote operation error",
		"64 bytes into a 16-byte receive: rxego's receive %s as rxe's, the tool's send %q")
}

// overlongRxeReceives: rxego sends overlongLen bytes into the tool's
// rnrMsgSize-byte receive.
func (p *Peer) overlongRxeReceives(t *testing.T) Outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	x := p.openInproc(t, 4)
	proc := p.ppDial(t, ctx, x, "-s", strconv.Itoa(rnrMsgSize), "-n", "1")
	defer proc.Kill()
	// overlongLen bytes from the send half of the buffer.
	sge := rxego.SGE{Addr: x.mr.IOVA() + uint64(len(x.buf)/2), Length: overlongLen, LKey: x.mr.LKey()}
	if err := x.qp.PostSend(rxego.SendWR{ID: 1 << 32, Opcode: rxego.WRSend, Flags: rxego.SendSignaled, SGL: []rxego.SGE{sge}}); err != nil {
		t.Fatal(err)
	}
	return p.overlongOutcome(t, ctx, x, proc, rxego.WCRemOpErr, "local QP operation error",
		"64 bytes into the tool's 16-byte receive: rxego's SEND %s, the tool's receive %q")
}

// overlongOutcome checks that rxego's first completion has status want
// and that the tool failed naming toolWant.
func (p *Peer) overlongOutcome(t *testing.T, ctx context.Context, x *inproc, proc *lab.Proc, want rxego.WCStatus, toolWant, note string) Outcome {
	t.Helper()
	if wc := x.firstWC(t, ctx); wc.Status != want {
		t.Fatalf("rxego's completion %s, want %s", wc.Status, want)
	}
	tool := toolFailed(t, ctx, proc, toolWant)
	return Outcome{Note: fmt.Sprintf(note, want, tool), Rxego: x.stats()}
}
