package transport

import (
	"errors"
	"net"
	"testing"
	"time"
)

// TestPoller checks TryRecv and WaitReadable: TryRecv returns 0 at once
// when nothing is queued and the packets otherwise, WaitReadable returns
// once a packet is queued without consuming it, neither allocates, and
// Close ends a WaitReadable.
func TestPoller(t *testing.T) {
	for _, oc := range offloadCases {
		t.Run(oc.name, func(t *testing.T) {
			a := listenAny(t, "127.0.0.1", oc.opts)
			b := listenAny(t, "127.0.0.2", oc.opts)
			p, ok := b.(Poller)
			if !ok {
				t.Fatal("the Conn of Listen is not a Poller")
			}
			rmsgs := make([]Message, 8)
			if n, err := p.TryRecv(rmsgs); n != 0 || err != nil {
				t.Fatalf("TryRecv on an empty socket = %d, %v", n, err)
			}
			msgs := []Message{{Buf: rocePacket(256, 1), Peer: b.LocalAddr()}, {Buf: rocePacket(256, 2), Peer: b.LocalAddr()}}
			timer := time.AfterFunc(20*time.Second, func() { b.Close() }) // never hang
			defer timer.Stop()
			round := func() {
				if k, err := a.Send(msgs); k != len(msgs) || err != nil {
					t.Fatalf("Send = %d, %v", k, err)
				}
				for got := 0; got < len(msgs); {
					if err := p.WaitReadable(); err != nil {
						t.Fatalf("WaitReadable: %v", err)
					}
					k, err := p.TryRecv(rmsgs)
					if err != nil {
						t.Fatalf("TryRecv: %v", err)
					}
					for _, m := range rmsgs[:k] {
						if psnOf(m.Buf) != uint32(got+1) {
							t.Fatalf("packet %d has PSN %d", got, psnOf(m.Buf))
						}
						got++
					}
				}
			}
			round()
			if !raceEnabled {
				if allocs := testing.AllocsPerRun(50, round); allocs != 0 {
					t.Errorf("%v allocations per round", allocs)
				}
			}
			done := make(chan error, 1)
			go func() { done <- p.WaitReadable() }()
			time.Sleep(10 * time.Millisecond)
			b.Close()
			select {
			case err := <-done:
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("WaitReadable after Close: %v, want net.ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close did not end WaitReadable")
			}
			if n, err := p.TryRecv(rmsgs); n != 0 || !errors.Is(err, net.ErrClosed) {
				t.Errorf("TryRecv after Close = %d, %v, want net.ErrClosed", n, err)
			}
		})
	}
}
