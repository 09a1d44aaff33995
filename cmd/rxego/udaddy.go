package main

import (
	"context"
	"net/netip"
	"os"

	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cmd/rxego/internal/udaddy"
)

func init() {
	register("udaddy", "peer for librdmacm's udaddy: UD QPs resolved with rdma_cm (SIDR), datagrams both ways (same flags)", udaddyTool.run)
}

// udaddyTool is rxego udaddy.
var udaddyTool = exchange{
	name: "udaddy",
	usage: `Talks to librdmacm's udaddy: UD QPs found through rdma_cm's UDP port space
(SIDR_REQ/SIDR_REP on QP1), message_count datagrams each way (the size at
most the path MTU). Without -s it is the server; -b is the local RoCE
address (the client's default: the route's source toward -s).

  rxego udaddy -b 198.18.0.1                  # server
  udaddy -s 198.18.0.1                        # the peer, elsewhere
`,
	port: udaddy.DefaultPort, conns: udaddy.DefaultConnections, count: udaddy.DefaultCount, size: udaddy.DefaultSize,
	check: func(c exchangeConfig) error { return udaddyConfig(c).Check() },
	serve: func(ctx context.Context, m *cm.Manager, port uint16, c exchangeConfig, ready func()) (exchangeResult, error) {
		l, err := m.ListenUD(port)
		if err != nil {
			return exchangeResult{}, err
		}
		ready()
		return udaddyResult(udaddy.Serve(ctx, m, l, udaddyConfig(c)))
	},
	dial: func(ctx context.Context, m *cm.Manager, raddr netip.AddrPort, c exchangeConfig) (exchangeResult, error) {
		return udaddyResult(udaddy.Dial(ctx, m, raddr, udaddyConfig(c)))
	},
	// udaddy's client sends its buffer as it is (no pattern), so the
	// server has no content to verify; the client checks that each reply
	// carries its message back.
	serverChecks: "nothing failed: the server checks each datagram's length and its immediate data (the sender's QPN); " +
		"udaddy's payload is unset memory, so its content is verified by the client, which gets it echoed back",
}

func udaddyConfig(c exchangeConfig) udaddy.Config {
	return udaddy.Config{Connections: c.conns, Count: c.count, Size: c.size, Out: os.Stdout}
}

func udaddyResult(r udaddy.Result, err error) (exchangeResult, error) {
	return exchangeResult{r.Connections, r.Sent, r.Received, r.Verified}, err
}
