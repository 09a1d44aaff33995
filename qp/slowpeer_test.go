package qp

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

// TestLivenessSlowResponder is the liveness checker's slow-responder
// impairment (issue 23): several RC QPs on one host send the checker's
// random work (SENDs, WRITEs, READs, atomics, up to 20-packet messages)
// to QPs on a host that takes in a fixed number of packets per
// millisecond and drops what arrives beyond a short queue, as a loaded
// VM behind a NIC ring does. Every work request must complete, once and
// right (the checker's flow checks), and the requester must not bury the
// slow host in resends: the retransmitted packets stay within
// slowRetransmitBound of the packets sent once. Before the congestion
// window, every timeout resent whole windows from every QP at once:
// the same runs resent up to 131% of what they sent once.
func TestLivenessSlowResponder(t *testing.T) {
	cases := []struct {
		name    string
		qps     int
		perMs   int   // packets the slow host takes in per millisecond
		queue   int   // packets it holds waiting
		timeout uint8 // local ACK timeout (8: 1 ms, 10: 4 ms)
		mtu     MTU
		loss    float64 // share of request packets lost on the way, at random
		bound   float64 // retransmitted per packet sent once; see slowRetransmitBound
	}{
		{"4QPs-100pps-q64", 4, 100, 64, 10, MTU1024, 0, slowRetransmitBound},
		{"8QPs-100pps-q128", 8, 100, 128, 10, MTU1024, 0, slowRetransmitBound},
		{"6QPs-200pps-q64-mtu256", 6, 200, 64, 10, MTU256, 0, slowRetransmitBound},
		// The queue takes longer to drain (2.5 ms) than the timeout
		// (1 ms): timeouts fire on packets that are only waiting, as
		// with perftest's timeout against a loaded rxe guest.
		{"8QPs-100pps-q256-short-timeout", 8, 100, 256, 8, MTU1024, 0, slowRetransmitBound},
		// Eight QPs' least windows (2 PSNs each) fill half the 32-packet
		// queue: every increase overflows it, and Go-back-N resends what
		// followed each loss. Resending whole windows cost 107% here
		// (this case was bounded at 40% before the loss cap, window.go's
		// lossShare); 9.7% with it.
		{"8QPs-50pps-q32", 8, 50, 32, 10, MTU1024, 0, slowRetransmitBound},
		// And 1 % of the requests lost besides, as the lab's lossy
		// slow-peer cases (TestGoBackNLoss1Percent): each loss costs
		// Go-back-N what is in flight behind it.
		{"8QPs-100pps-q128-loss1", 8, 100, 128, 10, MTU1024, 0.01, slowRetransmitBound},
	}
	seeds := uint64(4)
	if *livenessLong {
		seeds = 100
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var retx, sent, slowDrops uint64
			for s := uint64(1); s <= seeds; s++ {
				seed := s<<32 | uint64(c.qps)<<8 | uint64(c.perMs)
				r, msg := runSlowResponder(t, seed, c.qps, c.perMs, c.queue, c.timeout, c.mtu, c.loss)
				if msg != "" {
					t.Fatalf("seed %d: %s", seed, msg)
				}
				retx += r.retransmits
				sent += r.sent
				slowDrops += uint64(r.slowDrops)
			}
			ratio := float64(retx) / float64(sent-retx)
			t.Logf("%d seeds: %d request packets, %d retransmitted (%.1f%% of those sent once), %d dropped by the slow host",
				seeds, sent, retx, 100*ratio, slowDrops)
			if retx == 0 {
				t.Fatalf("nothing was retransmitted: the slow host never fell behind, the case tests nothing")
			}
			if ratio > c.bound {
				t.Fatalf("%.1f%% of the packets sent once were sent again, bound %.0f%%", 100*ratio, 100*c.bound)
			}
		})
	}
}

// slowRetransmitBound bounds retransmitted request packets per packet
// sent once against a slow responder whose queue holds more than the
// QPs' least windows. The lab asks at most 10% against rxe. Here the
// queues are far shorter than a real host's rings and backlog, the
// checker's flows are short (slow start's overshoot weighs more) and
// Go-back-N resends every packet behind a loss: the congestion window
// with its loss cap measured 3.6-9.7% in these cases (4 seeds each),
// halving alone 4.8-13.1%, resending whole windows (before either)
// 16-131%, so 12% catches a requester that stops backing off.
const slowRetransmitBound = 0.12

type slowResult struct {
	retransmits, sent uint64
	slowDrops         int
}

// runSlowResponder runs one seed: qps flows from host A to the slow host
// B, then checks every flow as the liveness checker does.
func runSlowResponder(t *testing.T, seed uint64, qps, perMs, queue int, timeout uint8, mtu MTU, loss float64) (slowResult, string) {
	rng := rand.New(rand.NewPCG(seed, seed*0x9e3779b97f4a7c15))
	f := newFabric(t)
	f.rng = rand.New(rand.NewPCG(seed^1, seed))
	f.delay = func(wirePkt) time.Duration { return 10 * time.Microsecond } // in order, as one link
	slow := &slowRx{service: time.Millisecond / time.Duration(perMs), queue: queue}
	slowAddr := netip.MustParseAddr("198.18.0.2")
	f.slow = map[netip.Addr]*slowRx{slowAddr: slow}
	if loss > 0 {
		f.drop = func(p wirePkt) bool { return p.dst.Addr() == slowAddr && f.rng.Float64() < loss }
	}
	f.engineCfg = func(c *Config) { c.InitialWindow = 64 } // as a device's engines (rxego.go)
	a, b := f.node("198.18.0.1"), f.node("198.18.0.2")
	o := defaultConn()
	o.mtu, o.timeout, o.rdAtomic = mtu, timeout, 4
	var flows []*lvFlow
	for i := range qps {
		x, y := a.newQP(t, RC, lvDepth), b.newQP(t, RC, lvDepth)
		o.apsn, o.bpsn = rng.Uint32N(1<<24), rng.Uint32N(1<<24)
		connect(t, x, y, o)
		fl := newFlow(f, rng, RC, x, y, mtu.Bytes(), 200+i, t)
		fl.alwaysRecv = true // RNR NAKs cause resends of their own (rnrhang_test.go)
		flows = append(flows, fl)
	}
	for _, fl := range flows {
		fl.start()
	}
	describe := func(why string) string {
		s := fmt.Sprintf("%s at %v (%d QPs, %d packets/ms, queue %d, timeout %d, mtu %d)", why, f.clock.now, qps, perMs, queue, timeout, mtu.Bytes())
		for i, fl := range flows {
			s += fmt.Sprintf("\n  flow %d: %d WRs, %d posted, %d completed; A %s", i, len(fl.wrs), fl.posted, fl.seen, dumpQP(fl.rq.qp))
		}
		return s
	}
	lastDone, lastSeen := f.clock.now, 0
	for {
		all, seen := true, 0
		for _, fl := range flows {
			fl.poll()
			if fl.fail != "" {
				return slowResult{}, describe(fl.fail)
			}
			all = all && fl.seen == len(fl.wrs)
			seen += fl.seen
		}
		if all {
			break
		}
		if seen != lastSeen {
			lastDone, lastSeen = f.clock.now, seen
		}
		if f.clock.now-lastDone > lvStall {
			return slowResult{}, describe(fmt.Sprintf("no completion for %v", lvStall))
		}
		if f.clock.now > lvBound {
			return slowResult{}, describe(fmt.Sprintf("WRs outstanding after %v", lvBound))
		}
		if !f.step(f.clock.now + lvStall) {
			return slowResult{}, describe("hang: work outstanding, no packet in flight, no timer armed")
		}
	}
	f.run(100 * time.Millisecond)
	for _, fl := range flows {
		fl.poll()
		fl.finish()
		if fl.fail != "" {
			return slowResult{}, describe(fl.fail)
		}
		if fl.errSeen {
			return slowResult{}, describe("a work request failed (retry_cnt 7 is never spent here)")
		}
	}
	st := &a.e.Stats
	// A sends requests only: the flows all go from A to B.
	return slowResult{retransmits: st.Retransmits.Load(), sent: st.SentPkts.Load(), slowDrops: slow.dropped}, ""
}
