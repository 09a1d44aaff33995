package qp

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestCQPollAndWait(t *testing.T) {
	for _, d := range []int{0, -1, 1<<22 + 1} {
		if _, err := NewCQ(d); err == nil {
			t.Fatalf("NewCQ(%d) succeeded", d)
		}
	}
	cq, err := NewCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]WC, 8)
	if n := cq.Poll(buf); n != 0 || cq.Len() != 0 {
		t.Fatalf("empty CQ polled %d", n)
	}
	for i := 0; i < 3; i++ {
		if !cq.push(WC{ID: uint64(i)}) {
			t.Fatal("push refused")
		}
	}
	if n := cq.Poll(buf[:2]); n != 2 || buf[0].ID != 0 || buf[1].ID != 1 || cq.Len() != 1 {
		t.Fatalf("Poll(2) = %d %+v, %d left", n, buf[:n], cq.Len())
	}
	if n := cq.Poll(buf); n != 1 || buf[0].ID != 2 {
		t.Fatalf("Poll = %d %+v", n, buf[:n])
	}
	// The ring wraps: push and poll past its end, in order.
	for round := 0; round < 3; round++ {
		for i := 0; i < 4; i++ {
			cq.push(WC{ID: uint64(10*round + i)})
		}
		if n := cq.Poll(buf); n != 4 || buf[0].ID != uint64(10*round) || buf[3].ID != uint64(10*round+3) {
			t.Fatalf("round %d: %+v", round, buf[:n])
		}
	}
	if cq.Err() != nil {
		t.Fatal("overrun without one")
	}

	// Wait returns at once when something is there.
	cq.push(WC{ID: 99})
	if err := cq.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	cq.Poll(buf)

	// Wait gives up when its context is cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cq.Wait(ctx) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait ignored its context")
	}

	// PollWait blocks until a completion arrives from another goroutine.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	got := make(chan []WC, 1)
	go func() {
		out := make([]WC, 4)
		n, err := cq.PollWait(ctx2, out)
		if err != nil {
			t.Error(err)
		}
		got <- out[:n]
	}()
	cq.push(WC{ID: 7, Status: WCRemAccessErr})
	if w := <-got; len(w) != 1 || w[0].ID != 7 || w[0].Status != WCRemAccessErr {
		t.Fatalf("PollWait got %+v", w)
	}

	// Close wakes a waiter, and later waits fail.
	go func() { done <- cq.Wait(context.Background()) }()
	cq.Close()
	if err := <-done; err == nil {
		t.Fatal("Wait on a closed CQ succeeded")
	}
	if err := cq.Wait(context.Background()); err == nil {
		t.Fatal("Wait after Close succeeded")
	}
}

// newQPWithCQs makes a QP whose send and receive CQs have the given depths.
func (n *node) newQPWithCQs(t *testing.T, typ Type, sdepth, rdepth int) *endpoint {
	t.Helper()
	scq, err := NewCQ(sdepth)
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := NewCQ(rdepth)
	if err != nil {
		t.Fatal(err)
	}
	a := InitAttr{Type: typ, PD: n.pd, SendCQ: scq, RecvCQ: rcq, Caps: Caps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 4, MaxRecvSGE: 4}}
	q, err := n.e.Create(a)
	if err != nil {
		t.Fatal(err)
	}
	return &endpoint{n: n, qp: q, scq: scq, rcq: rcq, attr: a}
}

// TestCQOverrunMovesQPToErr: a completion that does not fit moves the
// CQ's QP to ERR and the CQ reports ErrCQOverrun; the send queue stays
// consistent, so work posted afterwards is flushed into the room polling
// made.
func TestCQOverrunMovesQPToErr(t *testing.T) {
	o := defaultConn()
	o.retry, o.timeout = 1, 8
	f := newFabric(t)
	a := f.node("198.18.0.1").newQPWithCQs(t, RC, 2, 4)
	b := f.node("198.18.0.2").newQPWithCQs(t, RC, 4, 1)
	connect(t, a, b, o)
	lmr, _ := a.n.reg(t, 64, allAccess)
	rmr, _ := b.n.reg(t, 64, allAccess)
	for i := 0; i < 4; i++ {
		b.recv(t, uint64(i), rmr, 0, 64)
	}
	a.post(t,
		SendWR{ID: 1, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, 0, 8), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
		SendWR{ID: 2, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, 0, 8), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
		SendWR{ID: 3, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, 0, 8), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
		SendWR{ID: 4, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, 0, 8), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
	)
	f.run(time.Second)
	if a.qp.State() != Err || !errors.Is(a.scq.Err(), ErrCQOverrun) {
		t.Fatalf("requester %v, CQ error %v", a.qp.State(), a.scq.Err())
	}
	check(t, "what fitted", pollAll(a.scq), want{1, WCSuccess, WCWrite}, want{2, WCSuccess, WCWrite})
	a.post(t, SendWR{ID: 5, Opcode: WRSend, Flags: SendSignaled})
	check(t, "posted after the overrun", pollAll(a.scq), want{5, WCWRFlushErr, WCSend})

	// The responder side: the second receive completion overruns.
	c := f.node("198.18.0.3").newQPWithCQs(t, RC, 8, 8)
	d := f.node("198.18.0.4").newQPWithCQs(t, RC, 8, 1)
	connect(t, c, d, o)
	cmr, _ := c.n.reg(t, 64, allAccess)
	dmr, _ := d.n.reg(t, 64, allAccess)
	d.recv(t, 1, dmr, 0, 64)
	d.recv(t, 2, dmr, 0, 64)
	c.post(t, SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(cmr, 0, 8)}, SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: sge(cmr, 0, 8)})
	f.run(time.Second)
	if d.qp.State() != Err || !errors.Is(d.rcq.Err(), ErrCQOverrun) {
		t.Fatalf("responder %v, CQ error %v", d.qp.State(), d.rcq.Err())
	}
	check(t, "responder CQ", pollAll(d.rcq), want{1, WCSuccess, WCRecv})
	// The requester's second SEND is never acknowledged: it runs out of
	// retries against the failed peer.
	check(t, "requester", pollAll(c.scq), want{1, WCSuccess, WCSend}, want{2, WCRetryExcErr, WCSend})
}

// TestCQNotify checks Notify's semantics: a value when the CQ goes from
// empty to not, ready at once while entries wait, closed by Close.
func TestCQNotify(t *testing.T) {
	cq, _ := NewCQ(4)
	ready := func() bool {
		select {
		case _, ok := <-cq.Notify():
			return ok
		default:
			return false
		}
	}
	if ready() {
		t.Fatal("ready while empty")
	}
	cq.push(WC{ID: 1})
	cq.push(WC{ID: 2})
	if !ready() || !ready() {
		t.Fatal("not ready (twice) with two entries waiting")
	}
	cq.take(make([]WC, 4))
	if ready() {
		t.Fatal("ready after the CQ was emptied")
	}
	cq.push(WC{ID: 3})
	ch := cq.Notify()
	<-ch
	if err := cq.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-ch; ok {
		t.Fatal("Notify's channel not closed by Close")
	}
}

// TestCQCloseBusy: Close refuses while a QP uses the CQ.
func TestCQCloseBusy(t *testing.T) {
	cq, _ := NewCQ(4)
	if err := cq.acquire(); err != nil {
		t.Fatal(err)
	}
	if err := cq.Close(); !errors.Is(err, ErrBusy) || cq.Closed() {
		t.Fatalf("Close with a user: %v, closed %v", err, cq.Closed())
	}
	cq.release()
	if err := cq.Close(); err != nil || !cq.Closed() {
		t.Fatalf("Close: %v", err)
	}
	if err := cq.acquire(); !errors.Is(err, ErrClosed) {
		t.Fatalf("acquire of a closed CQ: %v", err)
	}
}

// countWaiter is a Waiter that counts its wake-ups.
type countWaiter struct{ wakes int }

func (w *countWaiter) WaitCQ(ctx context.Context, c *CQ) error { return c.Wait(ctx) }
func (w *countWaiter) Wake()                                   { w.wakes++ } // called under c.mu

// TestCQWakesOncePerBatch checks that completions of many QPs arriving
// together wake a watching poller once, not once per completion, and
// that the bell of a goroutine in Wait holds one token however many
// arrive: the wake-up per batch that lets one recvmmsg's completions for
// many QPs cost one hand-off.
func TestCQWakesOncePerBatch(t *testing.T) {
	c, err := NewCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	w := &countWaiter{}
	c.SetWaiter(w)
	if !c.Watch() {
		t.Fatal("Watch on an empty CQ reported false")
	}
	for qpn := range uint32(8) {
		for range 4 {
			if !c.push(WC{QPN: 17 + qpn}) {
				t.Fatal("push failed")
			}
		}
	}
	c.Unwatch()
	if w.wakes != 1 {
		t.Fatalf("32 completions of 8 QPs woke the watcher %d times, want 1", w.wakes)
	}
	// A goroutine in Wait: one token in the bell, however many arrive.
	wcs := make([]WC, 64)
	if n := c.Poll(wcs); n != 32 {
		t.Fatalf("Poll = %d, want 32", n)
	}
	c.mu.Lock()
	c.waiters++ // as WaitOr does
	c.mu.Unlock()
	for range 16 {
		c.push(WC{QPN: 17})
	}
	if n := len(c.bell); n != 1 {
		t.Fatalf("bell holds %d tokens after 16 completions, want 1", n)
	}
	c.mu.Lock()
	c.waiters--
	c.mu.Unlock()
}
