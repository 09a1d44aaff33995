package metrics_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/testaddr"
	"github.com/rxego/rxego/metrics"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// scrape fetches /metrics and returns each sample line's value by its
// full name with labels.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// connectedPairs opens two devices and connects n RC QP pairs between
// them, each QP with its own CQ entries and a 16 KiB MR.
func connectedPairs(t *testing.T, n int) (devs [2]*rxego.Device, qps [2][]*rxego.QP, mrs [2]*rxego.MR, cqs [2]*rxego.CQ) {
	t.Helper()
	return connectedPairsWith(t, n, nil)
}

// connectedPairsWith is connectedPairs with the devices opened with opts.
func connectedPairsWith(t *testing.T, n int, opts *rxego.Options) (devs [2]*rxego.Device, qps [2][]*rxego.QP, mrs [2]*rxego.MR, cqs [2]*rxego.CQ) {
	t.Helper()
	for i := range devs {
		d := testaddr.Open(t, opts)
		pd, _ := d.AllocPD()
		cqs[i], _ = d.CreateCQ(64)
		for range n {
			q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cqs[i], RecvCQ: cqs[i], Caps: rxego.Caps{MaxSendWR: 32, MaxRecvWR: 32}})
			if err != nil {
				t.Fatal(err)
			}
			qps[i] = append(qps[i], q)
		}
		mrs[i], _ = pd.RegMR(make([]byte, 16<<10), rxego.AccessLocalWrite|rxego.AccessRemoteWrite)
		devs[i] = d
	}
	for k := range n {
		for i := range 2 {
			o := 1 - i
			if err := qps[i][k].Connect(rxego.RemoteQP{Addr: devs[o].Addr(), QPN: qps[o][k].Num()}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	return devs, qps, mrs, cqs
}

// writeWait has q WRITE size bytes from the start of mrs[0] to offset off
// of mrs[1], signalled, and waits for its completion on cq.
func writeWait(t *testing.T, q *rxego.QP, cq *rxego.CQ, mrs [2]*rxego.MR, k, size int, off uint64) {
	t.Helper()
	err := q.PostSend(rxego.SendWR{ID: uint64(k), Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
		SGL:        []rxego.SGE{{Addr: mrs[0].IOVA(), Length: uint32(size), LKey: mrs[0].LKey()}},
		RemoteAddr: mrs[1].IOVA() + off, RKey: mrs[1].RKey()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wc := make([]rxego.WC, 1)
	if _, err := cq.PollWait(ctx, wc); err != nil || wc[0].Status != 0 {
		t.Fatalf("write %d: %v %+v", k, err, wc[0])
	}
}

// TestCountersMove runs ten 1 KiB RDMA WRITEs and checks that a scrape
// sees exactly the packets, requests and bytes they caused.
func TestCountersMove(t *testing.T) {
	devs, qpl, mrs, cqs := connectedPairs(t, 1)
	qps := [2]*rxego.QP{qpl[0][0], qpl[1][0]}
	c := metrics.NewCollector(devs[0], devs[1])
	srv := httptest.NewServer(metrics.Handler(c))
	defer srv.Close()
	before := scrape(t, srv.URL)
	const n, size = 10, 1024
	for k := 0; k < n; k++ {
		writeWait(t, qps[0], cqs[0], mrs, k, size, uint64(k*size))
	}
	after := scrape(t, srv.URL)
	a, b := devs[0].Addr().String(), devs[1].Addr().String()
	delta := func(name, dev string) float64 {
		key := fmt.Sprintf(`%s{device=%q}`, name, dev)
		if _, ok := after[key]; !ok {
			t.Fatalf("metric %s missing", key)
		}
		return after[key] - before[key]
	}
	checks := []struct {
		name, dev string
		want      float64
	}{
		{"rxego_rdma_sends_total", a, n}, {"rxego_rdma_recvs_total", b, n},
		{"rxego_sent_pkts_total", a, n}, {"rxego_rcvd_pkts_total", b, n},
		{"rxego_sent_pkts_total", b, n}, {"rxego_rcvd_pkts_total", a, n}, // one ACK per one-packet WRITE
		{"rxego_sent_payload_bytes_total", a, n * size}, {"rxego_rcvd_payload_bytes_total", b, n * size},
		{"rxego_retransmitted_pkts_total", a, 0}, {"rxego_duplicate_request_total", b, 0},
		// One-packet WRITEs answered one at a time: no read stays busy
		// for a millisecond, so no reader is woken for another.
		{"rxego_transport_parked_kicks_total", a, 0}, {"rxego_transport_parked_kicks_total", b, 0},
	}
	for _, ch := range checks {
		if got := delta(ch.name, ch.dev); got != ch.want {
			t.Errorf("%s{%s} moved by %v, want %v", ch.name, ch.dev, got, ch.want)
		}
	}
	for key := range after {
		if strings.HasPrefix(key, "rxego_qp_") {
			t.Errorf("per-QP series %s exported without Options.PerQP", key)
		}
		checkLabelStyle(t, key)
	}
}

// labelValue matches a snake_case label value (or a number or address,
// which the device and qp labels hold).
var labelValue = regexp.MustCompile(`^[a-z0-9_.:\[\]]+$`)

// checkLabelStyle fails when a sample's label values are not snake_case.
func checkLabelStyle(t *testing.T, key string) {
	t.Helper()
	for _, m := range regexp.MustCompile(`="([^"]*)"`).FindAllStringSubmatch(key, -1) {
		if !labelValue.MatchString(m[1]) {
			t.Errorf("%s: label value %q is not snake_case", key, m[1])
		}
	}
}

// TestDropReasonLabels checks every drop reason of the engine and of the
// transport, the label values of rxego_dropped_pkts_total and
// rxego_transport_dropped_pkts_total, for one style: snake_case.
func TestDropReasonLabels(t *testing.T) {
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	var names []string
	for _, r := range qp.DropReasons() {
		names = append(names, r.String())
	}
	for r := transport.DropReason(0); r < transport.NumDropReasons; r++ {
		names = append(names, r.String())
	}
	for _, n := range names {
		if !snake.MatchString(n) {
			t.Errorf("drop reason %q is not snake_case", n)
		}
	}
	if len(names) < 10 {
		t.Fatalf("only %d drop reasons", len(names))
	}
}

// TestPerQPSeries connects three QP pairs, runs WRITEs on the third, and
// checks the per-QP series: none by default, the lowest-numbered PerQP
// QPs with their own series, and the rest summed under qp="other".
func TestPerQPSeries(t *testing.T) {
	devs, qps, mrs, cqs := connectedPairs(t, 3)
	for k := range 4 {
		writeWait(t, qps[0][2], cqs[0], mrs, k, 64, 0)
	}
	a := devs[0].Addr().String()
	srv := httptest.NewServer(metrics.Handler(metrics.NewCollector(devs[0])))
	defer srv.Close()
	def := scrape(t, srv.URL)
	if v := def[fmt.Sprintf(`rxego_dcqcn_qps{device=%q}`, a)]; v != 3 {
		t.Errorf("rxego_dcqcn_qps = %v, want 3", v)
	}
	for key := range def {
		if strings.HasPrefix(key, "rxego_qp_") {
			t.Errorf("default collector exports %s", key)
		}
	}

	srv2 := httptest.NewServer(metrics.Handler(metrics.NewCollectorOptions(metrics.Options{PerQP: 2}, devs[0])))
	defer srv2.Close()
	m := scrape(t, srv2.URL)
	ids := map[string]bool{}
	for key := range m {
		if strings.HasPrefix(key, "rxego_qp_") {
			checkLabelStyle(t, key)
			ids[regexp.MustCompile(`qp="([^"]*)"`).FindStringSubmatch(key)[1]] = true
		}
	}
	nums := []uint32{qps[0][0].Num(), qps[0][1].Num(), qps[0][2].Num()}
	slices.Sort(nums)
	want := map[string]bool{strconv.Itoa(int(nums[0])): true, strconv.Itoa(int(nums[1])): true, metrics.OtherQPs: true}
	if !maps.Equal(ids, want) {
		t.Errorf("qp label values %v, want %v", ids, want)
	}
	for _, name := range []string{"rxego_qp_rate_bits_per_second", "rxego_qp_target_rate_bits_per_second", "rxego_qp_alpha"} {
		key := fmt.Sprintf(`%s{device=%q,qp="%d"}`, name, a, nums[0])
		if v, ok := m[key]; !ok || v <= 0 && name != "rxego_qp_alpha" {
			t.Errorf("%s = %v (present %v), want a positive rate", key, v, ok)
		}
		if _, ok := m[fmt.Sprintf(`%s{device=%q,qp=%q}`, name, a, metrics.OtherQPs)]; ok {
			t.Errorf("gauge %s summed under qp=other", name)
		}
	}
	// The counters summed under "other" are the third QP's.
	cs, _ := qps[0][2].CongestionStats()
	if k := fmt.Sprintf(`rxego_qp_rate_cuts_total{device=%q,qp=%q}`, a, metrics.OtherQPs); m[k] != float64(cs.RateCuts) {
		t.Errorf("%s = %v, want %d", k, m[k], cs.RateCuts)
	}
	if _, ok := m[fmt.Sprintf(`rxego_qp_cnps_sent_total{device=%q,qp=%q}`, a, metrics.OtherQPs)]; !ok {
		t.Error("no qp=other CNP counter")
	}
}

// TestQuietsAndRejoins busy-polls a CQ of a device in busy-poll mode until its receive
// goroutine takes its socket out of the kernel's wait queues, then stops
// polling until the goroutine's own wait puts it back, and checks that a
// scrape reports both as the transport counted them.
func TestQuietsAndRejoins(t *testing.T) {
	// Busy polling on: a receive goroutine stands back only then.
	devs, qpl, mrs, cqs := connectedPairsWith(t, 1, &rxego.Options{BusyPoll: 200 * time.Millisecond})
	c := metrics.NewCollector(devs[0])
	srv := httptest.NewServer(metrics.Handler(c))
	defer srv.Close()
	a := devs[0].Addr().String()
	before := scrape(t, srv.URL)
	for _, name := range []string{"rxego_transport_quiets_total", "rxego_transport_rejoins_total"} {
		if _, ok := before[fmt.Sprintf(`%s{device=%q}`, name, a)]; !ok {
			t.Fatalf("metric %s missing", name)
		}
	}
	wcs := make([]rxego.WC, 4)
	// Busy-poll: WRITEs whose completions are taken by Poll alone, then
	// polling on with nothing to take, as a busy-polling application does.
	for k, end := 0, time.Now().Add(5*time.Second); devs[0].Transport().Stats().Quiets == 0; k++ {
		if time.Now().After(end) {
			t.Fatal("busy polling never took the socket out of the wait queues")
		}
		if k < 20 {
			if err := qpl[0][0].PostSend(rxego.SendWR{ID: uint64(k), Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
				SGL:        []rxego.SGE{{Addr: mrs[0].IOVA(), Length: 64, LKey: mrs[0].LKey()}},
				RemoteAddr: mrs[1].IOVA(), RKey: mrs[1].RKey()}); err != nil {
				t.Fatal(err)
			}
		}
		for range 50 {
			if _, err := cqs[0].Poll(wcs); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(100 * time.Microsecond)
	}
	// Stop polling for longer than BusyPoll: the receive goroutine takes
	// the socket back, and its next wait that blocks rejoins. WRITEs from
	// the peer give it packets to take in and then nothing to wait for.
	time.Sleep(300 * time.Millisecond)
	for k, end := 0, time.Now().Add(5*time.Second); devs[0].Transport().Stats().Rejoins == 0; k++ {
		if time.Now().After(end) {
			t.Fatal("the receive goroutine's waits never put the socket back in the wait queues")
		}
		writeWait(t, qpl[1][0], cqs[1], [2]*rxego.MR{mrs[1], mrs[0]}, k, 64, 0)
		time.Sleep(10 * time.Millisecond)
	}
	after := scrape(t, srv.URL)
	st := devs[0].Transport().Stats()
	for _, m := range []struct {
		name string
		now  uint64
	}{{"rxego_transport_quiets_total", st.Quiets}, {"rxego_transport_rejoins_total", st.Rejoins}} {
		key := fmt.Sprintf(`%s{device=%q}`, m.name, a)
		if got := after[key] - before[key]; got < 1 || after[key] > float64(m.now) {
			t.Errorf("%s moved by %v to %v; the transport counts %d now, and moved at least once", m.name, got, after[key], m.now)
		}
	}
}
