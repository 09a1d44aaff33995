package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cmd/rxego/internal/pingpong"
)

func init() {
	register("pingpong", "peer for ibv_rc/uc/ud/srq_pingpong (same TCP exchange and flags; -t picks the tool; -R: rdma_cm between rxego peers)", runPingpong)
	for _, k := range []pingpong.Kind{pingpong.RC, pingpong.UC, pingpong.UD, pingpong.SRQ} {
		name := "ibv_" + string(k) + "_pingpong"
		registerCTool(name, "peer for "+name+" (its flags exactly)", func(args []string) error {
			return pingpongCommand(name, k, args)
		})
	}
}

// toolLetters are the short options of each ibv_*_pingpong (rdma-core's
// libibverbs/examples, their getopt strings): the command named after a
// tool takes these and no other letter, so its command line means there
// what it means to the tool. rc's -t is --ts (completion timestamps).
var toolLetters = map[pingpong.Kind]string{
	pingpong.RC:  "pdismrnlegotc",
	pingpong.UC:  "pdismrnlegc",
	pingpong.UD:  "pdisrnlegc",
	pingpong.SRQ: "pdismqrnlegoc",
}

// runPingpong is `rxego pingpong`: -t picks the tool, and -R connects
// with rdma_cm.
func runPingpong(args []string) error { return pingpongCommand("pingpong", "", args) }

// pingpongCommand runs the command name: `pingpong` (tool "", chosen with
// -t) or the one named after the C tool, which takes that tool's flags.
func pingpongCommand(name string, tool pingpong.Kind, args []string) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() { pingpongUsage(fs, name, tool) }
	letters := "tpsnmrqegdlioRc"
	if tool != "" {
		letters = toolLetters[tool]
	}
	// Each option the command has; one it lacks keeps its default.
	intFlag := func(p *int, letter string, def int, usage string) {
		*p = def
		if strings.Contains(letters, letter) {
			fs.IntVar(p, letter, def, usage)
		}
	}
	boolFlag := func(p *bool, letter, usage string) {
		if strings.Contains(letters, letter) {
			fs.BoolVar(p, letter, false, usage)
		}
	}
	var port, size, iters, mtu, rx, numQP, ibPort, sl int
	var events, odp, ts, rdmaCM, verify bool
	kind := string(tool)
	if tool == "" {
		fs.StringVar(&kind, "t", "rc", "which tool to mimic: rc, uc, ud or srq")
		fs.BoolVar(&ts, "ts", false, "completion timestamps (ibv_rc_pingpong's -t; accepted, but rxego reports none)")
	} else {
		boolFlag(&ts, "t", "completion timestamps (accepted, but rxego reports none)")
	}
	intFlag(&port, "p", 18515, "TCP port of the exchange (with -R: the rdma_cm port)")
	intFlag(&size, "s", 0, "message size (default 4096; ud: 2048 or the MTU, whichever is smaller)")
	intFlag(&iters, "n", 1000, "number of exchanges")
	intFlag(&mtu, "m", 1024, "path MTU: 256, 512, 1024, 2048 or 4096")
	intFlag(&rx, "r", 500, "receive queue depth")
	intFlag(&numQP, "q", 16, "srq: number of QPs")
	boolFlag(&events, "e", "sleep on CQ events instead of busy polling")
	gid := fs.String("g", "", "local RoCE address (the GID as an IP address), or a GID index of -d's interface as rxe numbers it (0 link-local, 1 IPv4, then IPv6)")
	addr := fs.String("addr", "", "local RoCE address (same as -g ADDRESS)")
	ifname := fs.String("d", "", "network interface whose GID table (as rxe's on it) a -g index names; otherwise accepted for compatibility")
	gidTable := fs.Bool("gid-table", false, gidTableUsage)
	intFlag(&sl, "l", 0, "service level (accepted for compatibility)")
	intFlag(&ibPort, "i", 1, "IB port (accepted for compatibility; rxego has port 1)")
	boolFlag(&odp, "o", "on-demand paging (accepted for compatibility: rxego's memory regions are Go memory, always present)")
	boolFlag(&rdmaCM, "R", "connect with rdma_cm on port -p instead of the TCP exchange (rc and srq; the peer is another rxego pingpong -R, as the C tools have no rdma_cm mode)")
	boolFlag(&verify, "c", "verify every received message (fill byte, echo, or rxego's self-checking pattern)")
	timeout := fs.Duration("timeout", 60*time.Second, "give up after this long")
	stats := fs.Bool("stats", false, "print rxego's engine and transport counters as one JSON line (\"rxego-stats {...}\") at the end")
	statsQuiet := fs.Duration("stats-quiet", defaultStatsQuiet, "with --stats: first wait until no packet moved for this long (at most 5s)")
	obs := addObserveFlags(fs)
	// ibv_*_pingpong's long options (rdma-core libibverbs/examples).
	for short, long := range map[string]string{"p": "port", "d": "ib-dev", "i": "ib-port", "s": "size", "m": "mtu",
		"r": "rx-depth", "n": "iters", "l": "sl", "e": "events", "g": "gid-idx", "o": "odp", "c": "chk", "q": "num-qp", "t": "ts"} {
		if fs.Lookup(short) != nil && fs.Lookup(long) == nil && (short != "t" || tool != "") {
			alias(fs, short, long)
		}
	}
	operands, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(operands) > 1 {
		return usageErrorf("one server at most, got %q", operands)
	}
	if err := positive(fs, "s", "n", "r", "q", "m"); err != nil {
		return err
	}
	if err := inRange("p", int64(port), 0, 0xffff); err != nil {
		return err
	}
	if ibPort != 1 {
		return usageErrorf("-i %d: rxego's device has port 1 only", ibPort)
	}
	if ts {
		fmt.Fprintf(os.Stderr, "rxego %s: --ts: rxego's completions carry no timestamps; none reported\n", name)
	}
	sel, err := gidArg("g", *gid, *ifname, *gidTable)
	if err != nil {
		return err
	}
	la := sel.addr
	if *addr != "" {
		if la, err = netip.ParseAddr(*addr); err != nil {
			return usageErrorf("local address %q: %v", *addr, err)
		}
		sel.table = nil // --addr wins: the device serves that one address
	}
	if !la.IsValid() {
		if sel.index >= 0 {
			return usageErrorf("-g %s: a GID index needs -d INTERFACE (or give the address with -g ADDRESS or --addr ADDRESS)", *gid)
		}
		return usageErrorf("give the local RoCE address with -g ADDRESS or --addr ADDRESS")
	}
	cfg := pingpong.Config{Kind: pingpong.Kind(kind), Local: la, TCPPort: port, Size: size, Iters: iters,
		MTU: mtu, RxDepth: rx, NumQP: numQP, Events: events, Verify: verify, Timeout: *timeout, Out: os.Stdout,
		RDMACM: rdmaCM}
	if len(operands) > 0 {
		cfg.Server = operands[0]
	}
	// Every limit is checked before a device or buffer exists.
	if err := cfg.Check(); err != nil {
		return &usageError{err.Error()}
	}
	// -d IF with a GID index: the device serves IF's whole GID table, as
	// rxe's on IF would, and sends from the index given. rdma_cm (-R)
	// binds the one address.
	table := sel.table != nil && !cfg.RDMACM
	if !*stats && !obs.active() && !table {
		_, err = pingpong.Run(context.Background(), cfg)
		return err
	}
	if err := obs.start(); err != nil {
		return err
	}
	// The device is opened here so its counters outlive the run; they are
	// printed whether or not the run succeeded.
	if table {
		cfg.Device, cfg.GIDIndex, err = sel.open(os.Stderr, "rxego "+name, rxego.Options{})
	} else {
		cfg.Device, err = rxego.Open(netip.AddrPortFrom(la, rxego.DefaultPort).String(), nil)
	}
	if err != nil {
		return errors.Join(err, obs.close())
	}
	defer cfg.Device.Close()
	obs.attach(cfg.Device)
	_, err = pingpong.Run(context.Background(), cfg)
	if *stats {
		err = errors.Join(err, printStatsQuiet(os.Stdout, cfg.Device, *statsQuiet))
	}
	return errors.Join(err, obs.close())
}

// pingpongUsage prints the usage of pingpong, or of the command named
// after a C tool.
func pingpongUsage(fs *flag.FlagSet, name string, tool pingpong.Kind) {
	w := fs.Output()
	if tool != "" {
		fmt.Fprintf(w, `usage: rxego %[1]s [flags] [server]

Talks to rdma-core's %[1]s over its TCP exchange, and takes its flags
exactly (short flags cluster: -ec; its long options: --size, --iters,
...): put "rxego " in front of the tool's command line. Without a server
name it waits for a client, like the C tool; a client whose server does
not listen fails at once, as the tool's does. rxego's own additions are
long options only.

  rxego %[1]s -g 198.18.0.1                   # server
  %[1]s -d rxe0 -g 1 198.18.0.1               # the peer, elsewhere

flags:
`, name)
		printFlags(fs)
		return
	}
	fmt.Fprintf(w, `usage: rxego pingpong [flags] [server]

Talks to rdma-core's ibv_rc_pingpong (and uc/ud/srq) over their TCP
exchange. Without a server name it waits for a client, like the C tools;
a client whose server does not listen fails at once, as theirs do. The
C tools' flags and long options are accepted (-s/--size, -n/--iters,
--rx-depth, ...; short flags cluster: -ec), except that -t picks the
tool here (ibv_rc_pingpong's -t is --ts): to paste a C tool's command
line as it is, use the command named after it (rxego ibv_rc_pingpong).

  rxego pingpong -g 198.18.0.1                 # server, RC
  ibv_rc_pingpong -d rxe0 -g 1 198.18.0.1      # the peer, elsewhere

With -R the QPs connect with rdma_cm (the IB CM on QP1) instead; the
C tools have no such mode, so both ends are rxego:

  rxego pingpong -R -g 198.18.0.1              # server
  rxego pingpong -R -g 198.18.0.2 198.18.0.1   # client

flags:
`)
	printFlags(fs)
}
