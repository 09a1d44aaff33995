package qp

import (
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
)

// TestRetryExceeded: with the peer silent, a WR is sent retry_cnt+1
// times, one local ACK timeout (4.096 us * 2^timeout) apart, and completes
// with RETRY_EXC_ERR one timeout after the last try.
func TestRetryExceeded(t *testing.T) {
	for _, retry := range []uint8{0, 1, 3, 6} {
		for _, timeout := range []uint8{1, 10, 14} {
			o := defaultConn()
			o.retry, o.timeout = retry, timeout
			o.mtu = MTU1024
			f, a, _ := pair(t, RC, o)
			lmr, _ := a.n.reg(t, 3000, allAccess)
			var tries []time.Duration // times the first packet went out
			first := bth.PSN(o.apsn)
			f.drop = func(p wirePkt) bool {
				if parse(t, p).BTH().PSN() == first {
					tries = append(tries, f.clock.now)
				}
				return true
			}
			t0 := f.clock.now
			a.post(t, SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 0, 3000)}, // 3 packets
				SendWR{ID: 2, Opcode: WRWrite, SGL: sge(lmr, 0, 10)})
			f.run(time.Hour)
			T := ackTimeout(timeout)
			if len(tries) != int(retry)+1 {
				t.Fatalf("retry_cnt %d: %d transmissions, want %d", retry, len(tries), retry+1)
			}
			for i, at := range tries {
				if at != t0+time.Duration(i)*T {
					t.Fatalf("retry_cnt %d timeout %d: try %d at %v, want %v", retry, timeout, i, at, t0+time.Duration(i)*T)
				}
			}
			check(t, "requester", pollAll(a.scq), want{1, WCRetryExcErr, WCSend}, want{2, WCWRFlushErr, WCWrite})
			if end := t0 + time.Duration(retry+1)*T; f.clock.now != end {
				t.Fatalf("retry_cnt %d timeout %d: completed at %v, want %v", retry, timeout, f.clock.now, end)
			}
			if a.qp.State() != Err || a.n.e.Stats.RetryExceededErr.Load() != 1 {
				t.Fatalf("state %v, retry_exceeded_err %d", a.qp.State(), a.n.e.Stats.RetryExceededErr.Load())
			}
		}
	}
}

// TestRNRRetryExceeded: with no receive posted, a SEND draws rnr_retry+1
// RNR NAKs, the requester waiting the RNR timer of the responder's
// min_rnr_timer between tries (rounded up to rxe's 4 ms jiffy), and
// completes with RNR_RETRY_EXC_ERR at the last NAK. The NAKs count in
// rcvd_rnr_err, not as retries in completer_retry_err (as in rxe).
func TestRNRRetryExceeded(t *testing.T) {
	for _, rnr := range []uint8{0, 2, 6} {
		for _, minRNR := range []uint8{1, 5, 14, 0} {
			o := defaultConn()
			o.rnr, o.minRN, o.timeout = rnr, minRNR, 20
			f, a, b := pair(t, RC, o)
			// The requester's own min_rnr_timer must not matter: only the
			// responder's, carried in the NAK.
			if err := a.qp.Modify(&Attr{MinRNRTimer: 31}, AttrMinRNRTimer); err != nil {
				t.Fatal(err)
			}
			lmr, _ := a.n.reg(t, 64, allAccess)
			var naks []time.Duration
			f.tap = func(p wirePkt, pkt bth.Packet) {
				if isRNR(pkt) {
					naks = append(naks, f.clock.now)
				}
			}
			t0 := f.clock.now
			a.post(t, SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 0, 64)})
			f.run(time.Hour)
			D := RNRWait(minRNR, DefaultRNRTick)
			if len(naks) != int(rnr)+1 {
				t.Fatalf("rnr_retry %d: %d RNR NAKs, want %d", rnr, len(naks), rnr+1)
			}
			for i, at := range naks {
				if at != t0+time.Duration(i)*D {
					t.Fatalf("rnr_retry %d min_rnr_timer %d: NAK %d at %v, want %v", rnr, minRNR, i, at, t0+time.Duration(i)*D)
				}
			}
			check(t, "requester", pollAll(a.scq), want{1, WCRNRRetryExcErr, WCSend})
			if end := t0 + time.Duration(rnr)*D; f.clock.now != end {
				t.Fatalf("rnr_retry %d min_rnr_timer %d: completed at %v, want %v", rnr, minRNR, f.clock.now, end)
			}
			if a.n.e.Stats.RetryRNRExceededErr.Load() != 1 || b.n.e.Stats.SendRNRErr.Load() != uint64(rnr)+1 {
				t.Fatalf("retry_rnr_exceeded_err %d, send_rnr_err %d", a.n.e.Stats.RetryRNRExceededErr.Load(), b.n.e.Stats.SendRNRErr.Load())
			}
			if got, retries := a.n.e.Stats.RcvdRNRErr.Load(), a.n.e.Stats.CompleterRetryErr.Load(); got != uint64(rnr)+1 || retries != 0 {
				t.Fatalf("rcvd_rnr_err %d (want %d), completer_retry_err %d (want 0)", got, rnr+1, retries)
			}
		}
	}
}

// TestRetryForever: retry_cnt 7 and rnr_retry 7 never give up; once the
// peer recovers the WR completes.
func TestRetryForever(t *testing.T) {
	const periods = 40
	t.Run("retry_cnt", func(t *testing.T) {
		o := defaultConn()
		o.retry, o.timeout = 7, 8
		f, a, b := pair(t, RC, o)
		lmr, _ := a.n.reg(t, 64, allAccess)
		rmr, _ := b.n.reg(t, 64, allAccess)
		tries := 0
		f.drop = func(p wirePkt) bool {
			if parse(t, p).Info.Op == bth.OpWrite {
				tries++
			}
			return true
		}
		a.post(t, SendWR{ID: 1, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, 0, 64), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()})
		T := ackTimeout(o.timeout)
		f.run(periods*T + T/2)
		if tries != periods+1 || len(pollAll(a.scq)) != 0 || a.qp.State() != RTS {
			t.Fatalf("after %d timeouts: %d tries, state %v", periods, tries, a.qp.State())
		}
		f.drop = nil
		f.run(time.Second)
		check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCWrite})
	})
	t.Run("rnr_retry", func(t *testing.T) {
		o := defaultConn()
		o.rnr, o.minRN = 7, 3
		f, a, b := pair(t, RC, o)
		lmr, _ := a.n.reg(t, 64, allAccess)
		rmr, _ := b.n.reg(t, 64, allAccess)
		naks := 0
		f.tap = func(p wirePkt, pkt bth.Packet) {
			if isRNR(pkt) {
				naks++
			}
		}
		a.post(t, SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 0, 64)})
		D := RNRWait(o.minRN, DefaultRNRTick)
		f.run(periods*D + D/2)
		if naks != periods+1 || len(pollAll(a.scq)) != 0 || a.qp.State() != RTS {
			t.Fatalf("after %d RNR periods: %d NAKs, state %v", periods, naks, a.qp.State())
		}
		b.recv(t, 2, rmr, 0, 64)
		f.run(time.Second)
		check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCSend})
		check(t, "responder", pollAll(b.rcq), want{2, WCSuccess, WCRecv})
	})
}

// TestMaxRdAtomicLimit: the requester never has more READ and atomic
// requests outstanding than max_rd_atomic (0 counts as 1).
func TestMaxRdAtomicLimit(t *testing.T) {
	for _, limit := range []uint8{0, 1, 2, 5} {
		o := defaultConn()
		o.rdAtomic = limit
		f, a, b := pair(t, RC, o)
		// The limit under test is the requester's; a responder with
		// max_dest_rd_atomic 0 would refuse them all.
		b.qp.attr.MaxDestRdAtomic = 16
		lmr, _ := a.n.reg(t, 1<<16, allAccess)
		rmr, _ := b.n.reg(t, 1<<16, allAccess)
		out, most := 0, 0
		seen := map[bth.PSN]bool{}
		f.tap = func(p wirePkt, pkt bth.Packet) {
			switch {
			case pkt.Info.Op == bth.OpReadRequest || pkt.Info.Op == bth.OpFetchAdd:
				if !seen[pkt.BTH().PSN()] {
					seen[pkt.BTH().PSN()] = true
					out++
					most = max(most, out)
				}
			case pkt.Info.Op == bth.OpReadResponse && pkt.Info.Has(bth.Last), pkt.Info.Op == bth.OpAtomicAck:
				out--
			}
		}
		ra := rmr.IOVA() + uint64(aligned8(rmr, 60000))
		for i := 0; i < 8; i++ {
			wr := SendWR{ID: uint64(i), Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, i*5000, 5000), RemoteAddr: rmr.IOVA() + uint64(i*5000), RKey: rmr.RKey()}
			if i%3 == 2 {
				wr = SendWR{ID: uint64(i), Opcode: WRFetchAdd, Flags: SendSignaled, SGL: sge(lmr, aligned8(lmr, 60000), 8), RemoteAddr: ra, RKey: rmr.RKey(), CompareAdd: 1}
			}
			a.post(t, wr, SendWR{ID: 100 + uint64(i), Opcode: WRSend, SGL: sge(lmr, 0, 0)})
			b.recv(t, uint64(i), rmr, 0, 0)
		}
		f.run(time.Second)
		if n := len(pollAllCheck(t, a.scq)); n != 8 {
			t.Fatalf("max_rd_atomic %d: %d completions", limit, n)
		}
		if w := max(int(limit), 1); most != w {
			t.Fatalf("max_rd_atomic %d: at most %d outstanding, want exactly %d", limit, most, w)
		}
	}
}

// TestFenceWaitsForReads: a fenced WR is not sent before every earlier
// READ and atomic has completed; without the fence it goes at once.
func TestFenceWaitsForReads(t *testing.T) {
	for _, fence := range []bool{false, true} {
		f, a, b := pair(t, RC, defaultConn())
		lmr, _ := a.n.reg(t, 1<<16, allAccess)
		rmr, _ := b.n.reg(t, 1<<16, allAccess)
		b.recv(t, 1, rmr, 50000, 100)
		var order []string
		f.tap = func(p wirePkt, pkt bth.Packet) {
			switch {
			case pkt.Info.Op == bth.OpReadResponse && pkt.Info.Has(bth.Last):
				order = append(order, "read-done")
			case pkt.Info.Op == bth.OpAtomicAck:
				order = append(order, "atomic-done")
			case pkt.Info.Op == bth.OpSend:
				order = append(order, "send")
			}
		}
		var flags SendFlags = SendSignaled
		if fence {
			flags |= SendFence
		}
		a.post(t,
			SendWR{ID: 1, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, 20000), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
			SendWR{ID: 2, Opcode: WRFetchAdd, Flags: SendSignaled, SGL: sge(lmr, aligned8(lmr, 30000), 8), RemoteAddr: rmr.IOVA() + uint64(aligned8(rmr, 30000)), RKey: rmr.RKey()},
			SendWR{ID: 3, Opcode: WRSend, Flags: flags, SGL: sge(lmr, 40000, 100)},
		)
		f.run(time.Second)
		if len(pollAllCheck(t, a.scq)) != 3 {
			t.Fatal("completions missing")
		}
		want := []string{"send", "read-done", "atomic-done"}
		if fence {
			want = []string{"read-done", "atomic-done", "send"}
		}
		if len(order) != 3 || order[0] != want[0] || order[1] != want[1] || order[2] != want[2] {
			t.Fatalf("fence %v: order %v, want %v", fence, order, want)
		}
	}
}

// TestFencedRetry: a fenced READ or atomic whose request is lost is
// retried; the fence does not wait for the WR itself.
func TestFencedRetry(t *testing.T) {
	for _, op := range []WROpcode{WRRead, WRFetchAdd, WRAtomicWrite} {
		o := defaultConn()
		o.timeout, o.retry = 8, 3
		f, a, b := pair(t, RC, o)
		lmr, _ := a.n.reg(t, 64, allAccess)
		rmr, _ := b.n.reg(t, 64, allAccess)
		f.drop = dropOnce(t, func(pkt bth.Packet) bool { return pkt.Info.Flags&bth.Request != 0 })
		a.post(t, SendWR{ID: 1, Opcode: op, Flags: SendSignaled | SendFence, SGL: sge(lmr, aligned8(lmr, 0), 8),
			RemoteAddr: rmr.IOVA() + uint64(aligned8(rmr, 0)), RKey: rmr.RKey()})
		f.run(time.Second)
		check(t, op.String(), pollAll(a.scq), want{1, WCSuccess, wcOpcodeOf(op)})
	}
}

// TestRNRWait: the RNR wait is the IBTA time rounded up to whole ticks,
// at least one, as rxe's usecs_to_jiffies and max(..., 1) round it; a
// negative tick leaves the IBTA time as it is.
func TestRNRWait(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		v    uint8
		tick time.Duration
		want time.Duration
	}{
		{1, DefaultRNRTick, 4 * ms},        // 10 us
		{12, DefaultRNRTick, 4 * ms},       // 0.64 ms (perftest, ibv_rc_pingpong)
		{16, DefaultRNRTick, 4 * ms},       // 2.56 ms
		{18, DefaultRNRTick, 8 * ms},       // 5.12 ms
		{20, DefaultRNRTick, 12 * ms},      // 10.24 ms
		{0, DefaultRNRTick, 656 * ms},      // 655.36 ms
		{12, ms, ms},                       // HZ=1000
		{20, ms, 11 * ms},                  // HZ=1000
		{12, -1, 640 * time.Microsecond},   // exact
		{0, -1, 655360 * time.Microsecond}, // exact
		{31, DefaultRNRTick, 492 * ms},     // 491.52 ms
	} {
		if got := RNRWait(c.v, c.tick); got != c.want {
			t.Errorf("RNRWait(%d, %v) = %v, want %v", c.v, c.tick, got, c.want)
		}
	}
}

// TestRNRPace: against a responder that never posts a receive and asks
// for 0.64 ms (min_rnr_timer 12, perftest's and ibv_rc_pingpong's), a
// requester with rnr_retry 7 tries once per 4 ms tick as rxe at HZ=250
// does: 375 RNR NAKs in 1.5 s (plus the first), where the bare IBTA wait
// gave 2,343. None counts in completer_retry_err.
func TestRNRPace(t *testing.T) {
	for _, c := range []struct {
		tick time.Duration
		want int
	}{{DefaultRNRTick, 376}, {-1, 2344}} {
		o := defaultConn()
		o.rnr, o.minRN = 7, 12
		f, a, _ := pair(t, RC, o)
		a.n.e.cfg.RNRTick = c.tick
		lmr, _ := a.n.reg(t, 64, allAccess)
		naks := 0
		f.tap = func(p wirePkt, pkt bth.Packet) {
			if isRNR(pkt) {
				naks++
			}
		}
		a.post(t, SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 0, 64)})
		f.run(1500 * time.Millisecond)
		if naks != c.want {
			t.Errorf("tick %v: %d RNR NAKs in 1.5 s, want %d", c.tick, naks, c.want)
		}
		if got := a.n.e.Stats.CompleterRetryErr.Load(); got != 0 {
			t.Errorf("tick %v: completer_retry_err %d, want 0", c.tick, got)
		}
	}
}
