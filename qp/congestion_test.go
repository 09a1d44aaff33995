package qp

import (
	"testing"
	"time"
)

// TestCNPLoop marks every packet CE on the way to the responder: the
// responder's notification point answers with CNPs (at most one per
// min_time_between_cnps), the requester's reaction point cuts its rate,
// the pacer spaces packets out, and the data still arrives intact; afterwards the rate recovers.
func TestCNPLoop(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	f.mark = func(p wirePkt) bool { return p.dst.Addr() == b.n.addr.Addr() }
	const size = 256 << 10
	smr, sbuf := a.n.reg(t, size, allAccess)
	rmr, rbuf := b.n.reg(t, size, allAccess)
	fill(sbuf, 3)
	start := f.clock.now
	for i := 0; i < 4; i++ {
		if err := a.qp.PostSend(SendWR{ID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGL: sge(smr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	f.run(10 * time.Second)
	wcs := pollAllCheck(t, a.scq)
	if len(wcs) != 4 {
		t.Fatalf("%d completions", len(wcs))
	}
	b.n.e.Sync()
	if string(rbuf) != string(sbuf) {
		t.Fatal("data differs")
	}
	st, ok := a.qp.CongestionStats()
	bs, _ := b.qp.CongestionStats()
	if !ok || st.CNPsRcvd == 0 || bs.CNPsSent != st.CNPsRcvd || bs.CEMarked == 0 || st.RateCuts == 0 {
		t.Fatalf("requester %+v, responder %+v", st, bs)
	}
	// Once the marks stop, the timers raise the rate back to line rate.
	if st.Rate != DefaultLineRate {
		t.Fatalf("rate %d did not recover to line rate after marking stopped", st.Rate)
	}
	// Paced: 1 MiB cannot have gone faster than the rate allowed.
	el := f.clock.now - start
	if el < time.Millisecond {
		t.Fatalf("1 MiB took %v of virtual time: not paced", el)
	}
	if a.n.e.Stats.CNPsReceived.Load() != bs.CNPsSent {
		t.Fatalf("engine counted %d CNPs, QP %d", a.n.e.Stats.CNPsReceived.Load(), bs.CNPsSent)
	}
	t.Logf("virtual time %v, requester %+v, responder sent %d CNPs for %d marks", el, st, bs.CNPsSent, bs.CEMarked)
}
