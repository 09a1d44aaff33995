package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strconv"

	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cmd/rxego/internal/mckey"
	"github.com/rxego/rxego/internal/app/ladder"
)

func init() {
	register("mckey", "peer for librdmacm's mckey: UD QPs joined to a multicast group with rdma_cm, datagrams to the group (same flags)", runMckey)
}

// udpPortSpace is RDMA_PS_UDP, mckey's -p default; RDMA_PS_IPOIB (0x2) is
// an InfiniBand port space rxego does not have.
const udpPortSpace = 0x0111

func runMckey(args []string) error {
	fs := flag.NewFlagSet("mckey", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: rxego mckey -m multicast_address [-s] [-b bind_address] [-c connections] [-C message_count] [-S message_size] [-o]

Talks to librdmacm's mckey: each connection is a UD QP joined to the group
with rdma_cm's multicast join (the IPv4 group a.b.c.d is the MGID
::ffff:a.b.c.d, Q_Key 0x01234567, QPN 0xFFFFFF). With -s it sends
message_count datagrams to the group per connection; without, it receives
message_count per connection. After joining it pauses (--pause, 3 s as
mckey) so that every member has joined before anything is sent.

  rxego mckey -m 239.1.2.3 -b 198.18.0.1 -c 2   # two receivers
  mckey -m 239.1.2.3 -s                          # the sender, elsewhere

flags:
`)
		printFlags(fs)
	}
	group := fs.String("m", "", "multicast group address")
	unmapped := fs.String("M", "", "multicast GID used as is (an IPv6 address); replaces -m and requires -b")
	sender := fs.Bool("s", false, "send to the group (default: receive)")
	bind := fs.String("b", "", "local address (default: the route's source toward the group)")
	conns := fs.Int("c", mckey.DefaultConnections, "connections: QPs, each joined")
	count := fs.Int("C", mckey.DefaultCount, "datagrams per connection")
	size := fs.Int("S", mckey.DefaultSize, "datagram size")
	ps := fs.String("p", fmt.Sprintf("%#x", udpPortSpace), fmt.Sprintf("port space: %#x for UDP (the only one on RoCE)", udpPortSpace))
	sendOnly := fs.Bool("o", false, "join as a send-only full member (senders: no IP group join, no attach)")
	pause := fs.Duration("pause", mckey.DefaultPause, "wait after joining before sending or receiving")
	f := addCMFlags(fs)
	if err := parseFlags(fs, args, "c", "C", "S"); err != nil {
		return err
	}
	if n, err := strconv.ParseInt(*ps, 0, 32); err != nil || n != udpPortSpace {
		return usageErrorf("-p %s: rxego has only the UDP port space (%#x) on RoCE", *ps, udpPortSpace)
	}
	name, addr := "-m", *group
	if *unmapped != "" {
		if *bind == "" {
			return usageErrorf("unmapped multicast address requires binding to source address (-b)")
		}
		name, addr = "-M", *unmapped
	}
	if addr == "" {
		return usageErrorf("mckey needs a multicast address: -m")
	}
	g, err := netip.ParseAddr(addr)
	if err != nil {
		return usageErrorf("%s %q: %v", name, addr, err)
	}
	if *unmapped != "" && !g.Is6() {
		return usageErrorf("-M %s: an unmapped MGID is an IPv6 address", addr)
	}
	if *pause <= 0 {
		*pause = -1 // mckey.Config: none
	}
	cfg := mckey.Config{Group: g, Sender: *sender, SendOnly: *sendOnly, Pause: *pause}
	cfg.Connections, cfg.Count, cfg.Size, cfg.Out = *conns, *count, *size, os.Stdout
	if err := cfg.Check(); err != nil {
		return &usageError{err.Error()}
	}
	local, err := localAddr(*bind, g.Unmap())
	if err != nil {
		return err
	}
	if *bind != "" {
		cfg.Source = local
	}
	return cmRun(local, f, func(ctx context.Context, m *cm.Manager) error {
		res, err := mckey.Run(ctx, m, cfg)
		fmt.Printf("rxego mckey: %s, %d sent, %d received, %d verified\n",
			ladder.Count(res.Connections, "connection"), res.Sent, res.Received, res.Verified)
		fmt.Println("test complete")
		return err
	})
}
