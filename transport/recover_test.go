package transport

import (
	"net/netip"
	"testing"

	"github.com/rxego/rxego/bth"
)

// TestRecoverFromFlow checks recover with a flow folded once for many
// packets, in both families: a right guess, a wrong one and none all give
// the packet's own IPv4 ID (IPv6: 0), and another peer's flow (a stale
// one) drops the packet as a bad ICRC rather than accepting it.
func TestRecoverFromFlow(t *testing.T) {
	for _, fam := range []struct {
		local string
		peers [2]string
	}{
		{"127.0.0.2:4791", [2]string{"127.0.0.9:5000", "127.0.0.77:61234"}},
		{"[::1]:4791", [2]string{"[::1]:5000", "[fd00::77]:61234"}},
	} {
		local := netip.MustParseAddrPort(fam.local)
		e := newEndpoint(local)
		for _, n := range []int{bth.Len + 4, 300, 1040, 4136} {
			for i, p := range fam.peers {
				peer := netip.MustParseAddrPort(p)
				pkt := make([]byte, n)
				h := bth.BTH(pkt)
				h.SetOpcode(bth.RCSendOnly)
				h.SetPKey(bth.DefaultPKey)
				h.SetPSN(bth.PSN(n))
				id := uint16(0x1234)
				e.flow(peer, local).Fill(id, pkt)
				if e.v6 {
					id = 0
				}
				flow := e.inbound(peer)
				for _, guess := range []uint16{id, id + 1, 0} {
					_, got, reason, ok := e.recover(pkt, peer, flow, guess)
					if !ok || got != id || reason != 0 {
						t.Fatalf("%v from %v, %d bytes, guess %#x: id %#x, reason %v, ok %v; want %#x", local, peer, n, guess, got, reason, ok, id)
					}
				}
				other := e.inbound(netip.MustParseAddrPort(fam.peers[1-i]))
				if _, _, reason, ok := e.recover(pkt, peer, other, id); ok || reason != DropBadICRC {
					t.Fatalf("%v from %v, %d bytes, another peer's flow: reason %v, ok %v; want %v", local, peer, n, reason, ok, DropBadICRC)
				}
			}
		}
	}
}
