package rxego_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/qp"
)

// These tests cover blocking PollWait on a device whose application
// goroutines read the socket themselves while they wait (see readLoop in
// rxego.go): every case must deliver what it sends, whoever reads.

func recvWR(s *side, off uint64) rxego.RecvWR {
	return rxego.RecvWR{ID: off, SGL: []rxego.SGE{{Addr: s.mr.IOVA() + off, Length: 64, LKey: s.mr.LKey()}}}
}

// sendWR sends the 64 bytes at off in s's memory.
func sendWR(s *side, off uint64, flags qp.SendFlags) rxego.SendWR {
	return rxego.SendWR{Opcode: rxego.WRSend, Flags: flags, SGL: []rxego.SGE{{Addr: s.mr.IOVA() + off, Length: 64, LKey: s.mr.LKey()}}}
}

// sendNum sends a message carrying v.
func sendNum(t *testing.T, s *side, v uint64) {
	t.Helper()
	binary.LittleEndian.PutUint64(s.buf[2048:], v)
	if err := s.qp.PostSend(sendWR(s, 2048, 0)); err != nil {
		t.Fatal(err)
	}
}

// TestPollWaitPingPong: both sides wait in PollWait (with a cancellable
// context, as most callers have), one echoes; every message comes back
// with its number.
func TestPollWaitPingPong(t *testing.T) {
	a, b := open(t, rxego.RC, 4096), open(t, rxego.RC, 4096)
	connectPair(t, a, b, &rxego.ConnectOptions{MTU: qp.MTU1024})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, s := range []*side{a, b} {
		for range 4 {
			if err := s.qp.PostRecv(recvWR(s, 0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	const iters = 500
	echo := make(chan error, 1)
	go func() {
		wcs := make([]rxego.WC, 1)
		for k := range iters {
			if _, err := b.cq.PollWait(ctx, wcs); err != nil {
				echo <- err
				return
			}
			b.dev.Sync()
			if got := binary.LittleEndian.Uint64(b.buf); wcs[0].Status != qp.WCSuccess || got != uint64(k) {
				echo <- errors.New("echo side: wrong message")
				return
			}
			if err := b.qp.PostRecv(recvWR(b, 0)); err != nil {
				echo <- err
				return
			}
			if err := b.qp.PostSend(sendWR(b, 0, 0)); err != nil {
				echo <- err
				return
			}
		}
		echo <- nil
	}()
	wcs := make([]rxego.WC, 1)
	for k := range iters {
		sendNum(t, a, uint64(k))
		if _, err := a.cq.PollWait(ctx, wcs); err != nil {
			t.Fatalf("message %d: %v", k, err)
		}
		a.dev.Sync()
		if got := binary.LittleEndian.Uint64(a.buf); wcs[0].Status != qp.WCSuccess || got != uint64(k) {
			t.Fatalf("message %d came back as %d (%v)", k, got, wcs[0].Status)
		}
		if err := a.qp.PostRecv(recvWR(a, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-echo; err != nil {
		t.Fatal(err)
	}
}

// TestPollWaitTwoCQs: two goroutines wait on two CQs of one device (one
// reads the socket, the other waits for its CQ's bell, or the socket is
// handed between them); messages for either QP, alternately, reach each.
func TestPollWaitTwoCQs(t *testing.T) {
	a := open(t, rxego.RC, 4096)
	b := open(t, rxego.RC, 4096)
	connectPair(t, a, b, &rxego.ConnectOptions{MTU: qp.MTU1024})
	// A second QP pair between the same devices, on its own CQ at b.
	cq2, _ := b.dev.CreateCQ(64)
	qa2, _ := a.pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: a.cq, RecvCQ: a.cq, Caps: rxego.Caps{MaxSendWR: 64, MaxRecvWR: 64}})
	qb2, _ := b.pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq2, RecvCQ: cq2, Caps: rxego.Caps{MaxSendWR: 64, MaxRecvWR: 64}})
	a2 := &side{a.dev, a.pd, a.cq, qa2, a.mr, a.buf}
	b2 := &side{b.dev, b.pd, cq2, qb2, b.mr, b.buf}
	connectPair(t, a2, b2, &rxego.ConnectOptions{MTU: qp.MTU1024})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const iters = 100
	got := make(chan int, 2*iters)
	errs := make(chan error, 2)
	for i, s := range []*side{b, b2} {
		go func() {
			wcs := make([]rxego.WC, 1)
			for range iters {
				if err := s.qp.PostRecv(recvWR(s, uint64(64*i))); err != nil {
					errs <- err
					return
				}
				if _, err := s.cq.PollWait(ctx, wcs); err != nil {
					errs <- err
					return
				}
				if wcs[0].Status != qp.WCSuccess || wcs[0].QPN != s.qp.Num() {
					errs <- errors.New("wrong completion")
					return
				}
				got <- i
			}
			errs <- nil
		}()
	}
	wcs := make([]rxego.WC, 4)
	for k := range 2 * iters {
		s := []*side{a, a2}[k%2]
		var err error
		for range 1000 { // until the other side has posted its receive
			if err = s.qp.PostSend(sendWR(s, 2048, rxego.SendSignaled)); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		n, err := a.cq.PollWait(ctx, wcs)
		if err != nil || wcs[0].Status != qp.WCSuccess {
			t.Fatalf("send %d: %d completions, %v, %v", k, n, err, wcs[:n])
		}
		if want := k % 2; <-got != want {
			t.Fatalf("message %d arrived on the wrong side", k)
		}
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestPollWaitThenStop: the application waits once (reading the socket
// itself), then stops polling for good; the device must go on serving
// its QPs: a peer's WRITEs are acknowledged.
func TestPollWaitThenStop(t *testing.T) {
	a, b := open(t, rxego.RC, 4096), open(t, rxego.RC, 4096)
	connectPair(t, a, b, &rxego.ConnectOptions{MTU: qp.MTU1024})
	if err := b.qp.PostRecv(recvWR(b, 0)); err != nil {
		t.Fatal(err)
	}
	sendNum(t, a, 1)
	wait1(t, b.cq) // b's goroutine read the socket, then left
	for i := range 20 {
		a.buf[64*i] = byte(i + 1)
		err := a.qp.PostSend(rxego.SendWR{Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
			SGL:        []rxego.SGE{{Addr: a.mr.IOVA() + uint64(64*i), Length: 64, LKey: a.mr.LKey()}},
			RemoteAddr: b.mr.IOVA() + 1024 + uint64(64*i), RKey: b.mr.RKey()})
		if err != nil {
			t.Fatal(err)
		}
		if wc := wait1(t, a.cq); wc.Status != qp.WCSuccess {
			t.Fatalf("WRITE %d: %v", i, wc.Status)
		}
	}
	b.dev.Sync()
	for i := range 20 {
		if b.buf[1024+64*i] != byte(i+1) {
			t.Fatalf("WRITE %d not in b's memory", i)
		}
	}
}

// TestPollWaitWakes: a goroutine blocked in PollWait, reading the socket,
// returns for a completion no packet brings (its QP moved to ERR by
// another goroutine flushes the receive), for its context's end, and for
// the CQ's Close.
func TestPollWaitWakes(t *testing.T) {
	a, b := open(t, rxego.RC, 4096), open(t, rxego.RC, 4096)
	connectPair(t, a, b, &rxego.ConnectOptions{MTU: qp.MTU1024})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		n   int
		err error
		wc  rxego.WC
	}
	wait := func(ctx context.Context, cq *rxego.CQ) chan result {
		ch := make(chan result, 1)
		go func() {
			wcs := make([]rxego.WC, 1)
			n, err := cq.PollWait(ctx, wcs)
			ch <- result{n, err, wcs[0]}
		}()
		time.Sleep(20 * time.Millisecond) // let it block (a sooner event is as good)
		return ch
	}

	// A flushed receive.
	if err := a.qp.PostRecv(recvWR(a, 0)); err != nil {
		t.Fatal(err)
	}
	ch := wait(ctx, a.cq)
	if err := a.qp.Modify(&rxego.QPAttr{State: qp.Err}, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	if r := <-ch; r.n != 1 || r.err != nil || r.wc.Status == qp.WCSuccess {
		t.Fatalf("PollWait after the QP moved to ERR = %d, %v, %v; want the flushed receive", r.n, r.err, r.wc.Status)
	}

	// The context: cancelled, then another one timing out.
	for range 2 {
		cctx, ccancel := context.WithCancel(ctx)
		ch = wait(cctx, b.cq)
		ccancel()
		if r := <-ch; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("PollWait after cancel = %d, %v", r.n, r.err)
		}
	}
	tctx, tcancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer tcancel()
	if r := <-wait(tctx, b.cq); !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("PollWait past the deadline = %d, %v", r.n, r.err)
	}

	// Close of the CQ.
	cq, _ := b.dev.CreateCQ(4)
	ch = wait(ctx, cq)
	cq.Close()
	if r := <-ch; r.err == nil {
		t.Fatalf("PollWait on a closed CQ = %d, nil", r.n)
	}

	// Close of the device wakes the waiter: ErrClosed.
	ch = wait(ctx, b.cq)
	time.Sleep(10 * time.Millisecond)
	b.dev.Close()
	if r := <-ch; !errors.Is(r.err, rxego.ErrClosed) {
		t.Fatalf("PollWait after the device closed = %d, %v; want ErrClosed", r.n, r.err)
	}
}

// TestPollWaitTimerFires: a goroutine blocked in PollWait, reading the
// socket itself, returns for a completion a timer makes: the QP's peer
// does not exist, its retransmit timer fires while the goroutine reads,
// and the retries run out (WCRetryExcErr).
func TestPollWaitTimerFires(t *testing.T) {
	a, b := open(t, rxego.RC, 4096), open(t, rxego.RC, 4096)
	// No QP on b has this number: b drops every packet.
	err := a.qp.Connect(rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qp.Num() + 1000, PSN: 200},
		&rxego.ConnectOptions{LocalPSN: 100, MTU: qp.MTU1024, Timeout: 8, RetryCnt: 2}) // 1 ms, twice
	if err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(sendWR(a, 0, rxego.SendSignaled)); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, a.cq); wc.Status != rxego.WCRetryExcErr {
		t.Fatalf("completion %v, want %v", wc.Status, rxego.WCRetryExcErr)
	}
	if n := a.dev.Stats().Retransmits; n == 0 {
		t.Fatal("no retransmission counted: the timer did not fire")
	}
}

// TestPollWaitNoPacketTwice: the application's goroutine and the
// device's receive goroutine take turns at the socket (short waits, and
// pauses in which the receive goroutine takes it back); every packet the
// peer sent is taken in exactly once, and every message completes once,
// in order.
func TestPollWaitNoPacketTwice(t *testing.T) {
	a, b := open(t, rxego.RC, 4096), open(t, rxego.RC, 4096)
	connectPair(t, a, b, &rxego.ConnectOptions{MTU: qp.MTU1024})
	const msgs = 40
	for i := range msgs {
		if err := b.qp.PostRecv(rxego.RecvWR{ID: uint64(i), SGL: []rxego.SGE{{Addr: b.mr.IOVA() + uint64(64*(i%16)), Length: 64, LKey: b.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	sent := make(chan error, 1)
	go func() {
		for i := range msgs {
			if err := a.qp.PostSend(rxego.SendWR{ID: uint64(i), Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
				SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: 64, LKey: a.mr.LKey()}}}); err != nil {
				sent <- err
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			wc := make([]rxego.WC, 1)
			_, err := a.cq.PollWait(ctx, wc) // not wait1: t.Fatal belongs to the test's goroutine
			cancel()
			if err != nil || wc[0].Status != qp.WCSuccess || wc[0].ID != uint64(i) {
				sent <- fmt.Errorf("send %d: completion %+v, %v", i, wc[0], err)
				return
			}
			if i%4 == 3 {
				time.Sleep(3 * time.Millisecond) // b's receive goroutine takes the socket back meanwhile
			}
		}
		sent <- nil
	}()
	wc := make([]rxego.WC, 1)
	for next := 0; next < msgs; {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
		n, err := b.cq.PollWait(ctx, wc)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			if next%5 == 0 {
				time.Sleep(2 * time.Millisecond)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 || wc[0].Status != qp.WCSuccess || wc[0].ID != uint64(next) {
			t.Fatalf("receive %d: completion %+v", next, wc[0])
		}
		next++
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	a.dev.Sync()
	b.dev.Sync()
	if r := a.dev.Stats().Retransmits; r == 0 {
		if got, want := b.dev.Stats().RcvdPkts, a.dev.Stats().SentPkts; got != want {
			t.Fatalf("b took in %d packets, a sent %d: a packet was taken in twice or lost", got, want)
		}
	}
	if n, _ := b.cq.Poll(wc); n != 0 {
		t.Fatalf("an extra completion: %+v", wc[0])
	}
}
