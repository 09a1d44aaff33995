package qp

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConcurrentApplication: the application posts receives and polls
// completions from its own goroutines while the engines run; every
// message arrives once, in order (run with -race).
func TestConcurrentApplication(t *testing.T) {
	o := defaultConn()
	o.minRN = 1
	f, a, b := pair(t, RC, o)
	a.n.e.cfg.RNRTick = -1 // the bare 10 us RNR wait: many RNR rounds per millisecond run
	const n = 400
	smr, _ := a.n.reg(t, 64, allAccess)
	rmr, _ := b.n.reg(t, 64, allAccess)
	// The receiving application keeps no more receives in flight than its
	// CQ holds beside the completions it has not reaped yet, as a real one
	// must: a starved reaper otherwise overran the CQ (259 of 400 once,
	// under CI's load), which is the engine doing its job.
	cqRoom := int64(b.rcq.Depth())
	var reaped atomic.Int64
	var pollErr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the receiving application: keeps a few receives posted
		defer wg.Done()
		for i := 0; i < n; {
			if int64(i)-reaped.Load() < cqRoom && b.qp.PostRecv(RecvWR{ID: uint64(i), SGL: sge(rmr, 0, 64)}) == nil {
				i++
			} else {
				time.Sleep(10 * time.Microsecond)
			}
		}
	}()
	got := make(chan []WC, 1)
	go func() { // and reaps its completions as they come
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var all []WC
		buf := make([]WC, 16)
		for len(all) < n {
			k, err := b.rcq.PollWait(ctx, buf)
			all = append(all, buf[:k]...)
			reaped.Add(int64(k))
			if err != nil {
				pollErr = err
				break
			}
		}
		got <- all
	}()
	// The fabric runs here until the receiving side has everything.
	sent, all := 0, []WC(nil)
	for round := 0; all == nil; round++ {
		if round > 200000 {
			t.Fatal("the receiving application never finished")
		}
		for sent < n && a.qp.PostSend(SendWR{ID: uint64(sent), Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 64)}) == nil {
			sent++
		}
		f.run(time.Millisecond)
		pollAllCheck(t, a.scq)
		select {
		case all = <-got:
		default:
			time.Sleep(10 * time.Microsecond) // let the application goroutines run
		}
	}
	wg.Wait()
	if len(all) != n {
		t.Fatalf("%d of %d receive completions (PollWait: %v)", len(all), n, pollErr)
	}
	for i, wc := range all {
		if wc.ID != uint64(i) || wc.Status != WCSuccess {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
}
