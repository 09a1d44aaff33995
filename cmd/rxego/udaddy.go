package main

import (
	"context"

	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cmd/rxego/internal/exchange"
	"github.com/rxego/rxego/cmd/rxego/internal/udaddy"
)

func init() {
	register("udaddy", "peer for librdmacm's udaddy: UD QPs resolved with rdma_cm (SIDR), datagrams both ways (same flags)", udaddyTool.run)
}

// udaddyTool is rxego udaddy.
var udaddyTool = burstTool{
	name: "udaddy",
	usage: `Talks to librdmacm's udaddy: UD QPs found through rdma_cm's UDP port space
(SIDR_REQ/SIDR_REP on QP1), message_count datagrams each way (the size at
most the path MTU). Without -s it is the server; -b is the local RoCE
address (the client's default: the route's source toward -s).

  rxego udaddy -b 198.18.0.1                  # server
  udaddy -s 198.18.0.1                        # the peer, elsewhere
`,
	port: udaddy.DefaultPort, conns: udaddy.DefaultConnections, count: udaddy.DefaultCount, size: udaddy.DefaultSize,
	tool: udaddy.Tool,
	serve: func(ctx context.Context, m *cm.Manager, port uint16, c exchange.Params, ready func()) (exchange.Result, error) {
		l, err := m.ListenUD(port)
		if err != nil {
			return exchange.Result{}, err
		}
		ready()
		return udaddy.Serve(ctx, m, l, c)
	},
	dial: udaddy.Dial,
	// udaddy's client sends its buffer as it is (no pattern), so the
	// server has no content to verify; the client checks that each reply
	// carries its message back.
	serverChecks: "nothing failed: the server checks each datagram's length and its immediate data (the sender's QPN); " +
		"udaddy's payload is unset memory, so its content is verified by the client, which gets it echoed back",
}
