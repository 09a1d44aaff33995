package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rxego/rxego/internal/perftest"
)

func init() {
	register("perf", "peer for perftest's ib_{send,write,read,atomic}_{bw,lat} (same TCP exchange, or rdma_cm with -R; same flags and tables)", runPerf)
}

// holdPrefix starts the line --hold prints when rxego waits at the final
// synchronisation point.
const holdPrefix = "rxego-hold "

func runPerf(args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		perfUsage(flag.NewFlagSet("perf", flag.ContinueOnError))
		return errors.New("name the test first, e.g. rxego perf write_bw")
	}
	test := perftest.Test(strings.TrimSuffix(strings.TrimPrefix(args[0], "ib_"), ".c"))
	if !test.Valid() {
		return fmt.Errorf("unknown test %q; want one of %v", args[0], perftest.Tests)
	}
	fs := flag.NewFlagSet("perf "+string(test), flag.ContinueOnError)
	fs.Usage = func() { perfUsage(fs) }
	size := fs.Int("s", 0, "message size (default 65536 for bw, 2 for lat, 8 for atomic)")
	all := fs.Bool("a", false, "run every size from 2 bytes to 8 MiB")
	iters := fs.Int("n", 0, "iterations (default 1000; 5000 for write_bw; at least 5)")
	mtu := fs.Int("m", 0, "path MTU: 256, 512, 1024, 2048 or 4096 (default 1024; the smaller of both sides' wins)")
	qps := fs.Int("q", 0, "number of QPs (bw tests)")
	tx := fs.Int("t", 0, "tx depth: outstanding work requests per QP (default 128 for bw, 1 for lat)")
	rx := fs.Int("r", 0, "rx depth: receives posted per QP (SEND tests; default 512, at most -n)")
	outReads := fs.Int("o", 0, "outstanding READs/atomics this side accepts (READ and atomic tests; default 128)")
	atomicOp := fs.String("A", "", "atomic operation: FETCH_AND_ADD (default) or CMP_AND_SWAP")
	port := fs.Int("p", perftest.DefaultPort, "TCP port of the exchange (with -R: the rdma_cm port)")
	gid := fs.String("x", "", "local RoCE address (the GID as an IP address); a GID index is accepted for compatibility")
	addr := fs.String("addr", "", "local RoCE address (same as -x ADDRESS; default: the address of the TCP exchange)")
	conn := fs.String("c", "RC", "connection type: RC (the only one rxego's perf speaks)")
	rdmaCM := fs.Bool("R", false, "connect with rdma_cm, as perftest's -R: the exchange over an rdma_cm-connected QP on port -p, each data QP its own rdma_cm connection (IPv4)")
	_ = fs.String("d", "", "device name (accepted for compatibility)")
	_ = fs.Int("i", 1, "IB port (accepted for compatibility)")
	_ = fs.Bool("F", false, "accepted for compatibility (perftest's CPU frequency warning)")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	stats := fs.Bool("stats", false, "print rxego's engine and transport counters as one JSON line (\"rxego-stats {...}\") at the end")
	obs := addObserveFlags(fs)
	hold := fs.String("hold", "", "test hook: at the final synchronisation, write what the peer's memory must hold to this JSON file, print \""+strings.TrimSpace(holdPrefix)+" FILE\" and wait until the file is removed")
	// perftest's getopt lets the server name sit among the flags.
	rest := args[1:]
	var server string
	for {
		if err := fs.Parse(rest); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		if server != "" {
			return fmt.Errorf("more than one server given: %q and %q", server, fs.Arg(0))
		}
		server, rest = fs.Arg(0), fs.Args()[1:]
	}
	if *conn != "RC" {
		return fmt.Errorf("-c %s: rxego perf runs RC only", *conn)
	}
	local := *addr
	if *gid != "" {
		if _, err := strconv.Atoi(*gid); err != nil {
			if local != "" && local != *gid {
				return fmt.Errorf("-x %s and --addr %s disagree", *gid, local)
			}
			local = *gid
		}
	}
	cfg := perftest.Config{Test: test, Atomic: perftest.AtomicOp(*atomicOp), Server: server, Port: *port, Size: *size,
		All: *all, Iters: *iters, MTU: *mtu, NumQPs: *qps, TxDepth: *tx, RxDepth: *rx, OutReads: *outReads,
		Timeout: *timeout, Out: os.Stdout, KeepDevice: true}
	if local != "" {
		a, err := netip.ParseAddr(local)
		if err != nil {
			return fmt.Errorf("local address %q: %v", local, err)
		}
		cfg.Local = a
	}
	if *hold != "" {
		cfg.Hold = holdAt(*hold, *timeout)
	}
	if *rdmaCM {
		cfg.RDMACM = true
		if !cfg.Local.IsValid() {
			if server == "" {
				return errors.New("-R: a server needs its RoCE address (-x ADDRESS or --addr): there is no TCP exchange to take it from")
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
	if err := obs.start(); err != nil {
		return err
	}
	dev, err := obs.openDevice(cfg.Local, server)
	if err != nil {
		return errors.Join(err, obs.close())
	}
	cfg.Device = dev
	res, err := perftest.Run(context.Background(), cfg)
	defer func() {
		if dev != nil {
			dev.Close()
		}
	}()
	if res != nil && res.Device != nil {
		if *stats {
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
	fmt.Fprintf(fs.Output(), `usage: rxego perf TEST [flags] [server]

TEST is one of send_bw, write_bw, read_bw, atomic_bw, send_lat, write_lat,
read_lat, atomic_lat (an ib_ prefix is fine). rxego speaks perftest's
default Ethernet (TCP) exchange, so either side may be perftest:

  rxego perf write_bw -n 1000 -s 65536             # server
  ib_write_bw -d rxe0 -x 1 -n 1000 -s 65536 HOST   # the client, elsewhere

and with -R perftest's rdma_cm mode (IPv4; the server needs -x ADDRESS):

  rxego perf read_bw -R -x 198.18.0.1              # server
  ib_read_bw -d rxe0 -R 198.18.0.1                 # the client, elsewhere

flags:
`)
	fs.PrintDefaults()
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
