package dcqcn

import (
	"context"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"golang.org/x/sys/unix"
)

// cpuTime returns the process's user plus system CPU time.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// pair is one connected QP pair on the testbed with a registered buffer
// on each side.
type pair struct {
	send, recv *rxego.QP
	scq        *rxego.CQ
	wr         rxego.SendWR
}

// newPair connects a QP pair for WRITEs of size bytes.
func newPair(t *testing.T, tb *Testbed, size int) *pair {
	t.Helper()
	mk := func(d *rxego.Device) (*rxego.QP, *rxego.CQ, *rxego.MR) {
		pd, err := d.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		m, err := pd.RegMR(make([]byte, size), rxego.AccessLocalWrite|rxego.AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		cq, err := d.CreateCQ(256)
		if err != nil {
			t.Fatal(err)
		}
		q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq, RecvCQ: cq,
			Caps: rxego.Caps{MaxSendWR: 128, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return q, cq, m
	}
	sq, scq, smr := mk(tb.Sender)
	rq, _, rmr := mk(tb.Receiver)
	o := &rxego.ConnectOptions{MTU: rxego.MTU4096, Timeout: 16}
	if err := sq.Connect(rxego.RemoteQP{Addr: tb.Receiver.Addr(), QPN: rq.Num()}, o); err != nil {
		t.Fatal(err)
	}
	if err := rq.Connect(rxego.RemoteQP{Addr: tb.Sender.Addr(), QPN: sq.Num()}, o); err != nil {
		t.Fatal(err)
	}
	return &pair{send: sq, recv: rq, scq: scq, wr: rxego.SendWR{Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: smr.IOVA(), Length: uint32(size), LKey: smr.LKey()}}, RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}}
}

// write posts n WRITEs and waits for their completions.
func (p *pair) write(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	wrs := make([]rxego.SendWR, n)
	for i := range wrs {
		wrs[i] = p.wr
	}
	if err := p.send.PostSend(wrs...); err != nil { // one post: one kick of the requester
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	wcs := make([]rxego.WC, n)
	for got := 0; got < n; {
		k, err := p.scq.PollWait(ctx, wcs)
		if err != nil {
			t.Fatalf("%d of %d WRITEs completed: %v", got, n, err)
		}
		for _, wc := range wcs[:k] {
			if wc.Status != rxego.WCSuccess {
				t.Fatalf("WRITE completed with %v", wc.Status)
			}
		}
		got += k
	}
}

// TestPacedIdleEndpointIsIdle cuts a QP's rate with CNPs (the marker marks
// everything), lets it finish its work, and measures the process's CPU
// time over one second: an idle endpoint whose QP is paced below line rate
// must cost next to nothing (no polling, no pacing timer, and the DCQCN
// rate-increase timer left to lapse rather than firing every 2 ms). Then it
// sends at the paced rate and checks that the pacer lets packets out in
// batches (several per sendmmsg), not one system call per packet.
func TestPacedIdleEndpointIsIdle(t *testing.T) {
	cc := MarkerParams(LineRate)
	tb := newTestbed(t, &rxego.Options{Congestion: &cc})
	if err := tb.Marker.Set(1, 1); err != nil { // marks all but a trickle
		t.Fatal(err)
	}
	p := newPair(t, tb, MTU)
	// Each round trip of marked WRITEs brings a CNP and a cut; stop once
	// the rate is a tenth of line rate.
	var st rxego.CCStats
	for i := 0; i < 100; i++ {
		p.write(t, 16, 10*time.Second)
		if st, _ = p.send.CongestionStats(); st.Rate < LineRate/10 {
			break
		}
	}
	if st.CNPsRcvd == 0 || st.Rate >= LineRate/10 {
		t.Fatalf("rate not cut: %+v", st)
	}
	if err := tb.Marker.Off(); err != nil {
		t.Fatal(err)
	}

	const idle = time.Second
	before := cpuTime(t)
	time.Sleep(idle)
	used := cpuTime(t) - before
	after, _ := p.send.CongestionStats()
	t.Logf("paced to %s Mbit/s after %d CNPs; CPU time over %v idle: %v; rate after (timer events caught up): %s Mbit/s",
		mbps(float64(st.Rate)), st.CNPsRcvd, idle, used, mbps(float64(after.Rate)))
	if used > idle/20 {
		t.Errorf("an idle endpoint with a paced QP used %v of CPU in %v", used, idle)
	}
	if after.Rate <= st.Rate || after.Rate >= LineRate {
		t.Errorf("rate %d before the idle second, %d after: the missed rate-increase events should have raised it, short of line rate", st.Rate, after.Rate)
	}

	// Now send at the paced rate: 64 MTU-sized WRITEs in one post.
	s0 := tb.Sender.Transport().Stats()
	p.write(t, 64, 30*time.Second)
	s1 := tb.Sender.Transport().Stats()
	pkts, calls := s1.SentPackets-s0.SentPackets, s1.SendCalls-s0.SendCalls
	t.Logf("paced at %s Mbit/s: %d packets in %d sendmmsg calls", mbps(float64(after.Rate)), pkts, calls)
	if pkts < 64 || calls*4 > pkts {
		t.Errorf("%d packets took %d system calls: the pacer does not batch", pkts, calls)
	}
}
