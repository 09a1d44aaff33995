// Package metrics exposes rxego devices to Prometheus: the counters rdma_rxe
// shows in sysfs (same names and meanings, so both ends of an interop run
// compare directly), bytes, drops by reason, and, when asked for, each
// QP's DCQCN state.
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(metrics.NewCollector(dev))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// Names follow Prometheus' conventions: base units in the name
// (_bits_per_second, _bytes), _total on counters, and label values in
// snake_case (the drop reasons are the String of rxego.DropReason and
// transport.DropReason, which are snake_case for this).
package metrics

import (
	"cmp"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rxego/rxego"
	"github.com/rxego/rxego/transport"
)

// engineCounter names one engine counter as rxe's hw_counters do.
type engineCounter struct {
	name string
	help string
	get  func(*rxego.Stats) uint64
}

var engineCounters = []engineCounter{
	{"sent_pkts", "RoCE packets sent (rxe hw_counters sent_pkts).", func(c *rxego.Stats) uint64 { return c.SentPkts }},
	{"rcvd_pkts", "RoCE packets received and handed to the engine (rcvd_pkts).", func(c *rxego.Stats) uint64 { return c.RcvdPkts }},
	{"duplicate_request", "Duplicate requests received (duplicate_request).", func(c *rxego.Stats) uint64 { return c.DuplicateRequest }},
	{"out_of_seq_request", "Requests received ahead of the expected PSN (out_of_seq_request).", func(c *rxego.Stats) uint64 { return c.OutOfSeqRequest }},
	{"rcvd_rnr_err", "RNR NAKs received (rcvd_rnr_err).", func(c *rxego.Stats) uint64 { return c.RcvdRNRErr }},
	{"send_rnr_err", "RNR NAKs sent (send_rnr_err).", func(c *rxego.Stats) uint64 { return c.SendRNRErr }},
	{"rcvd_seq_err", "PSN sequence error NAKs received (rcvd_seq_err).", func(c *rxego.Stats) uint64 { return c.RcvdSeqErr }},
	{"ack_deferred", "ACKs coalesced into a later one (ack_deferred).", func(c *rxego.Stats) uint64 { return c.AckDeferred }},
	{"retry_exceeded_err", "Work requests failed with transport retry exceeded (retry_exceeded_err).", func(c *rxego.Stats) uint64 { return c.RetryExceededErr }},
	{"retry_rnr_exceeded_err", "Work requests failed with RNR retry exceeded (retry_rnr_exceeded_err).", func(c *rxego.Stats) uint64 { return c.RetryRNRExceededErr }},
	{"contradicting_responses", "NAKs behind the completed PSN answering a retransmission: the responder may be behind (forged response); each cuts the retries left.", func(c *rxego.Stats) uint64 { return c.ContradictingResponse }},
	{"completer_retry_err", "Go-back-N retries started (completer_retry_err).", func(c *rxego.Stats) uint64 { return c.CompleterRetryErr }},
	{"send_err", "Send errors (send_err).", func(c *rxego.Stats) uint64 { return c.SendErr }},
	{"rdma_sends", "RDMA WRITE/READ/atomic requests sent (rdma_sends; a long READ is several requests).", func(c *rxego.Stats) uint64 { return c.RDMASends }},
	{"rdma_recvs", "RDMA WRITE/READ/atomic requests received (rdma_recvs).", func(c *rxego.Stats) uint64 { return c.RDMARecvs }},
	{"sent_payload_bytes", "Payload bytes sent.", func(c *rxego.Stats) uint64 { return c.SentBytes }},
	{"rcvd_payload_bytes", "Payload bytes received.", func(c *rxego.Stats) uint64 { return c.RcvdBytes }},
	{"retransmitted_pkts", "Packets sent again by Go-back-N.", func(c *rxego.Stats) uint64 { return c.Retransmits }},
	{"window_cuts", "Congestion window cuts after a retransmission timeout or a sequence error NAK.", func(c *rxego.Stats) uint64 { return c.WindowCuts }},
	{"read_budget_waits", "READ requests held back until the device's READ responses in flight fit its socket buffer.", func(c *rxego.Stats) uint64 { return c.ReadBudgetWaits }},
	{"naks_sent", "NAKs sent (sequence, RNR, access, invalid request).", func(c *rxego.Stats) uint64 { return c.NAKsSent }},
	{"completions", "Work completions generated.", func(c *rxego.Stats) uint64 { return c.CompletionsGenerated }},
	{"flushed_work_requests", "Work requests completed with WR_FLUSH_ERR.", func(c *rxego.Stats) uint64 { return c.FlushedWorkRequests }},
	{"cnps_sent", "Congestion notification packets sent.", func(c *rxego.Stats) uint64 { return c.CNPsSent }},
	{"cnps_received", "Congestion notification packets received.", func(c *rxego.Stats) uint64 { return c.CNPsReceived }},
	{"ecn_marked_pkts", "Packets received marked Congestion Experienced.", func(c *rxego.Stats) uint64 { return c.ECNMarkedPktsReceived }},
}

// Options configure a Collector.
type Options struct {
	// PerQP is how many QPs per device get their own DCQCN series (rate,
	// target rate, alpha, CNPs sent and handled, CE marks, rate cuts:
	// seven series per QP). 0, the default, exports none: a series per QP
	// grows without bound with the QPs, which Prometheus pays for. With
	// PerQP > 0 the PerQP lowest-numbered QPs are exported (QP numbers
	// are handed out in increasing order, so a QP keeps its series while
	// it lives) and the counters of the rest are summed under
	// qp="other", so totals stay right at a bounded cost.
	PerQP int
}

// OtherQPs is the qp label value of the series summing the QPs beyond
// Options.PerQP.
const OtherQPs = "other"

// Collector is a prometheus.Collector for a set of rxego devices.
type Collector struct {
	mu      sync.Mutex
	devices []*rxego.Device
	opts    Options

	engine    []*prometheus.Desc
	drops     *prometheus.Desc
	udpDrops  *prometheus.Desc
	udpPkts   *prometheus.Desc
	udpBytes  *prometheus.Desc
	udpCalls  *prometheus.Desc
	udpKicks  *prometheus.Desc
	udpQuiets *prometheus.Desc
	udpRejoin *prometheus.Desc
	qpRate    *prometheus.Desc
	qpTarget  *prometheus.Desc
	qpAlpha   *prometheus.Desc
	qpCNPSent *prometheus.Desc
	qpCNPRcvd *prometheus.Desc
	qpCE      *prometheus.Desc
	qpCuts    *prometheus.Desc
	ccQPs     *prometheus.Desc
}

// NewCollector returns a collector for devs with the default Options (no
// per-QP series); Add adds more devices later.
func NewCollector(devs ...*rxego.Device) *Collector {
	return NewCollectorOptions(Options{}, devs...)
}

// NewCollectorOptions is NewCollector with options.
func NewCollectorOptions(o Options, devs ...*rxego.Device) *Collector {
	dev := []string{"device"}
	qpl := []string{"device", "qp"}
	c := &Collector{
		devices:   devs,
		opts:      o,
		ccQPs:     prometheus.NewDesc("rxego_dcqcn_qps", "QPs of a device with DCQCN state (the per-QP series cover at most --metrics-per-qp of them).", dev, nil),
		drops:     prometheus.NewDesc("rxego_dropped_pkts_total", "Received packets the engine dropped, by reason.", []string{"device", "reason"}, nil),
		udpDrops:  prometheus.NewDesc("rxego_transport_dropped_pkts_total", "Datagrams the UDP transport dropped, by reason (bad ICRC, not RoCE, ...).", []string{"device", "reason"}, nil),
		udpPkts:   prometheus.NewDesc("rxego_transport_pkts_total", "RoCE packets through the UDP transport, by direction.", []string{"device", "dir"}, nil),
		udpBytes:  prometheus.NewDesc("rxego_transport_bytes_total", "UDP payload bytes through the transport, by direction.", []string{"device", "dir"}, nil),
		udpCalls:  prometheus.NewDesc("rxego_transport_syscalls_total", "sendmmsg/recvmmsg calls, by direction.", []string{"device", "dir"}, nil),
		udpKicks:  prometheus.NewDesc("rxego_transport_parked_kicks_total", "Readers of the process's other sockets that this device's busy reads woke: parked while a datagram waited for them (transport.Stats.ParkedKicks).", []string{"device"}, nil),
		udpQuiets: prometheus.NewDesc("rxego_transport_quiets_total", "Times the device's receive goroutine took its socket out of the kernel's wait queues because the application busy-polled it (transport.Stats.Quiets).", []string{"device"}, nil),
		udpRejoin: prometheus.NewDesc("rxego_transport_rejoins_total", "Times a wait that had to block put the socket back in the kernel's wait queues (transport.Stats.Rejoins).", []string{"device"}, nil),
		qpRate:    prometheus.NewDesc("rxego_qp_rate_bits_per_second", "DCQCN current rate of a QP.", qpl, nil),
		qpTarget:  prometheus.NewDesc("rxego_qp_target_rate_bits_per_second", "DCQCN target rate of a QP.", qpl, nil),
		qpAlpha:   prometheus.NewDesc("rxego_qp_alpha", "DCQCN alpha of a QP.", qpl, nil),
		qpCNPSent: prometheus.NewDesc("rxego_qp_cnps_sent_total", "CNPs a QP sent for CE-marked packets (qp=\"other\": the QPs beyond the per-QP limit).", qpl, nil),
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
	for _, d := range []*prometheus.Desc{c.drops, c.udpDrops, c.udpPkts, c.udpBytes, c.udpCalls, c.udpKicks, c.udpQuiets, c.udpRejoin,
		c.qpRate, c.qpTarget, c.qpAlpha, c.qpCNPSent, c.qpCNPRcvd, c.qpCE, c.qpCuts, c.ccQPs} {
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
			counter(c.engine[i], ec.get(&st), name)
		}
		for _, r := range rxego.DropReasons() {
			counter(c.drops, st.Drops[r], name, r.String())
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
		counter(c.udpKicks, ts.ParkedKicks, name)
		counter(c.udpQuiets, ts.Quiets, name)
		counter(c.udpRejoin, ts.Rejoins, name)
		c.collectQPs(dev, name, counter, gauge)
	}
}

// collectQPs exports the DCQCN state of dev's first Options.PerQP QPs by
// number, and the summed counters of the rest under qp="other".
func (c *Collector) collectQPs(dev *rxego.Device, name string, counter func(*prometheus.Desc, uint64, ...string), gauge func(*prometheus.Desc, float64, ...string)) {
	qps := dev.QPs()
	slices.SortFunc(qps, func(a, b *rxego.QP) int { return cmp.Compare(a.Num(), b.Num()) })
	var cc int
	var other rxego.CCStats
	for _, q := range qps {
		cs, ok := q.CongestionStats()
		if !ok {
			continue
		}
		if cc++; cc > c.opts.PerQP {
			other.CNPsSent += cs.CNPsSent
			other.CNPsRcvd += cs.CNPsRcvd
			other.CEMarked += cs.CEMarked
			other.RateCuts += cs.RateCuts
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
	gauge(c.ccQPs, float64(cc), name)
	if c.opts.PerQP > 0 && cc > c.opts.PerQP {
		counter(c.qpCNPSent, other.CNPsSent, name, OtherQPs)
		counter(c.qpCNPRcvd, other.CNPsRcvd, name, OtherQPs)
		counter(c.qpCE, other.CEMarked, name, OtherQPs)
		counter(c.qpCuts, other.RateCuts, name, OtherQPs)
	}
}

// Handler returns an HTTP handler serving the devices' metrics (and the Go
// runtime's) in the Prometheus text format.
func Handler(c *Collector) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
