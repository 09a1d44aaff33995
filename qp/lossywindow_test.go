package qp

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
)

// TestGoBackNLoss1Percent is the lab's lossy slow-peer cases (conformance
// TestSlowPeer, issue 23) on virtual time: eight QPs each WRITE ten
// 64 KiB messages, or one QP READs five 1 MiB messages, to a peer that
// takes in about 60 packets per millisecond (an emulated rxe guest) while
// 1 % of the data packets (requests for the WRITEs, responses for the
// READ; ACKs and NAKs pass, as in the lab) are lost at random. Every byte
// must arrive, every work request complete once and successfully, and
// what went twice, counted as the lab counts it (resentRatio: the
// requester's retransmissions and the responses it discarded behind a
// gap, per packet sent or received that was not wasted), stay within
// lossyResentBound. Go-back-N resends everything in flight behind a loss,
// so this bounds the congestion window a loss finds.
func TestGoBackNLoss1Percent(t *testing.T) {
	cases := []struct {
		name       string
		read       bool
		qps, msgs  int
		size       int
		seeds      uint64
		windowSeen int // the congestion window must have been cut at least this often
	}{
		{"write-8QPs-64KiB", false, 8, 10, 64 << 10, 3, 10},
		{"read-1QP-1MiB", true, 1, 5, 1 << 20, 3, 10},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var wasted, useful, cuts uint64
			for s := uint64(1); s <= c.seeds; s++ {
				r := runLossy(t, s, c.read, c.qps, c.msgs, c.size)
				wasted += r.wasted
				useful += r.useful
				cuts += r.cuts
				t.Logf("seed %d: %s", s, r)
			}
			ratio := float64(wasted) / float64(useful)
			t.Logf("%d seeds: %.1f%% went twice (%d/%d), %d window cuts", c.seeds, 100*ratio, wasted, useful, cuts)
			if cuts < uint64(c.windowSeen) {
				t.Fatalf("%d window cuts: the loss never reached the requester, the case tests nothing", cuts)
			}
			if ratio > lossyResentBound {
				t.Fatalf("%.1f%% of the packets went twice, bound %.0f%%", 100*ratio, 100*lossyResentBound)
			}
		})
	}
}

// lossyResentBound is what issue 23 asks of the lab's 1 % loss cases.
const lossyResentBound = 0.10

// lossyResult is one seed's counts as the lab's resentRatio counts them.
type lossyResult struct {
	wasted, useful, cuts, retransmits, discarded, dropped uint64
	elapsed                                               time.Duration
}

func (r lossyResult) String() string {
	return fmt.Sprintf("%.1f%% (%d/%d): %d retransmitted, %d discarded, %d lost, %d window cuts, %v",
		100*float64(r.wasted)/float64(r.useful), r.wasted, r.useful, r.retransmits, r.discarded, r.dropped, r.cuts, r.elapsed)
}

// runLossy runs one seed of TestGoBackNLoss1Percent and checks the data.
func runLossy(t *testing.T, seed uint64, read bool, qps, msgs, size int) lossyResult {
	t.Helper()
	f := newFabric(t)
	f.rng = rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
	f.delay = func(wirePkt) time.Duration { return 100 * time.Microsecond }
	f.engineCfg = func(c *Config) {
		// As a device's engines (internal/device): slow start from 16,
		// READ requests and responses in flight sized from the socket.
		c.InitialWindow, c.ReadBudget, c.ReadChunk = 16, 256<<10, DefaultReadChunk
	}
	a, b := f.node("198.18.0.1"), f.node("198.18.0.2")
	// The slow side takes in (or, for the READ, sends) 60 packets per
	// millisecond, about what an emulated guest's rxe does.
	slowAt := b.addr.Addr()
	if read {
		slowAt = a.addr.Addr()
	}
	f.slow = map[netip.Addr]*slowRx{slowAt: {service: time.Millisecond / 60, queue: 1024}}
	f.drop = func(p wirePkt) bool {
		pkt, err := bth.Parse(append([]byte(nil), p.data...))
		return err == nil && pkt.Info.Opcode != bth.RCAck && f.rng.Float64() < 0.01
	}
	o := defaultConn()
	o.timeout = 14 // perftest's
	var eps [][2]*endpoint
	for range qps {
		x, y := a.newQP(t, RC, msgs+1), b.newQP(t, RC, msgs+1)
		o.apsn, o.bpsn = f.rng.Uint32N(1<<24), f.rng.Uint32N(1<<24)
		connect(t, x, y, o)
		eps = append(eps, [2]*endpoint{x, y})
	}
	lmr, lbuf := a.reg(t, qps*msgs*size, allAccess)
	rmr, rbuf := b.reg(t, qps*msgs*size, allAccess)
	src, dst := lbuf, rbuf
	if read {
		src, dst = rbuf, lbuf
	}
	fill(src, seed)
	for i, ep := range eps {
		for m := range msgs {
			off := (i*msgs + m) * size
			wr := SendWR{ID: uint64(off), Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, off, size), RemoteAddr: rmr.IOVA() + uint64(off), RKey: rmr.RKey()}
			if read {
				wr.Opcode = WRRead
			}
			if err := ep[0].qp.PostSend(wr); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Poll every millisecond of virtual time: the run ends when the last
	// work request completes.
	wcs := make([][]WC, len(eps))
	var finished time.Duration
	var poll func()
	poll = func() {
		done := 0
		for i, ep := range eps {
			wcs[i] = append(wcs[i], pollAll(ep[0].scq)...)
			done += len(wcs[i])
		}
		if done < qps*msgs {
			f.after(time.Millisecond, poll)
		} else {
			finished = f.clock.now
		}
	}
	f.after(0, poll)
	f.run(time.Minute)
	for i, ep := range eps {
		wcs := wcs[i]
		if len(wcs) != msgs {
			t.Fatalf("seed %d QP %d: %d of %d completions (%s)", seed, i, len(wcs), msgs, dumpQP(ep[0].qp))
		}
		for _, wc := range wcs {
			if wc.Status != WCSuccess {
				t.Fatalf("seed %d QP %d: %v", seed, i, wc.Status)
			}
		}
	}
	b.e.Sync()
	if !bytes.Equal(src, dst) {
		t.Fatalf("seed %d: the data differs", seed)
	}
	st := &a.e.Stats
	var r lossyResult
	r.retransmits = st.Retransmits.Load()
	r.discarded = st.Drops[DropDuplicate].Load() + st.Drops[DropOutOfSequence].Load() + st.Drops[DropStaleResponse].Load()
	r.wasted = r.retransmits + r.discarded
	r.useful = st.SentPkts.Load() + st.RcvdPkts.Load() - r.wasted
	r.cuts = st.WindowCuts.Load()
	r.dropped = uint64(f.dropped)
	r.elapsed = finished
	return r
}

// TestWindowGrowsBack shows the congestion window against a fast peer on
// virtual time, by the packets in flight on the wire (the highest PSN sent
// less the oldest unacknowledged, as each request arrives): a QP that
// starts with a small window (as a device's do) keeps about that many in
// flight at first, fills Config.Window once it has delivered startShare
// windows' worth without a loss, keeps a few PSNs in flight while 1 % of
// its packets are lost, and fills Config.Window again once the loss
// stops: the window grows back by TCP's additive increase, one PSN per
// window acknowledged.
func TestWindowGrowsBack(t *testing.T) {
	const window, initial, batch = 256, 16, 320
	o := defaultConn()
	f := newFabric(t)
	f.delay = func(wirePkt) time.Duration { return 20 * time.Microsecond }
	f.engineCfg = func(c *Config) { c.Window, c.InitialWindow = window, initial }
	a := f.node("198.18.0.1").newQP(t, RC, 2*batch)
	b := f.node("198.18.0.2").newQP(t, RC, 2*batch)
	connect(t, a, b, o)
	lossy := false
	f.drop = func(p wirePkt) bool { return lossy && p.dst == b.n.addr && f.rng.Float64() < 0.01 }
	var maxFlight, sumFlight, arrivals int
	f.tap = func(p wirePkt, _ bth.Packet) {
		if p.dst == b.n.addr {
			flight := int(a.qp.req.maxSent.Diff(a.qp.req.compPSN))
			maxFlight = max(maxFlight, flight)
			sumFlight += flight
			arrivals++
		}
	}
	src, _ := a.n.reg(t, o.mtu.Bytes(), allAccess)
	dst, _ := b.n.reg(t, o.mtu.Bytes(), allAccess)
	// phase WRITEs n one-packet messages, batch at a time, all of them
	// successfully, and returns the most packets in flight meanwhile.
	phase := func(n int) int {
		maxFlight, sumFlight, arrivals = 0, 0, 0
		for done := 0; done < n; {
			for range min(batch, n-done) {
				a.post(t, SendWR{Opcode: WRWrite, Flags: SendSignaled, SGL: sge(src, 0, o.mtu.Bytes()), RemoteAddr: dst.IOVA(), RKey: dst.RKey()})
			}
			f.run(time.Second)
			for _, wc := range pollAll(a.scq) {
				if wc.Status != WCSuccess {
					t.Fatalf("a WRITE completed with %v", wc.Status)
				}
				done++
			}
		}
		return maxFlight
	}
	if got := phase(4 * initial); got > initial {
		t.Fatalf("a fresh QP had %d packets in flight, want at most its initial window %d", got, initial)
	}
	phase(startShare * window)
	if got := phase(2 * batch); got != window {
		t.Fatalf("after %d loss-free PSNs %d packets were in flight, want Config.Window %d", startShare*window, got, window)
	}
	lossy = true
	phase(2000)
	cuts := a.n.e.Stats.WindowCuts.Load()
	// A loss every 100 PSNs or so: lossCap keeps about 100/lossShare in
	// flight; halving alone (TCP) averages about 1.2/sqrt(1 %), 12.
	phase(1000)
	if mean := float64(sumFlight) / float64(arrivals); cuts == 0 || mean > 10 {
		t.Fatalf("at 1 %% loss (%d window cuts) %.1f packets were in flight on average, want at most 10", cuts, mean)
	} else {
		t.Logf("at 1 %% loss %.1f packets in flight on average, at most %d", mean, maxFlight)
	}
	lossy = false
	n := 0
	for got := 0; got < window; n += 4 * batch {
		if n > 100_000 {
			t.Fatalf("%d loss-free PSNs after the loss, still %d packets in flight at most, want %d", n, got, window)
		}
		got = phase(4 * batch)
	}
	t.Logf("%d packets in flight again after at most %d loss-free PSNs", window, n)
}
