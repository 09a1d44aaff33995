package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cmd/rxego/internal/progress"
	"github.com/rxego/rxego/metrics"
	"github.com/rxego/rxego/transport"
	"github.com/rxego/rxego/transport/pcaptap"
)

// observeFlags are the recording and monitoring flags the long-running
// commands share (pingpong, perf, rping, ucmatose, demo):
//
//	--pcap FILE           record every RoCE packet the device sends and receives (pcapng)
//	--metrics-addr ADDR   serve Prometheus metrics on http://ADDR/metrics
//	--metrics-linger D    keep serving them this long after the run
//	--metrics-per-qp N    export the DCQCN series of up to N QPs per device
//	--progress            report progress on stderr even when it is not a terminal
//
// A command adds them with addObserveFlags, calls start after parsing,
// attach for each device it opens, and close at the end.
type observeFlags struct {
	pcap        string
	metricsAddr string
	linger      time.Duration
	perQP       int
	progress    bool

	mu   sync.Mutex
	w    *pcaptap.Writer
	coll *metrics.Collector
	srv  *http.Server
	ln   net.Listener
	devs []*rxego.Device
	rep  *progress.Reporter
}

// addObserveFlags registers the flags on fs.
func addObserveFlags(fs *flag.FlagSet) *observeFlags {
	o := &observeFlags{}
	fs.StringVar(&o.pcap, "pcap", "", "record every RoCE packet sent and received into this pcapng file (Wireshark, tshark and rxego trace read it)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on http://ADDR/metrics, e.g. 127.0.0.1:9479")
	fs.DurationVar(&o.linger, "metrics-linger", 0, "with --metrics-addr: keep serving this long after the run, for a last scrape")
	fs.IntVar(&o.perQP, "metrics-per-qp", 0, "with --metrics-addr: export each QP's DCQCN series for up to this many QPs per device (the rest summed as qp=\"other\"; 0: none)")
	fs.BoolVar(&o.progress, "progress", false, "report progress on stderr even when it is not a terminal")
	return o
}

// active reports whether any device needs observing.
func (o *observeFlags) active() bool {
	return o.pcap != "" || o.metricsAddr != "" || progress.Wanted(os.Stderr, o.progress)
}

// start opens the pcap file and the metrics listener, so that a bad path
// or a busy port fails before anything runs. It prints the metrics URL on
// stderr.
func (o *observeFlags) start() error {
	if o.pcap != "" {
		w, err := pcaptap.Create(o.pcap)
		if err != nil {
			return fmt.Errorf("--pcap: %w", err)
		}
		o.w = w
	}
	if o.perQP < 0 {
		o.closePcap()
		return fmt.Errorf("--metrics-per-qp %d: want 0 or more", o.perQP)
	}
	if o.metricsAddr != "" {
		if _, port, err := net.SplitHostPort(o.metricsAddr); err != nil || !isPort(port) {
			o.closePcap()
			return usageErrorf("--metrics-addr %q: want HOST:PORT with a port number, e.g. 127.0.0.1:9479", o.metricsAddr)
		}
		ln, err := net.Listen("tcp", o.metricsAddr)
		if err != nil {
			o.closePcap()
			return &flagListenError{flag: "--metrics-addr", err: err}
		}
		o.ln, o.coll = ln, metrics.NewCollectorOptions(metrics.Options{PerQP: o.perQP})
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.Handler(o.coll))
		o.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go o.srv.Serve(ln)
		fmt.Fprintf(os.Stderr, "%shttp://%s/metrics\n", metricsPrefix, ln.Addr())
	}
	return nil
}

// isPort reports whether s is a TCP port number.
func isPort(s string) bool {
	n, err := strconv.ParseUint(s, 10, 16)
	return err == nil && n <= 0xffff
}

// flagListenError is a listener a flag names (--metrics-addr) that could
// not be opened; its hint names that flag.
type flagListenError struct {
	flag string
	err  error
}

func (e *flagListenError) Error() string { return e.flag + ": " + e.err.Error() }
func (e *flagListenError) Unwrap() error { return e.err }

// metricsPrefix starts the line naming the metrics URL.
const metricsPrefix = "rxego: metrics on "

// attach records dev into --pcap, exports it on /metrics and reports its
// progress. Call it right after opening the device, before any QP is
// connected, so the capture misses nothing.
func (o *observeFlags) attach(dev *rxego.Device) {
	if t := o.tap(); t != nil {
		dev.SetTap(t)
	}
	o.export(dev)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.rep == nil {
		start := time.Now()
		o.rep = progress.Start(os.Stderr, progress.Wanted(os.Stderr, o.progress), func() string { return o.status(start) })
	}
}

// tap returns the --pcap writer as a Tap, or nil.
func (o *observeFlags) tap() transport.Tap {
	if o.w == nil {
		return nil
	}
	return o.w
}

// export exports dev on /metrics, without recording it or reporting its
// progress (for devices whose Tap and progress the caller manages).
func (o *observeFlags) export(dev *rxego.Device) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.coll != nil {
		o.coll.Add(dev)
	}
	o.devs = append(o.devs, dev)
}

// status is the progress line: packets and bytes moved by the devices.
func (o *observeFlags) status(start time.Time) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out, in, bytes uint64
	for _, d := range o.devs {
		s := d.Transport().Stats()
		out, in, bytes = out+s.SentPackets, in+s.RecvPackets, bytes+s.SentBytes+s.RecvBytes
	}
	secs := max(time.Since(start).Seconds(), 1e-3)
	return fmt.Sprintf("rxego: %.1fs, %d packets out, %d in, %.1f MB/s", secs, out, in, float64(bytes)/secs/1e6)
}

// openDevice is for commands whose library opens the device itself
// unless given one (perf): when a flag asks for observation, it opens the
// device on local (or, when local is not set, on the address the kernel
// would use towards server) and attaches it; otherwise it returns nil and
// the library opens its own. Progress alone does not force a device: a
// server that learns its address from the connection shows none. The
// caller closes the device.
func (o *observeFlags) openDevice(local netip.Addr, server string, opts *rxego.Options) (*rxego.Device, error) {
	needed := o.pcap != "" || o.metricsAddr != ""
	if !o.active() || !needed && !local.IsValid() && server == "" {
		return nil, nil
	}
	if !local.IsValid() {
		if server == "" {
			return nil, errors.New("--pcap and --metrics-addr need the local address (--addr) in server mode")
		}
		ips, err := net.LookupIP(server)
		if err != nil || len(ips) == 0 {
			return nil, fmt.Errorf("resolving %s: %v", server, err)
		}
		peer, _ := netip.AddrFromSlice(ips[0])
		if local, err = localFor(peer.Unmap()); err != nil {
			return nil, err
		}
	}
	dev, err := rxego.Open(netip.AddrPortFrom(local, rxego.DefaultPort).String(), opts)
	if err != nil {
		return nil, err
	}
	o.attach(dev)
	return dev, nil
}

// close stops the progress line, keeps serving metrics for --metrics-linger,
// stops the server, detaches the devices and closes the capture, saying
// where it is.
func (o *observeFlags) close() error {
	o.mu.Lock()
	rep := o.rep
	o.rep = nil
	o.mu.Unlock()
	rep.Stop()
	if o.srv != nil {
		time.Sleep(o.linger)
		o.srv.Close()
		o.srv = nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, d := range o.devs {
		d.SetTap(nil)
	}
	return o.closePcap()
}

// closePcap closes the capture file and says where it is.
func (o *observeFlags) closePcap() error {
	if o.w == nil {
		return nil
	}
	err := o.w.Close()
	if err == nil {
		fmt.Fprintf(os.Stderr, "rxego: %d packets recorded in %s\n", o.w.Packets(), o.pcap)
	}
	o.w = nil
	return err
}
