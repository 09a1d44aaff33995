package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/app/perftest"
)

func init() {
	register("perf", "peer for perftest's ib_{send,write,read,atomic}_{bw,lat} (same TCP exchange, or rdma_cm with -R; same flags and tables)", runPerf)
	for _, t := range perftest.Tests {
		name := "ib_" + string(t)
		registerCTool(name, "peer for perftest's "+name+" (its flags exactly)", func(args []string) error {
			return perfCommand(name, perftest.Test(name[len("ib_"):]), args)
		})
	}
}

// holdPrefix starts the line --hold prints when rxego waits at the final
// synchronisation point.
const holdPrefix = "rxego-hold "

// perfFlags are the flags of `rxego perf`.
type perfFlags struct {
	fs                                       *flag.FlagSet
	size, iters, mtu, qps, tx, rx, outReads  *int
	port, cqMod, postList, duration, margin  *int
	qpTimeout                                *int
	all, rdmaCM, stats, bidir, gbits, events *bool
	infinite, gidTable                       *bool
	tos, tclass                              *int
	atomicOp, gid, addr, conn, hold, ifname  *string
	timeout                                  *time.Duration
	obs                                      *observeFlags
}

// newPerfFlags defines perf's flags: perftest's, with its long options
// (perftest_parameters.c), and rxego's own.
func newPerfFlags(name string) *perfFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	f := &perfFlags{fs: fs}
	fs.Usage = func() { perfUsage(fs) }
	f.size = fs.Int("s", 0, "message size (default 65536 for bw, 2 for lat, 8 for atomic)")
	f.all = fs.Bool("a", false, "run every size from 2 bytes to 8 MiB")
	f.iters = fs.Int("n", 0, "iterations (default 1000; 5000 for write_bw; at least 5)")
	f.mtu = fs.Int("m", 0, "path MTU: 256, 512, 1024, 2048 or 4096 (default 1024; the smaller of both sides' wins)")
	f.qps = fs.Int("q", 0, "number of QPs (bw tests)")
	f.tx = fs.Int("t", 0, "tx depth: outstanding work requests per QP (default 128 for bw, 1 for lat)")
	f.rx = fs.Int("r", 0, "rx depth: receives posted per QP (SEND tests; default 512, at most -n)")
	f.outReads = fs.Int("o", 0, "outstanding READs/atomics this side accepts (READ and atomic tests; default 128)")
	f.atomicOp = fs.String("A", "", "atomic operation: FETCH_AND_ADD (default) or CMP_AND_SWAP")
	f.port = fs.Int("p", perftest.DefaultPort, "TCP port of the exchange (with -R: the rdma_cm port)")
	f.gid = fs.String("x", "", "local RoCE address (the GID as an IP address), or a GID index of -d's interface as rxe numbers it (0 link-local, 1 IPv4, then IPv6; an index needs -d)")
	f.addr = fs.String("addr", "", "local RoCE address (same as -x ADDRESS; default: the address of the TCP exchange)")
	f.conn = fs.String("c", "RC", "connection type: RC (the only one rxego's perf speaks)")
	f.rdmaCM = fs.Bool("R", false, "connect with rdma_cm, as perftest's -R: the exchange over an rdma_cm-connected QP on port -p, each data QP its own rdma_cm connection (IPv4)")
	f.cqMod = fs.Int("Q", 0, "CQ moderation: request a completion every N work requests (bw tests; default 100, 1 above 8 KiB)")
	f.postList = fs.Int("l", 0, "post list: hand N work requests to the QP in one post (bw tests; -n must be a multiple)")
	f.qpTimeout = fs.Int("u", 14, "QP timeout: the ACK timeout is 4.096 us x 2^N (0: none)")
	f.events = fs.Bool("e", false, "sleep on CQ events (rxego's perf always does once its poll finds nothing; not with -D)")
	f.duration = fs.Int("D", 0, "run for N seconds instead of -n iterations (write/read/atomic bw; give it to both sides); no BW peak")
	f.margin = fs.Int("f", 0, "with -D: seconds left out of the measurement at the start and at the end (default 2)")
	f.infinite = fs.Bool("run_infinitely", false, "bw client: post until interrupted, printing a report every -D seconds (default 5); the server waits for the client to go")
	f.gbits = fs.Bool("report_gbits", false, "report bandwidth in Gb/s instead of MB/s")
	f.bidir = fs.Bool("b", false, "bidirectional: both sides post and each prints the sum (write_bw and read_bw; give it to both sides)")
	f.ifname = fs.String("d", "", "network interface whose GID table (as rxe's on it) an -x index names; otherwise accepted for compatibility")
	f.gidTable = fs.Bool("gid-table", false, gidTableUsage)
	f.tos = fs.Int("T", -1, "with -R: the IP TOS of the test's packets, 0-255 (rdma_cm's RDMA_OPTION_ID_TOS); ECN bits 00 become ECT(0) while DCQCN is on")
	f.tclass = fs.Int("tclass", -1, "without -R: the GRH traffic class of the test's packets, their IP TOS, 0-255; ECN bits 00 become ECT(0) while DCQCN is on")
	_ = fs.Int("i", 1, "IB port (accepted for compatibility)")
	_ = fs.Bool("F", false, "accepted for compatibility (perftest's CPU frequency warning)")
	f.timeout = fs.Duration("timeout", 2*time.Minute, "give up after this long (with --run_infinitely: no limit unless given)")
	f.stats = fs.Bool("stats", false, "print rxego's engine and transport counters as one JSON line (\"rxego-stats {...}\") at the end")
	f.obs = addObserveFlags(fs)
	f.hold = fs.String("hold", "", "test hook: at the final synchronisation, write what the peer's memory must hold to this JSON file, print \""+strings.TrimSpace(holdPrefix)+" FILE\" and wait until the file is removed")
	for short, longs := range map[string][]string{
		"p": {"port"}, "d": {"ib-dev"}, "i": {"ib-port"}, "m": {"mtu"}, "s": {"size"}, "n": {"iters"},
		"t": {"tx-depth"}, "u": {"qp-timeout"}, "x": {"gid-index"}, "a": {"all"}, "F": {"CPU-freq"},
		"c": {"connection"}, "q": {"qp"}, "e": {"events"}, "o": {"outs"}, "R": {"rdma_cm"}, "r": {"rx-depth"},
		"b": {"bidirectional"}, "Q": {"cq-mod"}, "A": {"atomic_type"}, "l": {"post_list"}, "D": {"duration"},
		"f": {"margin"}, "T": {"tos"},
	} {
		alias(fs, short, longs...)
	}
	return f
}

func runPerf(args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && isHelp(args[0]) {
			f := newPerfFlags("perf")
			f.fs.SetOutput(os.Stdout)
			f.fs.Usage()
			return errHelp
		}
		return usageErrorf("name the test first, e.g. rxego perf write_bw")
	}
	test := perftest.Test(strings.TrimSuffix(strings.TrimPrefix(args[0], "ib_"), ".c"))
	if !test.Valid() {
		return usageErrorf("unknown test %q; want one of %v", args[0], perftest.Tests)
	}
	return perfCommand("perf "+string(test), test, args[1:])
}

// perfCommand runs test with perf's flags: `rxego perf TEST` (name "perf
// TEST") or the command named after the perftest tool (ib_write_bw).
func perfCommand(name string, test perftest.Test, args []string) error {
	f := newPerfFlags(name)
	fs := f.fs
	// perftest's getopt lets the server name sit among the flags.
	operands, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(operands) > 1 {
		return usageErrorf("more than one server given: %q", operands)
	}
	var server string
	if len(operands) == 1 {
		server = operands[0]
	}
	if err := positive(fs, "s", "n", "m", "q", "t", "r", "o", "Q", "l", "D", "p"); err != nil {
		return err
	}
	if *f.conn != "RC" {
		return usageErrorf("-c %s: rxego perf runs RC only", *f.conn)
	}
	if err := inRange("u", int64(*f.qpTimeout), 0, 31); err != nil {
		return err
	}
	local := *f.addr
	sel, err := gidArg("x", *f.gid, *f.ifname, *f.gidTable)
	if err != nil {
		return err
	}
	if sel.index >= 0 && !sel.addr.IsValid() {
		return usageErrorf("-x %s: a GID index needs -d INTERFACE (or give the address with -x ADDRESS or --addr ADDRESS)", *f.gid)
	}
	if x := sel.addr; x.IsValid() {
		if local != "" && local != x.String() {
			return usageErrorf("-x %s and --addr %s disagree", *f.gid, local)
		}
		local = x.String()
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	var qpTimeout *uint8
	if set["u"] || set["qp-timeout"] {
		qpTimeout = new(uint8(*f.qpTimeout))
	}
	cfg := perftest.Config{Test: test, Atomic: perftest.AtomicOp(*f.atomicOp), Server: server, Port: *f.port, Size: *f.size,
		All: *f.all, Iters: *f.iters, MTU: *f.mtu, NumQPs: *f.qps, TxDepth: *f.tx, RxDepth: *f.rx, OutReads: *f.outReads,
		Timeout: *f.timeout, Out: os.Stdout, KeepDevice: true,
		CQMod: *f.cqMod, PostList: *f.postList, QPTimeout: qpTimeout, Events: *f.events,
		Duration: time.Duration(*f.duration) * time.Second, Margin: time.Duration(*f.margin) * time.Second,
		RunInfinitely: *f.infinite, ReportGbits: *f.gbits, Bidirectional: *f.bidir}
	ctx := context.Background()
	if *f.infinite {
		if !set["timeout"] {
			cfg.Timeout = 100 * 365 * 24 * time.Hour
		}
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
	}
	if local != "" {
		a, err := netip.ParseAddr(local)
		if err != nil {
			return usageErrorf("local address %q: %v", local, err)
		}
		cfg.Local = a
	}
	if *f.hold != "" {
		cfg.Hold = holdAt(*f.hold, *f.timeout)
	}
	if *f.rdmaCM {
		cfg.RDMACM = true
		if !cfg.Local.IsValid() {
			if server == "" {
				return usageErrorf("-R: a server needs its RoCE address (-x ADDRESS or --addr): there is no TCP exchange to take it from")
			}
			peer, err := perftest.ResolveIPv4(server)
			if err != nil {
				return err
			}
			if cfg.Local, err = localFor(peer); err != nil {
				return err
			}
		}
	}
	// perftest takes -T (a TOS for rdma_cm's IDs) only with -R and
	// --tclass (the GRH's) only without.
	var devOpts rxego.Options
	switch {
	case *f.tos >= 0 && !cfg.RDMACM:
		return usageErrorf("-T %d: the TOS is for rdma_cm QPs (-R); without -R give --tclass", *f.tos)
	case *f.tclass >= 0 && cfg.RDMACM:
		return usageErrorf("--tclass %d: with -R give the TOS with -T", *f.tclass)
	case *f.tos >= 0:
		if err := inRange("T", int64(*f.tos), 0, 255); err != nil {
			return err
		}
		devOpts.DataTOS = uint8(*f.tos)
	case *f.tclass >= 0:
		if err := inRange("tclass", int64(*f.tclass), 0, 255); err != nil {
			return err
		}
		devOpts.DataTOS = uint8(*f.tclass)
	}
	cfg.DeviceOptions = &devOpts
	// Every size, count and depth is checked before a device, a socket or
	// a buffer exists.
	if err := cfg.Check(); err != nil {
		return &usageError{err.Error()}
	}
	obs := f.obs
	if err := obs.start(); err != nil {
		return err
	}
	var dev *rxego.Device
	if sel.table != nil && !cfg.RDMACM && (*f.addr == "" || cfg.Local == sel.addr) {
		// -d IF with a GID index: the device serves IF's whole GID table,
		// as rxe's on IF would, and sends from the index given. rdma_cm
		// (-R) binds the one address.
		if dev, cfg.GIDIndex, err = sel.open(os.Stderr, "rxego perf", devOpts); err == nil {
			obs.attach(dev)
		}
	} else {
		dev, err = obs.openDevice(cfg.Local, server, &devOpts)
	}
	if err != nil {
		return errors.Join(err, obs.close())
	}
	cfg.Device = dev
	res, err := perftest.Run(ctx, cfg)
	defer func() {
		if dev != nil {
			dev.Close()
		}
	}()
	if res != nil && res.Device != nil {
		if *f.stats {
			// Printed before the device closes, so packets still arriving
			// (a peer's late retransmission) are counted.
			if serr := printStatsWith(os.Stdout, res.Device, defaultStatsQuiet, res.CM); serr != nil && err == nil {
				err = serr
			}
		}
		if res.Device != dev {
			res.Device.Close()
		}
	}
	return errors.Join(err, obs.close())
}

func perfUsage(fs *flag.FlagSet) {
	if name := fs.Name(); strings.HasPrefix(name, "ib_") {
		fmt.Fprintf(fs.Output(), `usage: rxego %[1]s [flags] [server]

Talks to perftest's %[1]s over its default Ethernet (TCP) exchange, or
with -R its rdma_cm mode, and takes its flags exactly (short flags
cluster: -aF; its long options: --size, --report_gbits, ...): put
"rxego " in front of the tool's command line. rxego's own additions are
long options only. The same as rxego perf %[2]s.

  rxego %[1]s -n 1000 -s 65536               # server
  %[1]s -d rxe0 -x 1 -n 1000 -s 65536 HOST   # the client, elsewhere

flags:
`, name, name[len("ib_"):])
		printFlags(fs)
		return
	}
	fmt.Fprintf(fs.Output(), `usage: rxego perf TEST [flags] [server]

TEST is one of send_bw, write_bw, read_bw, atomic_bw, send_lat, write_lat,
read_lat, atomic_lat (an ib_ prefix is fine). rxego speaks perftest's
default Ethernet (TCP) exchange, so either side may be perftest:

  rxego perf write_bw -n 1000 -s 65536             # server
  ib_write_bw -d rxe0 -x 1 -n 1000 -s 65536 HOST   # the client, elsewhere

and with -R perftest's rdma_cm mode (IPv4; the server needs -x ADDRESS):

  rxego perf read_bw -R -x 198.18.0.1              # server
  ib_read_bw -d rxe0 -R 198.18.0.1                 # the client, elsewhere

perftest's flags and long options are accepted (--size, --iters,
--report_gbits, ...; short flags cluster: -aF). A client whose server
does not listen fails at once ("couldn't connect"), as perftest's does.

flags:
`)
	printFlags(fs)
}

// holdFile is what --hold writes: the ranges of the peer's memory whose
// content rxego knows at the final synchronisation point.
type holdFile struct {
	Checks []holdCheck `json:"checks"`
}

type holdCheck struct {
	Addr uint64 `json:"addr"`
	Data []byte `json:"data"` // base64 in JSON
	What string `json:"what"`
}

// holdAt returns the Hold hook for --hold: it writes path, announces it on
// stdout and waits (at most timeout) until the file is gone: the test
// removes it once it has read the peer's memory.
func holdAt(path string, timeout time.Duration) func([]perftest.PeerCheck) error {
	return func(checks []perftest.PeerCheck) error {
		var f holdFile
		for _, c := range checks {
			f.Checks = append(f.Checks, holdCheck{Addr: c.Addr, Data: c.Data, What: c.What})
		}
		b, err := json.Marshal(f)
		if err != nil {
			return err
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return err
		}
		fmt.Printf("%s%s\n", holdPrefix, path)
		deadline := time.Now().Add(timeout)
		for {
			if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("--hold: %s still there after %v", path, timeout)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
