package metrics_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testaddr"
	"github.com/rxego/rxego/metrics"
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

// TestCountersMove runs ten 1 KiB RDMA WRITEs and checks that a scrape
// sees exactly the packets, requests and bytes they caused.
func TestCountersMove(t *testing.T) {
	var devs [2]*rxego.Device
	var qps [2]*rxego.QP
	var mrs [2]*rxego.MR
	var cqs [2]*rxego.CQ
	for i := range devs {
		d := testaddr.Open(t, nil)
		pd, _ := d.AllocPD()
		cqs[i], _ = d.CreateCQ(64)
		var err error
		qps[i], err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cqs[i], RecvCQ: cqs[i], Caps: rxego.Caps{MaxSendWR: 32, MaxRecvWR: 32}})
		if err != nil {
			t.Fatal(err)
		}
		mrs[i], _ = pd.RegMR(make([]byte, 16<<10), rxego.AccessLocalWrite|rxego.AccessRemoteWrite)
		devs[i] = d
	}
	for i := range 2 {
		o := 1 - i
		if err := rxego.ConnectRC(qps[i], rxego.RemoteQP{Addr: devs[o].Addr(), QPN: qps[o].Num()}, nil); err != nil {
			t.Fatal(err)
		}
	}
	c := metrics.NewCollector(devs[0], devs[1])
	srv := httptest.NewServer(metrics.Handler(c))
	defer srv.Close()
	before := scrape(t, srv.URL)
	const n, size = 10, 1024
	for k := 0; k < n; k++ {
		err := qps[0].PostSend(rxego.SendWR{ID: uint64(k), Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
			SGL:        []rxego.SGE{{Addr: mrs[0].IOVA(), Length: size, LKey: mrs[0].LKey()}},
			RemoteAddr: mrs[1].IOVA() + uint64(k*size), RKey: mrs[1].RKey()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		wc := make([]rxego.WC, 1)
		if _, err := cqs[0].PollWait(ctx, wc); err != nil || wc[0].Status != 0 {
			t.Fatalf("write %d: %v %+v", k, err, wc[0])
		}
		cancel()
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
	}
	for _, ch := range checks {
		if got := delta(ch.name, ch.dev); got != ch.want {
			t.Errorf("%s{%s} moved by %v, want %v", ch.name, ch.dev, got, ch.want)
		}
	}
	if _, ok := after[fmt.Sprintf(`rxego_qp_rate_bps{device=%q,qp="%d"}`, a, qps[0].Num())]; !ok {
		t.Error("per-QP DCQCN rate missing")
	}
}
