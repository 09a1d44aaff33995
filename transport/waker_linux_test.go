package transport

import (
	"errors"
	"net"
	"testing"
	"time"
)

// TestWaker checks RecvWait and Wake: RecvWait returns the packets that
// are queued, 0 at its time limit, 0 when Wake comes while it waits or
// came after the caller read WakeSeq, and net.ErrClosed after Close; a
// Wake that no RecvWait took is ignored by Recv, which still delivers the
// next packet; nothing allocates.
func TestWaker(t *testing.T) {
	for _, oc := range offloadCases {
		t.Run(oc.name, func(t *testing.T) {
			a := listenAny(t, "127.0.0.1", oc.opts)
			b := listenAny(t, "127.0.0.2", oc.opts)
			w, ok := b.(Waker)
			if !ok {
				t.Fatal("the Conn of Listen is not a Waker")
			}
			timer := time.AfterFunc(20*time.Second, func() { b.Close() }) // never hang
			defer timer.Stop()
			rmsgs := make([]Message, 8)
			send := func(psn uint32) {
				t.Helper()
				if k, err := a.Send([]Message{{Buf: rocePacket(128, psn), Peer: b.LocalAddr()}}); k != 1 || err != nil {
					t.Fatalf("Send = %d, %v", k, err)
				}
			}

			// A time limit ends an empty wait.
			if n, err := w.RecvWait(rmsgs, w.WakeSeq(), time.Now().Add(5*time.Millisecond)); n != 0 || err != nil {
				t.Fatalf("RecvWait until a time = %d, %v", n, err)
			}
			// A Wake between WakeSeq and RecvWait is not lost.
			seq := w.WakeSeq()
			w.Wake()
			if n, err := w.RecvWait(rmsgs, seq, time.Time{}); n != 0 || err != nil {
				t.Fatalf("RecvWait after a Wake = %d, %v", n, err)
			}
			// A Wake while it waits ends the wait.
			go func() {
				time.Sleep(5 * time.Millisecond)
				w.Wake()
			}()
			if n, err := w.RecvWait(rmsgs, w.WakeSeq(), time.Time{}); n != 0 || err != nil {
				t.Fatalf("RecvWait woken = %d, %v", n, err)
			}
			// Packets: delivered in order, the waiting one too.
			smsgs := []Message{{Buf: rocePacket(128, 7), Peer: b.LocalAddr()}}
			round := func() {
				if k, err := a.Send(smsgs); k != 1 || err != nil {
					t.Fatalf("Send = %d, %v", k, err)
				}
				for {
					n, err := w.RecvWait(rmsgs, w.WakeSeq(), time.Time{})
					if err != nil {
						t.Fatalf("RecvWait: %v", err)
					}
					if n > 0 {
						if n != 1 || psnOf(rmsgs[0].Buf) != 7 {
							t.Fatalf("RecvWait = %d packets, PSN %d", n, psnOf(rmsgs[0].Buf))
						}
						return
					}
				}
			}
			round()
			if !raceEnabled {
				if allocs := testing.AllocsPerRun(50, round); allocs != 0 {
					t.Errorf("%v allocations per round", allocs)
				}
			}
			// A Wake nobody waited for: Recv ignores it and waits for the
			// packet.
			w.Wake()
			go func() {
				time.Sleep(5 * time.Millisecond)
				send(9)
			}()
			if n, err := b.Recv(rmsgs); n != 1 || err != nil || psnOf(rmsgs[0].Buf) != 9 {
				t.Fatalf("Recv after a stray Wake = %d, %v", n, err)
			}
			// Close ends a wait.
			done := make(chan error, 1)
			go func() {
				_, err := w.RecvWait(rmsgs, w.WakeSeq(), time.Time{})
				done <- err
			}()
			time.Sleep(5 * time.Millisecond)
			b.Close()
			select {
			case err := <-done:
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("RecvWait after Close: %v, want net.ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close did not end RecvWait")
			}
		})
	}
}

// TestPollerNudge checks that reads which keep finding datagrams queued,
// never waiting, start a goroutine about once a millisecond
// (Stats.PollerNudges), so that the Go runtime goes on polling the network
// for other sockets while this one keeps its reader busy; and that reads
// which wait for each datagram, as a request-response loop does, start
// none.
func TestPollerNudge(t *testing.T) {
	a := listenAny(t, "127.0.0.1", Options{})
	b := listenAny(t, "127.0.0.2", Options{BatchSize: 1}) // one datagram per recvmmsg
	w := b.(Waker)
	timer := time.AfterFunc(20*time.Second, func() { b.Close() }) // never hang
	defer timer.Stop()
	send := func(psn uint32) {
		if k, err := a.Send([]Message{{Buf: rocePacket(128, psn), Peer: b.LocalAddr()}}); k != 1 || err != nil {
			t.Errorf("Send = %d, %v", k, err)
		}
	}
	msgs := make([]Message, 1)
	recv := func() {
		t.Helper()
		for {
			n, err := w.RecvWait(msgs, w.WakeSeq(), time.Time{})
			if err != nil {
				t.Fatalf("RecvWait: %v", err)
			}
			if n == 1 {
				return
			}
		}
	}

	// Each datagram comes 10 ms after the read began to wait for it.
	for i := range 5 {
		sent := time.AfterFunc(10*time.Millisecond, func() { send(uint32(i)) })
		recv()
		sent.Stop()
	}
	if n := b.Stats().PollerNudges; n != 0 {
		t.Errorf("reads that waited for every datagram: %d nudges, want 0", n)
	}

	// 40 datagrams queued before reading, then read one per recvmmsg over
	// at least 40 * 500 us: no read waits.
	const queued = 40
	for i := range queued {
		send(uint32(100 + i))
	}
	time.Sleep(20 * time.Millisecond) // loopback delivers as it sends; this is for slack
	for range queued {
		recv()
		time.Sleep(500 * time.Microsecond)
	}
	st := b.Stats()
	if st.PollerNudges == 0 {
		t.Errorf("%d reads over %v, none waiting: no nudge", queued, time.Duration(queued)*500*time.Microsecond)
	}
	t.Logf("%d nudges", st.PollerNudges)
}
