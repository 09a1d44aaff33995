package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"

	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cm/udaddy"
)

func init() {
	register("udaddy", "peer for librdmacm's udaddy: UD QPs resolved with rdma_cm (SIDR), datagrams both ways (same flags)", runUdaddy)
}

func runUdaddy(args []string) error {
	fs := flag.NewFlagSet("udaddy", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: rxego udaddy [-s server_address] [-b bind_address] [-c connections] [-C message_count] [-S message_size] [-p port]

Talks to librdmacm's udaddy: UD QPs found through rdma_cm's UDP port space
(SIDR_REQ/SIDR_REP on QP1), message_count datagrams each way. Without -s
it is the server; -b is the local RoCE address (the client's default: the
route's source toward -s).

  rxego udaddy -b 198.18.0.1                  # server
  udaddy -s 198.18.0.1                        # the peer, elsewhere

flags:
`)
		fs.PrintDefaults()
	}
	dst := fs.String("s", "", "server address (client mode)")
	bind := fs.String("b", "", "local address")
	conns := fs.Int("c", udaddy.DefaultConnections, "connections")
	count := fs.Int("C", udaddy.DefaultCount, "messages each way per connection")
	size := fs.Int("S", udaddy.DefaultSize, "message size (at most the path MTU)")
	port := fs.Uint("p", udaddy.DefaultPort, "rdma_cm UDP port")
	f := addCMFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *port > 0xffff {
		return fmt.Errorf("port %d out of range", *port)
	}
	cfg := udaddy.Config{Connections: *conns, Count: *count, Size: *size, Out: os.Stdout}
	report := func(res udaddy.Result, err error) error {
		fmt.Printf("rxego udaddy: %d connections, %d sent, %d received, %d verified\n",
			res.Connections, res.Sent, res.Received, res.Verified)
		return err
	}
	if *dst == "" {
		local, err := netip.ParseAddr(*bind)
		if err != nil {
			return fmt.Errorf("the server needs its local address: -b: %v", err)
		}
		return cmRun(local, f, func(ctx context.Context, m *cm.Manager) error {
			l, err := m.ListenUD(uint16(*port))
			if err != nil {
				return err
			}
			fmt.Printf("%s%v\n", listeningPrefix, netip.AddrPortFrom(local, uint16(*port)))
			return report(udaddy.Serve(ctx, m, l, cfg))
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
		return report(udaddy.Dial(ctx, m, netip.AddrPortFrom(peer, uint16(*port)), cfg))
	})
}
