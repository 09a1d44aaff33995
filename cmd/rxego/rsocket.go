package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/rsocket"
	"github.com/rxego/rxego/rsocket/rstream"
)

func init() {
	register("rstream", "peer for librdmacm's rstream: latency and bandwidth over rsocket (same flags)", runRstream)
	register("riostream", "peer for librdmacm's riostream: rstream's tests with direct placement (riomap, riowrite)", runRiostream)
	register("rcopy", "peer for librdmacm's rcopy: copies a file over rsocket (same operands and flags)", runRcopy)
}

// testOpts is rstream's -T, given once per option.
type testOpts []string

func (t *testOpts) String() string     { return strings.Join(*t, ",") }
func (t *testOpts) Set(s string) error { *t = append(*t, s); return nil }

// rstreamOpts are what rstream's -T options mean to rxego.
type rstreamOpts struct {
	tcp, verify bool
}

// parseTestOpts reads -T as rstream does: one letter or a word's prefix.
// Asynchronous, blocking and nonblocking calls, and rdma_getaddrinfo
// resolution, are ways of calling the C API: rxego's Go calls block, so
// they are accepted and change nothing. Fork has no Go equivalent.
func parseTestOpts(opts []string) (rstreamOpts, error) {
	var o rstreamOpts
	for _, arg := range opts {
		word := strings.ToLower(arg)
		switch {
		case word == "s" || strings.HasPrefix(word, "socket"):
			o.tcp = true
		case word == "v" || strings.HasPrefix(word, "verify"):
			o.verify = true
		case word == "a" || word == "b" || word == "n" || word == "r" ||
			strings.HasPrefix(word, "async") || strings.HasPrefix(word, "block") ||
			strings.HasPrefix(word, "nonblock") || strings.HasPrefix(word, "resolve"):
		case word == "f" || strings.HasPrefix(word, "fork"):
			return o, usageErrorf("-T %s: rxego does not fork a server", arg)
		default:
			return o, usageErrorf("-T %s: unknown test option (s, a, b, f, n, r, v)", arg)
		}
	}
	return o, nil
}

func runRstream(args []string) error { return rstreamTool("rstream", args) }

// runRiostream is rxego riostream: rstream with direct placement.
func runRiostream(args []string) error { return rstreamTool("riostream", args) }

// rstreamTool is rxego rstream and rxego riostream, whose flags are the
// same (riostream has no -k and no -T s).
func rstreamTool(name string, args []string) error {
	direct := name == "riostream"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		if direct {
			fmt.Fprintf(fs.Output(), `usage: rxego riostream [-s server_address] [-b bind_address] [-B buffer_size]
       [-i inline_size] [-I iterations] [-C transfer_count] [-S size|all]
       [-p port] [-T test_option]...

Talks to librdmacm's riostream: rstream's tests, each transfer an RDMA
WRITE straight into the peer's mapped buffer (riomap, riowrite), the
last byte of each round a marker the receiver watches for. Flags as
rxego rstream's.

flags:
`)
			printFlags(fs)
			return
		}
		fmt.Fprintf(fs.Output(), `usage: rxego rstream [-s server_address] [-b bind_address] [-B buffer_size]
       [-i inline_size] [-I iterations] [-C transfer_count] [-S size|all]
       [-p port] [-k keepalive_time] [-T test_option]...

Talks to librdmacm's rstream over rsocket (package rsocket: RDMA WRITEs
with immediate on an rdma_cm connection), with its flags and output.
Without -s it is the server: -b is the local RoCE address it binds
(default: every IPv4 address of the host). The client's -b is its own
address (default: the route's source toward -s). -T s uses TCP sockets
instead; -T a, b, n and r are accepted and change nothing (Go calls
block); -T v verifies every byte.

  rxego rstream -b 198.18.0.1 -T v           # server
  rstream -s 198.18.0.1 -T v                 # the peer, elsewhere

flags:
`)
		printFlags(fs)
	}
	dst := fs.String("s", "", "server address (client)")
	bind := fs.String("b", "", "bind address")
	_ = fs.String("f", "", "address format: name, ip, ipv6 or gid (accepted; rxego takes names and IP addresses)")
	bufSize := fs.Int("B", 0, "buffer size (rsocket's SO_SNDBUF and SO_RCVBUF; default 512 KiB, doubled as rsocket does)")
	inline := fs.Int("i", 64, "inline size (latency tests)")
	iters := fs.Int("I", 0, "iterations (a custom test)")
	count := fs.Int("C", 0, "transfer count (a custom test)")
	size := fs.String("S", "", "transfer size (a custom test) or all (every size of the table)")
	port := fs.Uint("p", rstream.DefaultPort, "port")
	keepalive := new(int)
	if !direct {
		keepalive = fs.Int("k", 0, "keepalive time in seconds (0: off)")
	}
	var topts testOpts
	fs.Var(&topts, "T", "test option, repeatable: s|socket, a|async, b|blocking, f|fork, n|nonblocking, r|resolve, v|verify")
	f := addCMFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	o, err := parseTestOpts(topts)
	if err != nil {
		return err
	}
	if direct && o.tcp {
		return usageErrorf("-T s: riostream has no socket mode")
	}
	cfg := rstream.Config{Verify: o.verify, Out: os.Stdout, Iterations: *iters, Count: *count, Direct: direct}
	cfg.Custom = *iters != 0 || *count != 0
	switch {
	case strings.EqualFold(*size, "all"):
		cfg.All = true
	case *size != "":
		n, err := strconv.Atoi(*size)
		if err != nil || n < 1 {
			return usageErrorf("-S %q: want a size or all", *size)
		}
		cfg.Size, cfg.Custom = n, true
	}
	if *port > 0xffff || *bufSize < 0 || *keepalive < 0 || *iters < 0 || *count < 0 || *inline < 0 {
		return usageErrorf("port %d, buffer size %d, keepalive %d, iterations %d, count %d, inline %d out of range",
			*port, *bufSize, *keepalive, *iters, *count, *inline)
	}
	buf := 1 << 19
	if *bufSize > 0 {
		buf = *bufSize
	}
	rcfg := func(latency bool) *rsocket.Config {
		c := &rsocket.Config{SendBuffer: 2 * buf, RecvBuffer: 2 * buf, Inline: *inline,
			KeepAlive: time.Duration(*keepalive) * time.Second}
		if !latency {
			c.Inline = -1 // rstream's bandwidth tests turn inline off
		}
		if direct {
			c.IOMapSize = 1 // riostream's RDMA_IOMAPSIZE
		}
		return c
	}
	showKeepalive := func() {
		if *keepalive > 0 {
			fmt.Printf("Keepalive: ON\n  time: %d\n", *keepalive)
		}
	}
	// The connections' rsocket counters join --stats once they are
	// closed: messages taken after this side's DISCONNECT bound the
	// packets the peer may not count (rsocket.Stats.AfterShutdown).
	var conns rsocketConns
	f.extra = conns.counters
	client := *dst != ""
	if o.tcp {
		return rstreamTCP(client, *dst, *bind, uint16(*port), *keepalive, showKeepalive, cfg, *f.timeout)
	}
	if client {
		return rsocketClient(*dst, *bind, uint16(*port), f, func(ctx context.Context, m *cm.Manager, to string) error {
			rstream.Header(os.Stdout)
			return rstream.Run(ctx, true, func(ctx context.Context, latency bool) (net.Conn, error) {
				showKeepalive()
				c, err := rsocket.DialContext(ctx, m, to, rcfg(latency))
				if err != nil {
					return nil, rsocketDialError(to, err, *f.timeout)
				}
				conns.add(c)
				return c, nil
			}, cfg)
		})
	}
	var header sync.Once
	return rsocketServer(*bind, uint16(*port), f, func(ctx context.Context, ln *rsocket.Listener) error {
		header.Do(func() { rstream.Header(os.Stdout) })
		return rstream.Run(ctx, false, func(ctx context.Context, latency bool) (net.Conn, error) {
			showKeepalive() // rstream sets its options on the listening rsocket, then the accepted one
			if err := ln.SetConfig(rcfg(latency)); err != nil {
				return nil, err
			}
			c, err := acceptContext(ctx, ln)
			if err != nil {
				return nil, err
			}
			showKeepalive()
			conns.add(c)
			return c, nil
		}, cfg)
	}, rcfg(true))
}

// rsocketConns are the connections a tool made, for their counters.
type rsocketConns struct {
	mu    sync.Mutex
	conns []*rsocket.Conn
}

func (r *rsocketConns) add(c *rsocket.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conns = append(r.conns, c)
}

// counters sums the connections' rsocket counters that --stats reports.
func (r *rsocketConns) counters() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var after uint64
	for _, c := range r.conns {
		after += c.Stats().AfterShutdown
	}
	return map[string]uint64{"rsocket_after_shutdown": after}
}

// acceptContext is ln.AcceptRsocket ending with ctx (the listener is
// closed then).
func acceptContext(ctx context.Context, ln *rsocket.Listener) (*rsocket.Conn, error) {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	c, err := ln.AcceptRsocket()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return c, nil
}

// rsocketDialError is dialError for an rsocket dial under the -timeout
// timeout.
func rsocketDialError(to string, err error, timeout time.Duration) error {
	if err == nil {
		return nil
	}
	ap, perr := netip.ParseAddrPort(to)
	if perr != nil {
		return err
	}
	return dialError(ap, err, timeout)
}

// rsocketClient opens a device on -b (or the route's source toward dst)
// and runs fn with dst:port.
func rsocketClient(dst, bind string, port uint16, f cmFlags, fn func(ctx context.Context, m *cm.Manager, to string) error) error {
	ip, err := resolveHost(dst)
	if err != nil {
		return err
	}
	local, err := localAddr(bind, ip)
	if err != nil {
		return err
	}
	to := netip.AddrPortFrom(ip, port).String()
	return cmRun(local, f, func(ctx context.Context, m *cm.Manager) error { return fn(ctx, m, to) })
}

// rsocketServer listens on port of -b (or of every IPv4 address of the
// host) and runs fn with the listener of the address a client comes to.
func rsocketServer(bind string, port uint16, f cmFlags, fn func(ctx context.Context, ln *rsocket.Listener) error, cfg *rsocket.Config) error {
	var locals []netip.Addr
	if bind != "" {
		ip, err := resolveHost(bind)
		if err != nil {
			return err
		}
		locals = []netip.Addr{ip}
	} else {
		var err error
		if locals, err = listenAddrs(); err != nil {
			return err
		}
	}
	return cmRunAll(locals, f, func(ctx context.Context, m *cm.Manager) error {
		ln, err := rsocket.Listen(m, ":"+strconv.Itoa(int(port)), cfg)
		if err != nil {
			return err
		}
		defer ln.Close()
		fmt.Printf("%s%v\n", listeningPrefix, ln.Addr())
		return fn(ctx, ln)
	})
}

// resolveHost takes an IP address or a host name (its first IPv4
// address, else its first).
func resolveHost(s string) (netip.Addr, error) {
	if ip, err := netip.ParseAddr(s); err == nil {
		return ip.Unmap(), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", s)
	if err != nil || len(ips) == 0 {
		return netip.Addr{}, usageErrorf("address %q: %v", s, err)
	}
	for _, ip := range ips {
		if ip.Unmap().Is4() {
			return ip.Unmap(), nil
		}
	}
	return ips[0], nil
}

// rstreamTCP is rstream -T s: the same tests over TCP.
func rstreamTCP(client bool, dst, bind string, port uint16, keepalive int, showKeepalive func(), cfg rstream.Config, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d := net.Dialer{KeepAlive: -1}
	lc := net.ListenConfig{KeepAlive: -1}
	if keepalive > 0 {
		d.KeepAlive = time.Duration(keepalive) * time.Second
		lc.KeepAlive = d.KeepAlive
	}
	if client {
		rstream.Header(os.Stdout)
		return rstream.Run(ctx, true, func(ctx context.Context, _ bool) (net.Conn, error) {
			showKeepalive()
			return d.DialContext(ctx, "tcp", net.JoinHostPort(dst, strconv.Itoa(int(port))))
		}, cfg)
	}
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(bind, strconv.Itoa(int(port))))
	if err != nil {
		return err
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	rstream.Header(os.Stdout)
	err = rstream.Run(ctx, false, func(ctx context.Context, _ bool) (net.Conn, error) {
		showKeepalive()
		c, err := ln.Accept()
		if err == nil {
			showKeepalive()
		}
		return c, err
	}, cfg)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (-timeout %v)", errors.Join(err, ctx.Err()), timeout)
	}
	return err
}
