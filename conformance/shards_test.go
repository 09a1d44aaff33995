package conformance

import "testing"

// TestPerftestQ8 runs ib_write_bw and ib_send_bw with 8 QPs against
// rxego in both roles on every kernel: rxego spreads the QPs over its
// shards and sends each from its own UDP source port, rxe's counters stay
// balanced (perfBothRoles checks them as for every run).
func TestPerftestQ8(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, test := range []string{"write_bw", "send_bw"} {
			p.perfBothRoles(t, perfRun{Test: test, Size: 65536, Iters: 10, QPs: 8, MaxResent: maxResent})
		}
	})
}
