package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/pingpong"
)

// BenchmarkRoundTrip is the top row of transport's BenchmarkRoundTrip: a
// busy-polled 64-byte WRITE between two devices of this process, from
// PostSend to its completion, the other device answering from its own
// spinning CQ.Poll (docs/performance.md, "Round trips by layer"). Run
// both in one sitting: the difference to transport's conn row is what
// the engine, the device and the verbs add; send-p50-ns is PostSend's.
func BenchmarkRoundTrip(b *testing.B) {
	p := newPairOpts(b, rxego.MTU1024, 4096, 16, &rxego.Options{BusyPoll: 200 * time.Microsecond})
	wr := rxego.SendWR{Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
		SGL:        []rxego.SGE{{Addr: p.mrs[0].IOVA(), Length: 64, LKey: p.mrs[0].LKey()}},
		RemoteAddr: p.mrs[1].IOVA() + 1024, RKey: p.mrs[1].RKey()}
	wcs, echoWCs := make([]rxego.WC, 4), make([]rxego.WC, 4)
	pingpong.Run(b,
		func() error { return p.qps[0].PostSend(wr) },
		func() (bool, error) {
			n, err := p.cqs[0].Poll(wcs)
			if n > 0 && wcs[0].Status != rxego.WCSuccess {
				return false, fmt.Errorf("WRITE completed with %v", wcs[0].Status)
			}
			return n > 0, err
		},
		func() error { _, err := p.cqs[1].Poll(echoWCs); return err })
}

// BenchmarkEmptyPoll is one CQ.Poll of a busy-polling device with nothing
// in flight: the look at the socket (transport's BenchmarkEmptyPoll) plus
// the device's and the CQ's own work, the interval at which a spinning
// application can notice a reply.
func BenchmarkEmptyPoll(b *testing.B) {
	p := newPairOpts(b, rxego.MTU1024, 4096, 16, &rxego.Options{BusyPoll: 200 * time.Microsecond})
	wcs := make([]rxego.WC, 4)
	for range b.N {
		if n, err := p.cqs[0].Poll(wcs); n != 0 || err != nil {
			b.Fatalf("Poll = %d, %v with nothing posted", n, err)
		}
	}
}
