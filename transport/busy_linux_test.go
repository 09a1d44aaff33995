package transport

import (
	"errors"
	"net"
	"testing"
	"time"
)

// TestBusyPoll checks that a busy-polling Conn delivers what arrives, both
// while it spins and after it has gone back to blocking, allocates nothing
// doing so, and that Close ends a Recv that is spinning.
func TestBusyPoll(t *testing.T) {
	opts := Options{BusyPoll: 50 * time.Millisecond}
	a := listenAny(t, "127.0.0.1", opts)
	b := listenAny(t, "127.0.0.2", opts)
	msgs := []Message{{Buf: rocePacket(256, 1), Peer: b.LocalAddr()}, {Buf: rocePacket(256, 2), Peer: b.LocalAddr()}}
	rmsgs := make([]Message, 8)
	timer := time.AfterFunc(20*time.Second, func() { b.Close() }) // never hang
	defer timer.Stop()
	round := func() {
		if k, err := a.Send(msgs); k != len(msgs) || err != nil {
			t.Fatalf("Send = %d, %v", k, err)
		}
		for got := 0; got < len(msgs); {
			k, err := b.Recv(rmsgs)
			if err != nil {
				t.Fatalf("Recv: %v", err)
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
	// Past the spin: the Conn blocks in the poller and still wakes.
	time.Sleep(80 * time.Millisecond)
	round()
	before := b.Stats().RecvCalls
	done := make(chan error, 1)
	go func() {
		_, err := b.Recv(rmsgs)
		done <- err
	}()
	time.Sleep(10 * time.Millisecond) // inside the spin
	b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Recv after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a spinning Recv")
	}
	if after := b.Stats().RecvCalls; after != before {
		t.Errorf("%d receive calls counted for no packet", after-before)
	}
}
