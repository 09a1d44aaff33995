package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cmd/rxego/internal/cmatose"
	"github.com/rxego/rxego/cmd/rxego/internal/exchange"
	"github.com/rxego/rxego/cmd/rxego/internal/rping"
)

func init() {
	register("rping", "peer for librdmacm's rping: ping-pong over an rdma_cm connection (same flags)", runRping)
	register("ucmatose", "peer for librdmacm's ucmatose: several rdma_cm connections with SENDs (same flags)", ucmatoseTool.run)
}

// listeningPrefix starts the line the servers print once they listen, so
// that a script (or test) knows when to start the client.
const listeningPrefix = "rxego: rdma_cm listening on "

// cmFlags are the flags both rdma_cm tools share.
type cmFlags struct {
	debug   *bool
	timeout *time.Duration
	stats   *bool
	drop    *string
	obs     *observeFlags
	// extra, when set, adds a tool's own counters to --stats.
	extra func() map[string]uint64
}

func addCMFlags(fs *flag.FlagSet) cmFlags {
	return cmFlags{
		debug:   fs.Bool("d", false, "print every CM message sent and received"),
		timeout: fs.Duration("timeout", 2*time.Minute, "give up after this long"),
		stats:   fs.Bool("stats", false, "print rxego's engine, transport and CM counters as one JSON line (\"rxego-stats {...}\") at the end"),
		drop: fs.String("cm-drop", "", "fault injection: drop the first CM message of each kind listed, "+
			"e.g. \"out:REP,in:RTU\" (out = sent by rxego, in = received)"),
		obs: addObserveFlags(fs),
	}
}

// parseDrops turns "out:REP,in:RTU" into a DropMAD hook dropping the first
// of each.
func parseDrops(s string) (func(bool, cm.Header) bool, error) {
	if s == "" {
		return nil, nil
	}
	names := map[string]uint16{}
	for id := cm.AttrREQ; id <= cm.AttrDREP; id++ {
		names[cm.AttrName(id)] = id
	}
	type key struct {
		out  bool
		attr uint16
	}
	var mu sync.Mutex
	pending := map[key]bool{}
	for _, item := range strings.Split(s, ",") {
		dir, name, ok := strings.Cut(strings.TrimSpace(item), ":")
		attr, known := names[strings.ToUpper(name)]
		if !ok || !known || (dir != "in" && dir != "out") {
			return nil, fmt.Errorf("-cm-drop %q: want items like out:REP or in:RTU", item)
		}
		pending[key{dir == "out", attr}] = true
	}
	return func(out bool, h cm.Header) bool {
		mu.Lock()
		defer mu.Unlock()
		k := key{out, h.AttrID}
		if pending[k] {
			delete(pending, k)
			return true
		}
		return false
	}, nil
}

// localFor returns the address the kernel would send from toward peer:
// a connected UDP socket sends nothing but learns its source address.
func localFor(peer netip.Addr) (netip.Addr, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer, rxego.DefaultPort)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to %v to pick a local address (give one with -I): %w", peer, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

// cmRun opens the device on local, starts a connection manager on it, runs
// fn, and prints the counters when asked.
func cmRun(local netip.Addr, f cmFlags, fn func(ctx context.Context, m *cm.Manager) error) error {
	return cmRunAll([]netip.Addr{local}, f, fn)
}

// cmSide is one device and connection manager of cmRunAll.
type cmSide struct {
	dev *rxego.Device
	m   *cm.Manager
	err error
}

// cmRunAll is cmRun on several local addresses at once (a server
// listening on every address): fn runs on each; the first to end other
// than by cancellation ends the others, and its result and counters are
// the run's. An address whose device cannot open is skipped with a note
// when others remain.
func cmRunAll(locals []netip.Addr, f cmFlags, fn func(ctx context.Context, m *cm.Manager) error) error {
	drop, err := parseDrops(*f.drop)
	if err != nil {
		return err
	}
	if err := f.obs.start(); err != nil {
		return err
	}
	cfg := &cm.Config{DropMAD: drop}
	if *f.debug {
		cfg.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	var sides []*cmSide
	defer func() {
		for _, s := range sides {
			s.m.Close()
			s.dev.Close()
		}
	}()
	var openErrs []error
	for _, local := range locals {
		dev, err := rxego.Open(netip.AddrPortFrom(local, rxego.DefaultPort).String(), nil)
		if err != nil {
			openErrs = append(openErrs, err)
			continue
		}
		f.obs.attach(dev)
		m, err := cm.New(dev, cfg)
		if err != nil {
			dev.Close()
			return errors.Join(err, f.obs.close())
		}
		sides = append(sides, &cmSide{dev: dev, m: m})
	}
	if len(sides) == 0 {
		return errors.Join(errors.Join(openErrs...), f.obs.close())
	}
	for _, err := range openErrs {
		fmt.Fprintf(os.Stderr, "rxego: skipping an address: %v\n", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *f.timeout)
	defer cancel()
	first := sides[0]
	if len(sides) > 1 {
		// The first side to end for another reason than the others'
		// cancellation is the run.
		all, stop := context.WithCancel(ctx)
		done := make(chan *cmSide, len(sides))
		for _, s := range sides {
			go func() {
				s.err = fn(all, s.m)
				done <- s
			}()
		}
		first = nil
		for range sides {
			s := <-done
			if first == nil && (all.Err() == nil || !errors.Is(s.err, all.Err())) {
				first = s
				stop()
			}
		}
		stop()
		if first == nil {
			first = sides[0]
		}
	} else {
		first.err = fn(ctx, first.m)
	}
	err = first.err
	first.m.Close()
	if *f.stats {
		counters := first.m.Counters()
		if f.extra != nil {
			maps.Copy(counters, f.extra())
		}
		err = errors.Join(err, printStatsWith(os.Stdout, first.dev, 0, counters))
	}
	return errors.Join(err, f.obs.close())
}

// listenAddrs is localAddrs; tests replace it.
var listenAddrs = localAddrs

// localAddrs are the addresses a server without -a listens on: every
// IPv4 address of the host, as rping's INADDR_ANY.
func localAddrs() ([]netip.Addr, error) {
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range ifAddrs {
		if p, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(p.IP); ok && ip.Unmap().Is4() {
				out = append(out, ip.Unmap())
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no IPv4 address on this host to listen on; give one with -a")
	}
	return out, nil
}

// dialError says what a failed rdma_cm connection attempt means, as the
// C tools' "couldn't connect" does: a REJ for want of a listener is a
// refused connection, a REQ nobody answered means no RoCE peer there, and
// a run that ended first says which -timeout ended it.
func dialError(addr netip.AddrPort, err error, timeout time.Duration) error {
	var rej *cm.RejectError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("couldn't connect to %v, or the run did not end, within the -timeout of %v: %w", addr, timeout, err)
	case errors.As(err, &rej) && rej.Reason == cm.RejInvalidServiceID:
		return fmt.Errorf("couldn't connect to %v: connection refused (REJ, reason %d: nobody listens on rdma_cm port %d there)",
			addr, rej.Reason, addr.Port())
	case errors.Is(err, cm.ErrTimeout):
		return fmt.Errorf("couldn't connect to %v: no answer to the connection request (no RoCE device on that address?): %w", addr, err)
	}
	return err
}

func runRping(args []string) error {
	fs := flag.NewFlagSet("rping", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: rxego rping -s [-vV] [-S size] [-a addr] [-p port]
       rxego rping -c [-vV] [-S size] [-C count] [-I addr] -a addr [-p port]

Talks to librdmacm's rping over an rdma_cm connection (IB CM on QP1).
The server serves one client; its -a is the local RoCE address rxego
binds (without -a: every IPv4 address of the host, as rping's). The
client's -a is the server, -I its own address (default: the one the
kernel routes from). A client fails at once when nobody listens there.

  rxego rping -s -a 198.18.0.1 -v            # server
  rping -c -a 198.18.0.1 -v -V -C 10         # the peer, elsewhere

flags:
`)
		printFlags(fs)
	}
	server := fs.Bool("s", false, "server")
	client := fs.Bool("c", false, "client")
	addr := fs.String("a", "", "server: local address to bind (default: every IPv4 address of the host); client: server address")
	src := fs.String("I", "", "client: local address (default: the route's source toward -a)")
	port := fs.Uint("p", rping.DefaultPort, "rdma_cm port")
	count := fs.Int("C", 0, "client: pings (0: until -timeout)")
	size := fs.Int("S", rping.DefaultSize, "ping data size")
	verbose := fs.Bool("v", false, "print ping data")
	validate := fs.Bool("V", false, "client: validate ping data (the server always does)")
	_ = fs.Bool("P", false, "persistent server (accepted; rxego serves one client)")
	f := addCMFlags(fs)
	err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if *server == *client {
		return usageErrorf("give exactly one of -s and -c")
	}
	for _, r := range []struct {
		name      string
		v, lo, hi int64
	}{{"p", int64(*port), 0, 0xffff}, {"S", int64(*size), rping.MinSize, rping.MaxSize}, {"C", int64(*count), 0, 1<<31 - 1}} {
		if err := inRange(r.name, r.v, r.lo, r.hi); err != nil {
			return err
		}
	}
	var a netip.Addr
	if *addr != "" || *client {
		if a, err = netip.ParseAddr(*addr); err != nil {
			return usageErrorf("-a %q: %v", *addr, err)
		}
	}
	cfg := rping.Config{Size: *size, Count: *count, Verbose: *verbose, Validate: *validate, Out: os.Stdout}
	if *server {
		locals := []netip.Addr{a}
		if !a.IsValid() {
			if locals, err = listenAddrs(); err != nil {
				return err
			}
		}
		return cmRunAll(locals, f, func(ctx context.Context, m *cm.Manager) error {
			l, err := m.Listen(uint16(*port))
			if err != nil {
				return err
			}
			fmt.Printf("%s%v\n", listeningPrefix, netip.AddrPortFrom(m.Device().Addr().Addr(), uint16(*port)))
			res, err := rping.Serve(ctx, m, l, cfg)
			if res.Pings == 0 && ctx.Err() != nil && len(locals) > 1 {
				return err // another address served the client
			}
			fmt.Printf("rxego rping: served %d pings, %d verified\n", res.Pings, res.Verified)
			return err
		})
	}
	local, err := localAddr(*src, a)
	if err != nil {
		return err
	}
	to := netip.AddrPortFrom(a, uint16(*port))
	if err := noRoCEThere(to); err != nil {
		return err
	}
	return cmRun(local, f, func(ctx context.Context, m *cm.Manager) error {
		stop := reportREQRetries(ctx, "rping", m, to)
		res, err := rping.Dial(ctx, m, to, cfg)
		stop()
		if err == nil || res.Pings > 0 {
			fmt.Printf("rxego rping: %d pings, %d verified\n", res.Pings, res.Verified)
		}
		return dialError(to, err, *f.timeout)
	})
}

// noRoCEThere fails at once when to is a loopback address (this host)
// where no RoCE device listens: no socket holds UDP port 4791 there (the
// kernel's table, /proc/net/udp, says so), so a CM REQ would only be
// retried until rdma_cm gives up (over a minute). It reads the table and
// sends nothing; other addresses cannot be checked so and return nil.
func noRoCEThere(to netip.AddrPort) error {
	a := to.Addr().Unmap()
	if !a.IsLoopback() {
		return nil
	}
	if held, known := udpPortHeld(a, rxego.DefaultPort); held || !known {
		return nil
	}
	return fmt.Errorf("couldn't connect to %v: connection refused (no RoCE device on %v: nothing holds UDP port %d there)",
		to, a, rxego.DefaultPort)
}

// udpPortHeld reports whether a UDP socket is bound to port on a, or on
// the wildcard address, in this network namespace, as Linux lists them in
// /proc/net/udp and udp6; known is false where the lists cannot be read.
func udpPortHeld(a netip.Addr, port uint16) (held, known bool) {
	for _, name := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		b, err := os.ReadFile(name)
		if err != nil {
			return false, false
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			host, p, ok := strings.Cut(f[1], ":")
			if pn, err := strconv.ParseUint(p, 16, 16); !ok || err != nil || uint16(pn) != port {
				continue
			}
			if bound, ok := procNetAddr(host); ok && (bound.IsUnspecified() || bound.Unmap() == a) {
				return true, true
			}
		}
	}
	return false, true
}

// procNetAddr decodes an address of /proc/net/udp{,6}: 32-bit words in
// hex, each in the host's byte order (little-endian on the machines rxego
// runs on).
func procNetAddr(h string) (netip.Addr, bool) {
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.Addr{}, false
	}
	for i := 0; i < len(raw); i += 4 {
		binary.BigEndian.PutUint32(raw[i:], binary.LittleEndian.Uint32(raw[i:]))
	}
	a, ok := netip.AddrFromSlice(raw)
	return a, ok
}

// reqRetryEvery is how often reportREQRetries looks at the CM's counters.
var reqRetryEvery = time.Second

// reportREQRetries says on stderr, while a connection request goes
// unanswered, that rdma_cm resends it and for how long it will: the REQ
// is resent up to cm.DefaultMaxRetries times, each after the CM response
// timeout, about 74 s in all, as Linux's CM does. The returned func stops
// it.
func reportREQRetries(ctx context.Context, tool string, m *cm.Manager, to netip.AddrPort) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(reqRetryEvery)
		defer t.Stop()
		start, told := time.Now(), uint64(0)
		base := m.Counters()["cm_retransmits"]
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n := m.Counters()["cm_retransmits"] - base
			if n > told {
				told = n
				fmt.Fprintf(os.Stderr, "rxego %s: no answer from %v after %.0f s: connection request (CM REQ) resent, %d of %d retries\n",
					tool, to, time.Since(start).Seconds(), n, cm.DefaultMaxRetries)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// localAddr is -I, or the route's source toward peer.
func localAddr(flagValue string, peer netip.Addr) (netip.Addr, error) {
	if flagValue == "" {
		return localFor(peer)
	}
	a, err := netip.ParseAddr(flagValue)
	if err != nil {
		return a, fmt.Errorf("local address %q: %v", flagValue, err)
	}
	return a, nil
}

// ucmatoseTool is rxego ucmatose.
var ucmatoseTool = burstTool{
	name: "ucmatose",
	usage: `Talks to librdmacm's ucmatose: several rdma_cm connections, each carrying
message_count SENDs each way. Without -s it is the server; -b is the local
RoCE address (the client's default: the route's source toward -s).

  rxego ucmatose -b 198.18.0.1 -c 2           # server
  ucmatose -s 198.18.0.1 -c 2                 # the peer, elsewhere
`,
	port: cmatose.DefaultPort, conns: cmatose.DefaultConnections, count: cmatose.DefaultCount, size: cmatose.DefaultSize,
	tool: cmatose.Tool,
	serve: func(ctx context.Context, m *cm.Manager, port uint16, c exchange.Params, ready func()) (exchange.Result, error) {
		l, err := m.Listen(port)
		if err != nil {
			return exchange.Result{}, err
		}
		ready()
		return cmatose.Serve(ctx, m, l, c)
	},
	dial: cmatose.Dial,
}
