package bench

import (
	"context"
	"testing"
	"time"

	"github.com/rxego/rxego"
)

// TestDeviceNoAllocs checks a whole device pair on loopback — PostSend,
// the engine, Emit's GSO runs, sendmmsg, recvmmsg with GRO, the ICRC both
// ways, the receive loop, ACKs and the CQ — allocates nothing in steady
// state, for multi-packet WRITEs and READs and for small WRITEs, with
// payloads copied and (Options.ZeroCopy) sent from the MRs.
func TestDeviceNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, tc := range []struct {
		name string
		op   rxego.WROpcode
		size int
		mtu  rxego.MTU
	}{
		{"write-64KiB-mtu1024", rxego.WRWrite, 64 << 10, rxego.MTU1024},
		{"write-64KiB-mtu4096", rxego.WRWrite, 64 << 10, rxego.MTU4096},
		{"read-64KiB-mtu4096", rxego.WRRead, 64 << 10, rxego.MTU4096},
		{"write-64B", rxego.WRWrite, 64, rxego.MTU1024},
	} {
		for _, zc := range []bool{false, true} {
			name := tc.name
			if zc {
				name += "-zerocopy"
			}
			t.Run(name, func(t *testing.T) {
				p := newPairOpts(t, tc.mtu, tc.size, 4, &rxego.Options{ZeroCopy: zc})
				wr := rxego.SendWR{Opcode: tc.op, Flags: rxego.SendSignaled,
					SGL:        []rxego.SGE{{Addr: p.mrs[0].IOVA(), Length: uint32(tc.size), LKey: p.mrs[0].LKey()}},
					RemoteAddr: p.mrs[1].IOVA(), RKey: p.mrs[1].RKey()}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				wcs := make([]rxego.WC, 4)
				round := func() {
					if err := p.qps[0].PostSend(wr); err != nil {
						t.Fatal(err)
					}
					n, err := p.cqs[0].PollWait(ctx, wcs)
					if err != nil || n != 1 || wcs[0].Status != rxego.WCSuccess {
						t.Fatalf("PollWait = %d, %v, %v", n, err, wcs[:n])
					}
				}
				for range 10 {
					round()
				}
				pkts := p.devs[0].Stats().SentPkts
				allocs := testing.AllocsPerRun(200, round)
				pkts = p.devs[0].Stats().SentPkts - pkts
				// AllocsPerRun counts whole allocations per round, so a stray
				// one of the runtime's in the window does not fail the test.
				if allocs > 0 {
					t.Errorf("%v allocations per round (%d packets sent per round)", allocs, pkts/201)
				}
			})
		}
	}
}
