// Package metrics exposes rxego devices to Prometheus: the counters rdma_rxe
// shows in sysfs (same names and meanings, so both ends of an interop run
// compare directly), bytes, drops by reason, and each QP's DCQCN state.
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(metrics.NewCollector(dev))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
package metrics

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// engineCounter names one engine counter as rxe's hw_counters do.
type engineCounter struct {
	name string
	help string
	get  func(*qp.Counters) *atomic.Uint64
}

var engineCounters = []engineCounter{
	{"sent_pkts", "RoCE packets sent (rxe hw_counters sent_pkts).", func(c *qp.Counters) *atomic.Uint64 { return &c.SentPkts }},
	{"rcvd_pkts", "RoCE packets received and handed to the engine (rcvd_pkts).", func(c *qp.Counters) *atomic.Uint64 { return &c.RcvdPkts }},
	{"duplicate_request", "Duplicate requests received (duplicate_request).", func(c *qp.Counters) *atomic.Uint64 { return &c.DuplicateRequest }},
	{"out_of_seq_request", "Requests received ahead of the expected PSN (out_of_seq_request).", func(c *qp.Counters) *atomic.Uint64 { return &c.OutOfSeqRequest }},
	{"rcvd_rnr_err", "RNR NAKs received (rcvd_rnr_err).", func(c *qp.Counters) *atomic.Uint64 { return &c.RcvdRNRErr }},
	{"send_rnr_err", "RNR NAKs sent (send_rnr_err).", func(c *qp.Counters) *atomic.Uint64 { return &c.SendRNRErr }},
	{"rcvd_seq_err", "PSN sequence error NAKs received (rcvd_seq_err).", func(c *qp.Counters) *atomic.Uint64 { return &c.RcvdSeqErr }},
	{"ack_deferred", "ACKs coalesced into a later one (ack_deferred).", func(c *qp.Counters) *atomic.Uint64 { return &c.AckDeferred }},
	{"retry_exceeded_err", "Work requests failed with transport retry exceeded (retry_exceeded_err).", func(c *qp.Counters) *atomic.Uint64 { return &c.RetryExceededErr }},
	{"retry_rnr_exceeded_err", "Work requests failed with RNR retry exceeded (retry_rnr_exceeded_err).", func(c *qp.Counters) *atomic.Uint64 { return &c.RetryRNRExceededErr }},
	{"completer_retry_err", "Go-back-N retries started (completer_retry_err).", func(c *qp.Counters) *atomic.Uint64 { return &c.CompleterRetryErr }},
	{"send_err", "Send errors (send_err).", func(c *qp.Counters) *atomic.Uint64 { return &c.SendErr }},
	{"rdma_sends", "RDMA WRITE/READ/atomic requests sent (rdma_sends).", func(c *qp.Counters) *atomic.Uint64 { return &c.RDMASends }},
	{"rdma_recvs", "RDMA WRITE/READ/atomic requests received (rdma_recvs).", func(c *qp.Counters) *atomic.Uint64 { return &c.RDMARecvs }},
	{"sent_payload_bytes", "Payload bytes sent.", func(c *qp.Counters) *atomic.Uint64 { return &c.SentBytes }},
	{"rcvd_payload_bytes", "Payload bytes received.", func(c *qp.Counters) *atomic.Uint64 { return &c.RcvdBytes }},
	{"retransmitted_pkts", "Packets sent again by Go-back-N.", func(c *qp.Counters) *atomic.Uint64 { return &c.Retransmits }},
	{"naks_sent", "NAKs sent (sequence, RNR, access, invalid request).", func(c *qp.Counters) *atomic.Uint64 { return &c.NAKsSent }},
	{"completions", "Work completions generated.", func(c *qp.Counters) *atomic.Uint64 { return &c.CompletionsGenerated }},
	{"flushed_work_requests", "Work requests completed with WR_FLUSH_ERR.", func(c *qp.Counters) *atomic.Uint64 { return &c.FlushedWorkRequests }},
	{"cnps_sent", "Congestion notification packets sent.", func(c *qp.Counters) *atomic.Uint64 { return &c.CNPsSent }},
	{"cnps_received", "Congestion notification packets received.", func(c *qp.Counters) *atomic.Uint64 { return &c.CNPsReceived }},
	{"ecn_marked_pkts", "Packets received marked Congestion Experienced.", func(c *qp.Counters) *atomic.Uint64 { return &c.ECNMarkedPktsReceived }},
}

// Collector is a prometheus.Collector for a set of rxego devices.
type Collector struct {
	mu      sync.Mutex
	devices []*rxego.Device

	engine    []*prometheus.Desc
	drops     *prometheus.Desc
	udpDrops  *prometheus.Desc
	udpPkts   *prometheus.Desc
	udpBytes  *prometheus.Desc
	udpCalls  *prometheus.Desc
	qpRate    *prometheus.Desc
	qpTarget  *prometheus.Desc
	qpAlpha   *prometheus.Desc
	qpCNPSent *prometheus.Desc
	qpCNPRcvd *prometheus.Desc
	qpCE      *prometheus.Desc
	qpCuts    *prometheus.Desc
}

// NewCollector returns a collector for devs; Add adds more later.
func NewCollector(devs ...*rxego.Device) *Collector {
	dev := []string{"device"}
	qpl := []string{"device", "qp"}
	c := &Collector{
		devices:   devs,
		drops:     prometheus.NewDesc("rxego_dropped_pkts_total", "Received packets the engine dropped, by reason.", []string{"device", "reason"}, nil),
		udpDrops:  prometheus.NewDesc("rxego_transport_dropped_pkts_total", "Datagrams the UDP transport dropped, by reason (bad ICRC, not RoCE, ...).", []string{"device", "reason"}, nil),
		udpPkts:   prometheus.NewDesc("rxego_transport_pkts_total", "RoCE packets through the UDP transport, by direction.", []string{"device", "dir"}, nil),
		udpBytes:  prometheus.NewDesc("rxego_transport_bytes_total", "UDP payload bytes through the transport, by direction.", []string{"device", "dir"}, nil),
		udpCalls:  prometheus.NewDesc("rxego_transport_syscalls_total", "sendmmsg/recvmmsg calls, by direction.", []string{"device", "dir"}, nil),
		qpRate:    prometheus.NewDesc("rxego_qp_rate_bps", "DCQCN current rate of a QP, bits/s.", qpl, nil),
		qpTarget:  prometheus.NewDesc("rxego_qp_target_rate_bps", "DCQCN target rate of a QP, bits/s.", qpl, nil),
		qpAlpha:   prometheus.NewDesc("rxego_qp_alpha", "DCQCN alpha of a QP.", qpl, nil),
		qpCNPSent: prometheus.NewDesc("rxego_qp_cnps_sent_total", "CNPs a QP sent for CE-marked packets.", qpl, nil),
		qpCNPRcvd: prometheus.NewDesc("rxego_qp_cnps_handled_total", "CNPs a QP's reaction point handled.", qpl, nil),
		qpCE:      prometheus.NewDesc("rxego_qp_ce_marked_pkts_total", "CE-marked packets a QP received.", qpl, nil),
		qpCuts:    prometheus.NewDesc("rxego_qp_rate_cuts_total", "DCQCN rate decreases of a QP.", qpl, nil),
	}
	for _, ec := range engineCounters {
		c.engine = append(c.engine, prometheus.NewDesc("rxego_"+ec.name+"_total", ec.help, dev, nil))
	}
	return c
}

// Add adds a device to the collector.
func (c *Collector) Add(d *rxego.Device) {
	c.mu.Lock()
	c.devices = append(c.devices, d)
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.engine {
		ch <- d
	}
	for _, d := range []*prometheus.Desc{c.drops, c.udpDrops, c.udpPkts, c.udpBytes, c.udpCalls,
		c.qpRate, c.qpTarget, c.qpAlpha, c.qpCNPSent, c.qpCNPRcvd, c.qpCE, c.qpCuts} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	devs := append([]*rxego.Device(nil), c.devices...)
	c.mu.Unlock()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, dev := range devs {
		name := dev.Addr().String()
		st := dev.Stats()
		for i, ec := range engineCounters {
			counter(c.engine[i], ec.get(st).Load(), name)
		}
		for _, r := range qp.DropReasons() {
			counter(c.drops, st.Drops[r].Load(), name, r.String())
		}
		ts := dev.Transport().Stats()
		for r := transport.DropReason(0); r < transport.NumDropReasons; r++ {
			counter(c.udpDrops, ts.Drops[r], name, r.String())
		}
		counter(c.udpPkts, ts.SentPackets, name, "out")
		counter(c.udpPkts, ts.RecvPackets, name, "in")
		counter(c.udpBytes, ts.SentBytes, name, "out")
		counter(c.udpBytes, ts.RecvBytes, name, "in")
		counter(c.udpCalls, ts.SendCalls, name, "out")
		counter(c.udpCalls, ts.RecvCalls, name, "in")
		for _, q := range dev.QPs() {
			cs, ok := q.CongestionStats()
			if !ok {
				continue
			}
			n := strconv.FormatUint(uint64(q.Num()), 10)
			gauge(c.qpRate, float64(cs.Rate), name, n)
			gauge(c.qpTarget, float64(cs.Target), name, n)
			gauge(c.qpAlpha, cs.Alpha, name, n)
			counter(c.qpCNPSent, cs.CNPsSent, name, n)
			counter(c.qpCNPRcvd, cs.CNPsRcvd, name, n)
			counter(c.qpCE, cs.CEMarked, name, n)
			counter(c.qpCuts, cs.RateCuts, name, n)
		}
	}
}

// Handler returns an HTTP handler serving the devices' metrics (and the Go
// runtime's) in the Prometheus text format.
func Handler(c *Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
