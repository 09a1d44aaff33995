package bench

import (
	"context"
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/rxego/rxego"
)

// TestBusyPollPingPong runs a SEND ping-pong between two busy-polling
// devices, each side spinning on CQ.Poll (which takes the packets in on
// the polling goroutine) and, for a second round, waiting in PollWait:
// every message must come back with its number, and every ACK must
// arrive, the ones held for a reply too.
func TestBusyPollPingPong(t *testing.T) {
	p := newPairOpts(t, rxego.MTU1024, 4096, 16, &rxego.Options{BusyPoll: 100 * time.Microsecond})
	const iters = 300
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recv := func(i int) rxego.RecvWR {
		return rxego.RecvWR{SGL: []rxego.SGE{{Addr: p.mrs[i].IOVA() + 2048, Length: 64, LKey: p.mrs[i].LKey()}}}
	}
	for i := range 2 {
		for range 4 {
			if err := p.qps[i].PostRecv(recv(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	wait := func(i int, spin bool, wcs []rxego.WC) {
		t.Helper()
		for {
			var n int
			if spin {
				var err error
				if n, err = p.cqs[i].Poll(wcs); err != nil {
					t.Fatal(err)
				}
				if ctx.Err() != nil {
					t.Fatal(ctx.Err())
				}
			} else {
				var err error
				if n, err = p.cqs[i].PollWait(ctx, wcs); err != nil {
					t.Fatal(err)
				}
			}
			if n > 0 {
				if wcs[0].Status != rxego.WCSuccess || wcs[0].Opcode != rxego.WCRecv || wcs[0].ByteLen != 64 {
					t.Fatalf("side %d: completion %+v", i, wcs[0])
				}
				return
			}
			runtime.Gosched()
		}
	}
	send := func(i int, v uint64) {
		t.Helper()
		msg := make([]byte, 64)
		binary.LittleEndian.PutUint64(msg, v)
		if err := p.qps[i].PostSend(rxego.SendWR{Opcode: rxego.WRSend, Flags: rxego.SendInline, Inline: msg}); err != nil {
			t.Fatal(err)
		}
	}
	for _, spin := range []bool{true, false} {
		done := make(chan struct{})
		go func() { // the echo side
			defer close(done)
			wcs := make([]rxego.WC, 1)
			for k := range iters {
				wait(1, spin, wcs)
				p.devs[1].Sync()
				got := binary.LittleEndian.Uint64(p.mrs[1].Buffer()[2048:])
				if got != uint64(k) {
					t.Errorf("echo side got message %d, want %d", got, k)
				}
				if err := p.qps[1].PostRecv(recv(1)); err != nil {
					t.Error(err)
				}
				send(1, got)
			}
		}()
		wcs := make([]rxego.WC, 1)
		for k := range iters {
			send(0, uint64(k))
			wait(0, spin, wcs)
			p.devs[0].Sync()
			if got := binary.LittleEndian.Uint64(p.mrs[0].Buffer()[2048:]); got != uint64(k) {
				t.Fatalf("message %d came back as %d", k, got)
			}
			if err := p.qps[0].PostRecv(recv(0)); err != nil {
				t.Fatal(err)
			}
		}
		<-done
	}
	// Every message and every ACK arrives; the last ACK, held for a reply
	// that never comes, within the hold bound.
	want := uint64(2 * iters * 2)
	deadline := time.Now().Add(2 * time.Second)
	for i, d := range p.devs {
		for d.Stats().RcvdPkts < want && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		// More is fine: a stalled machine may set off a retransmission.
		if n := d.Stats().RcvdPkts; n < want {
			t.Errorf("device %d took in %d packets, want %d", i, n, want)
		}
	}
}
