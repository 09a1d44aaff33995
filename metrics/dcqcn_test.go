package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/congestion"
	"github.com/rxego/rxego/internal/testenv/testaddr"
	"github.com/rxego/rxego/metrics"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
	"github.com/rxego/rxego/transport/impair"
)

// openMarking opens a device whose received packets are all marked CE on
// arrival, as behind a congested switch.
func openMarking(t *testing.T, opts rxego.Options) (*rxego.Device, *impair.Conn) {
	t.Helper()
	for range 50 {
		addr := netip.AddrPortFrom(testaddr.Loopback(), rxego.DefaultPort)
		c, err := transport.Listen(addr, transport.Options{})
		if errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		imp := impair.Wrap(c, impair.Config{Seed: 1, Dir: impair.Recv, CE: 1})
		opts.Conn = imp
		d, err := rxego.Open(addr.String(), &opts)
		if err != nil {
			imp.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d, imp
	}
	t.Fatal("no free loopback address")
	return nil, nil
}

// TestDCQCNMetrics runs WRITEs into a device that sees every packet marked
// CE and checks each per-QP DCQCN metric against the QPs' own figures and
// the engine counters: CE marks and CNPs sent on the receiving QP, CNPs
// handled, rate cuts, current and target rate and alpha on the sending one.
func TestDCQCNMetrics(t *testing.T) {
	// No rate-increase timer and an alpha period far longer than the test:
	// the figures stand still between the scrape and the QPs' own stats.
	rp := congestion.PaperParams(qp.DefaultLineRate)
	rp.TimeReset, rp.AlphaPeriod = 0, time.Hour
	opts := rxego.Options{Congestion: &rxego.CongestionConfig{RP: rp}}
	a := testaddr.Open(t, &opts)
	b, imp := openMarking(t, opts)

	devs := []*rxego.Device{a, b}
	var qps [2]*rxego.QP
	var mrs [2]*rxego.MR
	var cqs [2]*rxego.CQ
	for i, d := range devs {
		pd, _ := d.AllocPD()
		cqs[i], _ = d.CreateCQ(64)
		var err error
		qps[i], err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cqs[i], RecvCQ: cqs[i], Caps: rxego.Caps{MaxSendWR: 32, MaxRecvWR: 32}})
		if err != nil {
			t.Fatal(err)
		}
		mrs[i], _ = pd.RegMR(make([]byte, 64<<10), rxego.AccessLocalWrite|rxego.AccessRemoteWrite)
	}
	for i := range 2 {
		o := 1 - i
		if err := qps[i].Connect(rxego.RemoteQP{Addr: devs[o].Addr(), QPN: qps[o].Num()}, nil); err != nil {
			t.Fatal(err)
		}
	}
	// One 64 KiB WRITE at a time: each round trip brings CNPs back.
	for k := range 8 {
		err := qps[0].PostSend(rxego.SendWR{ID: uint64(k), Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
			SGL: []rxego.SGE{{Addr: mrs[0].IOVA(), Length: 64 << 10, LKey: mrs[0].LKey()}}, RemoteAddr: mrs[1].IOVA(), RKey: mrs[1].RKey()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		wc := make([]rxego.WC, 1)
		if _, err := cqs[0].PollWait(ctx, wc); err != nil || wc[0].Status != 0 {
			t.Fatalf("write %d: %v %+v", k, err, wc[0])
		}
		cancel()
	}
	// CNPs may still be on their way to the sender: wait until it has
	// handled as many as the receiver sent (bounded).
	var sa, sb rxego.CCStats
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		sa, _ = qps[0].CongestionStats()
		sb, _ = qps[1].CongestionStats()
		if sa.CNPsRcvd == sb.CNPsSent || time.Now().After(end) {
			break
		}
	}

	srv := httptest.NewServer(metrics.Handler(metrics.NewCollectorOptions(metrics.Options{PerQP: 4}, a, b)))
	defer srv.Close()
	m := scrape(t, srv.URL)
	get := func(name string, d *rxego.Device, q *rxego.QP) float64 {
		t.Helper()
		key := fmt.Sprintf(`%s{device=%q}`, name, d.Addr().String())
		if q != nil {
			key = fmt.Sprintf(`%s{device=%q,qp="%d"}`, name, d.Addr().String(), q.Num())
		}
		v, ok := m[key]
		if !ok {
			t.Fatalf("metric %s missing", key)
		}
		return v
	}
	marked := imp.ImpairStats().Recv.CEMarked
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"receiver QP CE-marked packets", get("rxego_qp_ce_marked_pkts_total", b, qps[1]), float64(marked)},
		{"receiver engine CE-marked packets", get("rxego_ecn_marked_pkts_total", b, nil), float64(marked)},
		{"receiver QP CNPs sent", get("rxego_qp_cnps_sent_total", b, qps[1]), float64(sb.CNPsSent)},
		{"receiver engine CNPs sent", get("rxego_cnps_sent_total", b, nil), float64(sb.CNPsSent)},
		{"sender QP CNPs handled", get("rxego_qp_cnps_handled_total", a, qps[0]), float64(sb.CNPsSent)},
		{"sender engine CNPs received", get("rxego_cnps_received_total", a, nil), float64(sb.CNPsSent)},
		{"sender QP rate cuts", get("rxego_qp_rate_cuts_total", a, qps[0]), float64(sa.RateCuts)},
		{"sender QP rate", get("rxego_qp_rate_bits_per_second", a, qps[0]), float64(sa.Rate)},
		{"sender QP target rate", get("rxego_qp_target_rate_bits_per_second", a, qps[0]), float64(sa.Target)},
		{"sender QP alpha", get("rxego_qp_alpha", a, qps[0]), sa.Alpha},
	} {
		if c.got != c.want {
			t.Errorf("%s: metric %v, want %v", c.name, c.got, c.want)
		}
	}
	if marked == 0 || sb.CNPsSent == 0 || sa.RateCuts == 0 || sa.Rate >= qp.DefaultLineRate || sa.Target < sa.Rate || sa.Alpha <= 0 {
		t.Errorf("no congestion seen: %d marks; sender %+v; receiver %+v", marked, sa, sb)
	}
}
