package reliability_test

import (
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport/impair"
)

// ackTimeout is what the QP timeout attribute t means: 4.096 us * 2^t.
func ackTimeout(t uint8) time.Duration { return time.Duration(4096<<t) * time.Nanosecond }

// Upper bounds on timer-driven failures are loose on purpose: they catch a
// timer that never fires, not a slow machine. Lower bounds are strict.
const timerSlack = 3 * time.Second

// writeWRs makes n signaled WRITEs of 64 bytes from a to b, IDs from 1.
func writeWRs(a, b *end, n int) []rxego.SendWR {
	wrs := make([]rxego.SendWR, n)
	for i := range wrs {
		wrs[i] = rxego.SendWR{ID: uint64(i + 1), Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
			SGL: a.sge(64*i, 64), RemoteAddr: b.addr(64 * i), RKey: b.mr.RKey()}
	}
	return wrs
}

// checkFailedThenFlushed polls n completions from cq: the first must carry
// status first, the rest WR_FLUSH_ERR, in wr_id order.
func checkFailedThenFlushed(t *testing.T, cq *rxego.CQ, n int, first rxego.WCStatus) time.Time {
	t.Helper()
	var at time.Time
	pollN(t, cq, n, 30*time.Second, func(i int, wc rxego.WC) {
		want := rxego.WCWRFlushErr
		if i == 0 {
			want = first
			at = time.Now()
		}
		if wc.ID != uint64(i+1) || wc.Status != want {
			t.Fatalf("completion %d: %+v (%v), want wr_id %d with %v", i, wc, wc.Status, i+1, want)
		}
	})
	return at
}

// TestRetryExhaustion sends to a peer whose every packet is lost and
// checks that the first WR fails with RETRY_EXC_ERR after the initial
// attempt and retry_cnt retries, each a full local ACK timeout, and that
// the QP is then in ERR with the rest of its work flushed.
func TestRetryExhaustion(t *testing.T) {
	for _, c := range []struct{ timeout, retry uint8 }{{12, 1}, {14, 3}} {
		t.Run("", func(t *testing.T) {
			addrA, addrB := nextLoopback()
			a := openEnd(t, endConfig{addr: addrA, size: 4096})
			b := openEnd(t, endConfig{addr: addrB, size: 4096, impair: &impair.Config{Loss: 1}})
			connect(t, a, b, rxego.ConnectOptions{Timeout: c.timeout, RetryCnt: c.retry})
			const n = 4
			start := time.Now()
			if err := a.qp.PostSend(writeWRs(a, b, n)...); err != nil {
				t.Fatal(err)
			}
			failed := checkFailedThenFlushed(t, a.scq, n, rxego.WCRetryExcErr)
			took := failed.Sub(start)
			want := time.Duration(c.retry+1) * ackTimeout(c.timeout)
			t.Logf("timeout %d (%v), retry_cnt %d: RETRY_EXC_ERR after %v (expected %v); a: %s",
				c.timeout, ackTimeout(c.timeout), c.retry, took, want, a.stats())
			if took < want || took > want+timerSlack {
				t.Fatalf("RETRY_EXC_ERR after %v, want %v (+ at most %v)", took, want, timerSlack)
			}
			if st := a.qp.State(); st != rxego.StateErr {
				t.Fatalf("QP in %v after retry exhaustion, want ERR", st)
			}
			s := a.dev.Stats()
			// The first attempt sent all n WRITEs; each retry, after a
			// timeout, only the oldest (the congestion window restarts at
			// one PSN, qp/window.go), which no ACK ever opens further.
			if got, want := s.Retransmits, uint64(c.retry); got != want {
				t.Errorf("%d retransmissions, want %d", got, want)
			}
			if s.RetryExceededErr != 1 {
				t.Errorf("retry_exceeded_err = %d, want 1", s.RetryExceededErr)
			}
			// Work posted to a QP in ERR completes at once, flushed.
			if err := a.qp.PostSend(writeWRs(a, b, 1)...); err != nil {
				t.Fatal(err)
			}
			pollN(t, a.scq, 1, 5*time.Second, func(_ int, wc rxego.WC) {
				if wc.Status != rxego.WCWRFlushErr {
					t.Fatalf("WR posted in ERR completed with %v", wc.Status)
				}
			})
			if got := b.dev.Stats().RcvdPkts; got != 0 {
				t.Fatalf("the lossy peer's engine saw %d packets", got)
			}
		})
	}
}

// TestRetryInfinite checks that retry_cnt 7 never gives up: the peer's QP
// drops everything (it is not yet in RTR) for ten timeouts, then comes up,
// and the WRITE completes.
func TestRetryInfinite(t *testing.T) {
	addrA, addrB := nextLoopback()
	a := openEnd(t, endConfig{addr: addrA, size: 4096})
	b := openEnd(t, endConfig{addr: addrB, size: 4096})
	const timeout = 10 // 4.2 ms
	if err := a.qp.Connect(rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qp.Num(), PSN: 5},
		&rxego.ConnectOptions{LocalPSN: 9, Timeout: timeout, RetryCnt: 7}); err != nil {
		t.Fatal(err)
	}
	pattern(a.buf, 3)
	a.dev.Sync()
	start := time.Now()
	if err := a.qp.PostSend(writeWRs(a, b, 1)...); err != nil {
		t.Fatal(err)
	}
	// Ten timeouts without an answer: more than any finite retry_cnt allows.
	deadline := time.Now().Add(10 * time.Second)
	for a.dev.Stats().Retransmits < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d retransmissions in 10 s", a.dev.Stats().Retransmits)
		}
		time.Sleep(time.Millisecond)
	}
	if took := time.Since(start); took < 10*ackTimeout(timeout) {
		t.Fatalf("10 retransmissions after %v, before 10 timeouts of %v", took, ackTimeout(timeout))
	}
	if st := a.qp.State(); st != rxego.StateRTS {
		t.Fatalf("requester in %v after 10 timeouts, want RTS (retry_cnt 7 is infinite)", st)
	}
	if err := b.qp.Connect(rxego.RemoteQP{Addr: a.dev.Addr(), QPN: a.qp.Num(), PSN: 9},
		&rxego.ConnectOptions{LocalPSN: 5}); err != nil {
		t.Fatal(err)
	}
	pollN(t, a.scq, 1, 10*time.Second, func(_ int, wc rxego.WC) {
		if wc.Status != rxego.WCSuccess {
			t.Fatalf("WRITE completed with %v", wc.Status)
		}
	})
	b.dev.Sync()
	if string(b.buf[:64]) != string(a.buf[:64]) {
		t.Fatal("WRITE data differs")
	}
	retrans := a.dev.Stats().Retransmits
	dropped := b.dev.Stats().Drops[rxego.DropBadState]
	t.Logf("completed after %v, %d retransmissions, %d dropped by the peer before RTR", time.Since(start), retrans, dropped)
	if dropped < 10 {
		t.Fatalf("%d bad-state drops at the peer, want at least the 10 attempts before it came up", dropped)
	}
}

// TestRNRExhaustion sends to a peer with no receive posted: every attempt
// is answered with an RNR NAK carrying the peer's min_rnr_timer, and after
// rnr_retry waits the SEND fails with RNR_RETRY_EXC_ERR; the QP is in ERR
// and its other work flushed.
func TestRNRExhaustion(t *testing.T) {
	const rnrTimer = 24 // 40.96 ms, waited as 11 ticks of 4 ms
	for _, rnrRetry := range []uint8{1, 3} {
		t.Run("", func(t *testing.T) {
			addrA, addrB := nextLoopback()
			a := openEnd(t, endConfig{addr: addrA, size: 4096})
			b := openEnd(t, endConfig{addr: addrB, size: 4096})
			connect(t, a, b, rxego.ConnectOptions{Timeout: 14, RetryCnt: 7, RNRRetry: rnrRetry, MinRNRTimer: rnrTimer})
			wrs := writeWRs(a, b, 3)
			wrs[0].Opcode = rxego.WRSend
			start := time.Now()
			if err := a.qp.PostSend(wrs...); err != nil {
				t.Fatal(err)
			}
			failed := checkFailedThenFlushed(t, a.scq, len(wrs), rxego.WCRNRRetryExcErr)
			took := failed.Sub(start)
			want := time.Duration(rnrRetry) * qp.RNRWait(rnrTimer, qp.DefaultRNRTick) // 44 ms each, rxe's jiffies
			t.Logf("rnr_retry %d, min_rnr_timer %d: RNR_RETRY_EXC_ERR after %v (expected %v); a: %s; b: %s",
				rnrRetry, rnrTimer, took, want, a.stats(), b.stats())
			if took < want || took > want+timerSlack {
				t.Fatalf("RNR_RETRY_EXC_ERR after %v, want %v (+ at most %v)", took, want, timerSlack)
			}
			if st := a.qp.State(); st != rxego.StateErr {
				t.Fatalf("QP in %v after RNR retry exhaustion, want ERR", st)
			}
			if got := a.dev.Stats().RcvdRNRErr; got != uint64(rnrRetry)+1 {
				t.Errorf("%d RNR NAKs received, want rnr_retry+1 = %d", got, rnrRetry+1)
			}
			if got := b.dev.Stats().SendRNRErr; got != uint64(rnrRetry)+1 {
				t.Errorf("peer sent %d RNR NAKs, want %d", got, rnrRetry+1)
			}
		})
	}
}

// TestRNRInfinite checks that rnr_retry 7 waits as long as it takes: the
// receive is posted only after several RNR NAKs, and the SEND completes.
func TestRNRInfinite(t *testing.T) {
	addrA, addrB := nextLoopback()
	a := openEnd(t, endConfig{addr: addrA, size: 4096})
	b := openEnd(t, endConfig{addr: addrB, size: 4096})
	const rnrTimer = 14 // 1.28 ms
	connect(t, a, b, rxego.ConnectOptions{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: rnrTimer})
	pattern(a.buf, 5)
	a.dev.Sync()
	if err := a.qp.PostSend(rxego.SendWR{ID: 1, Opcode: rxego.WRSend, Flags: rxego.SendSignaled, SGL: a.sge(0, 100)}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.dev.Stats().RcvdRNRErr < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d RNR NAKs in 10 s", a.dev.Stats().RcvdRNRErr)
		}
		time.Sleep(time.Millisecond)
	}
	if st := a.qp.State(); st != rxego.StateRTS {
		t.Fatalf("requester in %v after 10 RNR NAKs, want RTS (rnr_retry 7 is infinite)", st)
	}
	if err := b.qp.PostRecv(rxego.RecvWR{ID: 9, SGL: b.sge(0, 100)}); err != nil {
		t.Fatal(err)
	}
	pollN(t, a.scq, 1, 10*time.Second, func(_ int, wc rxego.WC) {
		if wc.Status != rxego.WCSuccess {
			t.Fatalf("SEND completed with %v", wc.Status)
		}
	})
	pollN(t, b.rcq, 1, 10*time.Second, func(_ int, wc rxego.WC) {
		if wc.Status != rxego.WCSuccess || wc.ID != 9 || wc.ByteLen != 100 {
			t.Fatalf("receive completion %+v", wc)
		}
	})
	if string(b.buf[:100]) != string(a.buf[:100]) {
		t.Fatal("SEND data differs")
	}
	t.Logf("SEND completed after %d RNR NAKs", a.dev.Stats().RcvdRNRErr)
}
