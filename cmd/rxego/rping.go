package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cm/cmatose"
	"github.com/rxego/rxego/cm/rping"
)

func init() {
	register("rping", "peer for librdmacm's rping: ping-pong over an rdma_cm connection (same flags)", runRping)
	register("ucmatose", "peer for librdmacm's ucmatose: several rdma_cm connections with SENDs (same flags)", runUcmatose)
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
	drop, err := parseDrops(*f.drop)
	if err != nil {
		return err
	}
	if err := f.obs.start(); err != nil {
		return err
	}
	dev, err := rxego.Open(netip.AddrPortFrom(local, rxego.DefaultPort).String(), nil)
	if err != nil {
		return errors.Join(err, f.obs.close())
	}
	defer dev.Close()
	f.obs.attach(dev)
	cfg := &cm.Config{DropMAD: drop}
	if *f.debug {
		cfg.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	m, err := cm.New(dev, cfg)
	if err != nil {
		return errors.Join(err, f.obs.close())
	}
	ctx, cancel := context.WithTimeout(context.Background(), *f.timeout)
	defer cancel()
	err = fn(ctx, m)
	m.Close()
	if *f.stats {
		err = errors.Join(err, printStatsWith(os.Stdout, dev, 0, m.Counters()))
	}
	return errors.Join(err, f.obs.close())
}

func runRping(args []string) error {
	fs := flag.NewFlagSet("rping", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: rxego rping -s [-vV] [-S size] [-a addr] [-p port]
       rxego rping -c [-vV] [-S size] [-C count] [-I addr] -a addr [-p port]

Talks to librdmacm's rping over an rdma_cm connection (IB CM on QP1).
The server serves one client; its -a is the local RoCE address rxego
binds. The client's -a is the server, -I its own address (default: the
one the kernel routes from).

  rxego rping -s -a 198.18.0.1 -v            # server
  rping -c -a 198.18.0.1 -v -V -C 10         # the peer, elsewhere

flags:
`)
		fs.PrintDefaults()
	}
	server := fs.Bool("s", false, "server")
	client := fs.Bool("c", false, "client")
	addr := fs.String("a", "", "server: local address to bind; client: server address")
	src := fs.String("I", "", "client: local address (default: the route's source toward -a)")
	port := fs.Uint("p", rping.DefaultPort, "rdma_cm port")
	count := fs.Int("C", 0, "client: pings (0: until -timeout)")
	size := fs.Int("S", rping.DefaultSize, "ping data size")
	verbose := fs.Bool("v", false, "print ping data")
	validate := fs.Bool("V", false, "client: validate ping data (the server always does)")
	_ = fs.Bool("P", false, "persistent server (accepted; rxego serves one client)")
	f := addCMFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *server == *client {
		return errors.New("give exactly one of -s and -c")
	}
	if *port > 0xffff || *size < rping.MinSize || *size > rping.MaxSize || *count < 0 {
		return fmt.Errorf("port %d, size %d (%d..%d), count %d out of range", *port, *size, rping.MinSize, rping.MaxSize, *count)
	}
	a, err := netip.ParseAddr(*addr)
	if err != nil {
		return fmt.Errorf("-a %q: %v", *addr, err)
	}
	cfg := rping.Config{Size: *size, Count: *count, Verbose: *verbose, Validate: *validate, Out: os.Stdout}
	if *server {
		return cmRun(a, f, func(ctx context.Context, m *cm.Manager) error {
			l, err := m.Listen(uint16(*port))
			if err != nil {
				return err
			}
			fmt.Printf("%s%v\n", listeningPrefix, netip.AddrPortFrom(a, uint16(*port)))
			res, err := rping.Serve(ctx, m, l, cfg)
			fmt.Printf("rxego rping: served %d pings, %d verified\n", res.Pings, res.Verified)
			return err
		})
	}
	local, err := localAddr(*src, a)
	if err != nil {
		return err
	}
	return cmRun(local, f, func(ctx context.Context, m *cm.Manager) error {
		res, err := rping.Dial(ctx, m, netip.AddrPortFrom(a, uint16(*port)), cfg)
		fmt.Printf("rxego rping: %d pings, %d verified\n", res.Pings, res.Verified)
		return err
	})
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

func runUcmatose(args []string) error {
	fs := flag.NewFlagSet("ucmatose", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: rxego ucmatose [-s server_address] [-b bind_address] [-c connections] [-C message_count] [-S message_size] [-p port]

Talks to librdmacm's ucmatose: several rdma_cm connections, each carrying
message_count SENDs each way. Without -s it is the server; -b is the local
RoCE address (the client's default: the route's source toward -s).

  rxego ucmatose -b 198.18.0.1 -c 2           # server
  ucmatose -s 198.18.0.1 -c 2                 # the peer, elsewhere

flags:
`)
		fs.PrintDefaults()
	}
	dst := fs.String("s", "", "server address (client mode)")
	bind := fs.String("b", "", "local address")
	conns := fs.Int("c", cmatose.DefaultConnections, "connections")
	count := fs.Int("C", cmatose.DefaultCount, "messages each way per connection")
	size := fs.Int("S", cmatose.DefaultSize, "message size")
	port := fs.Uint("p", cmatose.DefaultPort, "rdma_cm port")
	f := addCMFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *port > 0xffff {
		return fmt.Errorf("port %d out of range", *port)
	}
	cfg := cmatose.Config{Connections: *conns, Count: *count, Size: *size, Out: os.Stdout}
	report := func(res cmatose.Result, err error) error {
		fmt.Printf("rxego ucmatose: %d connections, %d sent, %d received, %d verified\n",
			res.Connections, res.Sent, res.Received, res.Verified)
		return err
	}
	if *dst == "" {
		local, err := netip.ParseAddr(*bind)
		if err != nil {
			return fmt.Errorf("the server needs its local address: -b: %v", err)
		}
		return cmRun(local, f, func(ctx context.Context, m *cm.Manager) error {
			l, err := m.Listen(uint16(*port))
			if err != nil {
				return err
			}
			fmt.Printf("%s%v\n", listeningPrefix, netip.AddrPortFrom(local, uint16(*port)))
			return report(cmatose.Serve(ctx, m, l, cfg))
		})
	}
	peer, err := netip.ParseAddr(*dst)
	if err != nil {
		return fmt.Errorf("-s %q: %v", *dst, err)
	}
	local, err := localAddr(*bind, peer)
	if err != nil {
		return err
	}
	return cmRun(local, f, func(ctx context.Context, m *cm.Manager) error {
		return report(cmatose.Dial(ctx, m, netip.AddrPortFrom(peer, uint16(*port)), cfg))
	})
}
