package rxego_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/qp"
)

// TestCQOverrunReachesPollWait: a CQ of depth 2 and five signalled
// WRITEs: PollWait returns the two completions the CQ holds, then an
// error wrapping ErrCQOverrun that names the QP (not a wait until the
// context ends), Poll and Wait return it too, and the QP that lost its
// completions is in ERR. In each of the device's receive modes.
func TestCQOverrunReachesPollWait(t *testing.T) {
	for _, mode := range lifecycleModes {
		t.Run(mode.name, func(t *testing.T) {
			opts := mode.opts()
			b := openWith(t, opts(), rxego.RC, 1<<12)
			a := openWith(t, opts(), rxego.RC, 1<<12)
			small, err := a.dev.CreateCQ(2)
			if err != nil {
				t.Fatal(err)
			}
			q, err := a.pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: small, RecvCQ: small, Caps: rxego.Caps{MaxSendWR: 8, MaxRecvWR: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if err := q.Connect(rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qp.Num(), PSN: 200}, &rxego.ConnectOptions{LocalPSN: 100}); err != nil {
				t.Fatal(err)
			}
			if err := b.qp.Connect(rxego.RemoteQP{Addr: a.dev.Addr(), QPN: q.Num(), PSN: 100}, &rxego.ConnectOptions{LocalPSN: 200}); err != nil {
				t.Fatal(err)
			}
			for i := range 5 {
				if err := q.PostSend(rxego.SendWR{ID: uint64(i + 1), Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
					SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: 8, LKey: a.mr.LKey()}}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}); err != nil {
					t.Fatal(err)
				}
			}
			// Once the CQ is full, the third completion overruns it.
			for end := time.Now().Add(10 * time.Second); small.Err() == nil && time.Now().Before(end); time.Sleep(time.Millisecond) {
				a.dev.Sync()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			wcs := make([]rxego.WC, 8)
			got := 0
			for {
				n, err := small.PollWait(ctx, wcs)
				for _, wc := range wcs[:n] {
					if wc.Status != rxego.WCSuccess || wc.ID != uint64(got+1) {
						t.Errorf("completion %d: %+v", got, wc)
					}
					got++
				}
				if err != nil {
					if !errors.Is(err, rxego.ErrCQOverrun) || ctx.Err() != nil {
						t.Fatalf("PollWait after %d completions: %v; want ErrCQOverrun", got, err)
					}
					t.Logf("PollWait: %v", err)
					break
				}
			}
			if got != 2 {
				t.Errorf("%d completions before the overrun error; want the CQ's 2", got)
			}
			if st := q.State(); st != qp.Err {
				t.Errorf("QP in %v after the overrun; want ERR", st)
			}
			if err := small.Err(); !errors.Is(err, rxego.ErrCQOverrun) {
				t.Errorf("CQ.Err: %v", err)
			}
			if err := small.Wait(ctx); !errors.Is(err, rxego.ErrCQOverrun) {
				t.Errorf("Wait on the overrun, empty CQ: %v", err)
			}
			if n, err := small.Poll(wcs); n != 0 || !errors.Is(err, rxego.ErrCQOverrun) {
				t.Errorf("Poll on the overrun, empty CQ: %d, %v; want 0 and ErrCQOverrun", n, err)
			}
		})
	}
}
