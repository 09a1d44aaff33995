package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"

	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cmd/rxego/internal/exchange"
	"github.com/rxego/rxego/internal/app/ladder"
)

// burstTool is one of the rdma_cm burst tools (ucmatose, udaddy): the
// same flags, a server and a client, and one summary line.
type burstTool struct {
	name, usage string
	port        uint
	conns       int // default -c
	count       int // default -C
	size        int // default -S
	// tool refuses settings before anything listens or dials.
	tool exchange.Tool
	// serve runs the server on the manager, listening on port, and calls
	// ready once it listens; dial runs the client toward raddr. Both
	// return the run's counts.
	serve func(ctx context.Context, m *cm.Manager, port uint16, c exchange.Params, ready func()) (exchange.Result, error)
	dial  func(ctx context.Context, m *cm.Manager, raddr netip.AddrPort, c exchange.Params) (exchange.Result, error)
	// serverChecks, when set, follows the server's summary: what the
	// server can check of what it received where it verifies no content.
	serverChecks string
}

// run parses args and runs the tool.
func (x burstTool) run(args []string) error {
	fs := flag.NewFlagSet(x.name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: rxego %s [-s server_address] [-b bind_address] [-c connections] [-C message_count] [-S message_size] [-p port]\n\n%s\nflags:\n", x.name, x.usage)
		printFlags(fs)
	}
	dst := fs.String("s", "", "server address (client mode)")
	bind := fs.String("b", "", "local address")
	conns := fs.Int("c", x.conns, "connections")
	count := fs.Int("C", x.count, "messages each way per connection")
	size := fs.Int("S", x.size, "message size")
	port := fs.Uint("p", x.port, "rdma_cm port")
	f := addCMFlags(fs)
	if err := parseFlags(fs, args, "c", "C", "S"); err != nil {
		return err
	}
	if *port > 0xffff {
		return usageErrorf("port %d out of range", *port)
	}
	cfg := exchange.Params{Connections: *conns, Count: *count, Size: *size, Out: os.Stdout}
	// Checked before anything listens or dials.
	if err := x.tool.Check(cfg); err != nil {
		return &usageError{err.Error()}
	}
	report := func(server bool, res exchange.Result, err error) error {
		fmt.Printf("rxego %s: %s, %d sent, %d received, %d verified",
			x.name, ladder.Count(res.Connections, "connection"), res.Sent, res.Received, res.Verified)
		if server && x.serverChecks != "" {
			fmt.Printf(" (%s)", x.serverChecks)
		}
		fmt.Println()
		return err
	}
	if *dst == "" {
		local, err := netip.ParseAddr(*bind)
		if err != nil {
			return usageErrorf("the server needs its local address: -b: %v", err)
		}
		return cmRun(local, f, func(ctx context.Context, m *cm.Manager) error {
			ready := func() { fmt.Printf("%s%v\n", listeningPrefix, netip.AddrPortFrom(local, uint16(*port))) }
			res, err := x.serve(ctx, m, uint16(*port), cfg, ready)
			return report(true, res, err)
		})
	}
	peer, err := netip.ParseAddr(*dst)
	if err != nil {
		return usageErrorf("-s %q: %v", *dst, err)
	}
	local, err := localAddr(*bind, peer)
	if err != nil {
		return err
	}
	to := netip.AddrPortFrom(peer, uint16(*port))
	if err := noRoCEThere(to); err != nil {
		return err
	}
	return cmRun(local, f, func(ctx context.Context, m *cm.Manager) error {
		stop := reportREQRetries(ctx, x.name, m, to)
		defer stop()
		res, err := x.dial(ctx, m, to, cfg)
		return dialError(to, report(false, res, err), *f.timeout)
	})
}
