package conformance

import (
	"fmt"
	"testing"
)

// TestUdaddy runs udaddy (rdma_cm over UD: SIDR_REQ/SIDR_REP on QP1, the
// UDP port space) with one and with several connections in both roles,
// 10 datagrams each way per connection. rxego's client verifies every
// reply (it carries the client's message back); its server cannot check
// udaddy's data, which is an uninitialised buffer.
func TestUdaddy(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, conns := range []int{1, 3} {
			for _, server := range []bool{true, false} {
				role, verified := "rxego client", 10*conns
				if server {
					role, verified = "rxego server", 0
				}
				p.Case(t, Case{Name: fmt.Sprintf("udaddy -c %d", conns), Role: role, Expect: cmExpect}, func(t *testing.T) Outcome {
					return p.cmExchange(t, "udaddy", 7174, server, conns, verified)
				})
			}
		}
	})
}
