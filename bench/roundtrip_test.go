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

// BenchmarkRoundTripSend is BenchmarkRoundTrip's SEND ping-pong, the
// harness's SEND latency case: an unsignaled 64-byte inline SEND, the
// other side echoing each one it receives with a SEND of its own, both
// sides reposting their receives. Beside BenchmarkRoundTrip it shows
// what SEND adds to a WRITE: the echo's receive and send posts, and the
// responder's ACK riding with the echo in one datagram each way.
func BenchmarkRoundTripSend(b *testing.B) {
	p := newPairOpts(b, rxego.MTU1024, 4096, 16, &rxego.Options{BusyPoll: 200 * time.Microsecond})
	var recvs [2]rxego.RecvWR
	for i := range recvs {
		recvs[i] = rxego.RecvWR{SGL: []rxego.SGE{{Addr: p.mrs[i].IOVA() + 2048, Length: 64, LKey: p.mrs[i].LKey()}}}
		for range 8 {
			if err := p.qps[i].PostRecv(recvs[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
	wr := rxego.SendWR{Opcode: rxego.WRSend, Flags: rxego.SendInline, Inline: make([]byte, 64)}
	wcs, echoWCs := make([]rxego.WC, 4), make([]rxego.WC, 4)
	pingpong.Run(b,
		func() error { return p.qps[0].PostSend(wr) },
		func() (bool, error) {
			n, err := p.cqs[0].Poll(wcs)
			if err != nil || n == 0 {
				return false, err
			}
			if wcs[0].Status != rxego.WCSuccess || wcs[0].Opcode != rxego.WCRecv {
				return false, fmt.Errorf("echo arrived as %v %v", wcs[0].Opcode, wcs[0].Status)
			}
			return true, p.qps[0].PostRecv(recvs[0])
		},
		func() error {
			n, err := p.cqs[1].Poll(echoWCs)
			for _, wc := range echoWCs[:n] {
				if wc.Status != rxego.WCSuccess {
					return fmt.Errorf("SEND arrived with %v", wc.Status)
				}
				if err := p.qps[1].PostRecv(recvs[1]); err != nil {
					return err
				}
				if err := p.qps[1].PostSend(wr); err != nil {
					return err
				}
			}
			return err
		})
}
