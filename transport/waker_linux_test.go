package transport

import (
	"errors"
	"fmt"
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

// TestKickParked checks that reads which keep finding datagrams queued,
// never waiting, wake the parked reader of another socket that holds a
// datagram, which the Go runtime may leave parked meanwhile (kickEvery);
// and leave alone a parked reader whose socket is empty, and a socket
// with a datagram whose reader is not parked.
func TestKickParked(t *testing.T) {
	a := listenAny(t, "127.0.0.1", Options{})
	b := listenAny(t, "127.0.0.2", Options{})
	busy := listenAny(t, "127.0.0.3", Options{BatchSize: 1}) // one datagram per recvmmsg
	parked := b.(*udpConn)
	bw := busy.(Waker)
	timer := time.AfterFunc(20*time.Second, func() { busy.Close() }) // never hang
	defer timer.Stop()
	send := func(to Conn, psn uint32) {
		t.Helper()
		if k, err := a.Send([]Message{{Buf: rocePacket(128, psn), Peer: to.LocalAddr()}}); k != 1 || err != nil {
			t.Fatalf("Send = %d, %v", k, err)
		}
	}
	// keepBusy queues 16 datagrams on busy, then reads them one per
	// recvmmsg over more than 16 * 500 us: no read waits.
	msgs := make([]Message, 1)
	keepBusy := func() {
		t.Helper()
		for i := range 16 {
			send(busy, uint32(i))
		}
		time.Sleep(20 * time.Millisecond) // loopback delivers as it sends; slack
		for range 16 {
			for {
				n, err := bw.RecvWait(msgs, bw.WakeSeq(), time.Time{})
				if err != nil {
					t.Fatalf("RecvWait: %v", err)
				}
				if n == 1 {
					break
				}
			}
			time.Sleep(500 * time.Microsecond)
		}
	}

	// b's reader "parked" (as its read sets it before waiting), b empty.
	parked.r.parked.Store(true)
	keepBusy()
	if w := b.(Waker).WakeSeq(); w != 0 {
		t.Errorf("parked reader, empty socket: %d wakes; want none", w)
	}
	// A datagram waits on b: the busy reads wake its reader.
	send(b, 100)
	time.Sleep(5 * time.Millisecond)
	keepBusy()
	kicks := busy.Stats().ParkedKicks
	if kicks == 0 || b.(Waker).WakeSeq() == 0 {
		t.Errorf("parked reader, datagram queued: %d kicks, %d wakes; want some", kicks, b.(Waker).WakeSeq())
	}
	// The same datagram, but b's reader is not parked (it reads, or will).
	parked.r.parked.Store(false)
	seq := b.(Waker).WakeSeq()
	keepBusy()
	if w := b.(Waker).WakeSeq(); w != seq {
		t.Errorf("reader not parked: %d more wakes; want none", w-seq)
	}
	// A busy poller of b whose TryRecv finds nothing spins: it is not
	// parked, and the busy reads leave it alone.
	for {
		n, err := parked.TryRecv(msgs)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	if parked.r.parked.Load() {
		t.Fatal("a TryRecv that found nothing marked its Conn's reader parked")
	}
	send(b, 101)
	time.Sleep(5 * time.Millisecond)
	seq = b.(Waker).WakeSeq()
	keepBusy()
	if w := b.(Waker).WakeSeq(); w != seq {
		t.Errorf("busy poller between TryRecvs: %d wakes; want none", w-seq)
	}
}

// TestDeadlineLeftByWake: a Wake racing with a reader's clearing of an
// earlier one can leave the read deadline in the past with dlSet false
// (Wake's store of true lands before the clear's store of false, its
// deadline after the clear's). A blocking Recv, and a WaitReadable, that
// then meet it must still clear it and take in what is queued, not meet
// it again and again (seen in reliability's TestRKeyFlood under load:
// a reader spinning for 10 s beside a queued datagram). Both wait paths.
func TestDeadlineLeftByWake(t *testing.T) {
	forEachWaitPath(t, func(t *testing.T) {
		a := listenAny(t, "127.0.0.1", Options{})
		c := listenAny(t, "127.0.0.2", Options{}).(*udpConn)
		leave := func() { // the state the race leaves
			c.Wake()
			c.dlSet.Store(false)
		}
		send := func(psn uint32) {
			t.Helper()
			if n, err := a.Send([]Message{{Buf: rocePacket(128, psn), Peer: c.LocalAddr()}}); n != 1 || err != nil {
				t.Fatalf("Send = %d, %v", n, err)
			}
		}
		within := func(what string, f func() error) {
			t.Helper()
			done := make(chan error, 1)
			go func() { done <- f() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
			case <-time.After(5 * time.Second):
				c.Close()
				<-done
				t.Fatalf("%s: still waiting after 5 s with a datagram queued", what)
			}
		}
		msgs := make([]Message, 8)
		leave()
		send(1)
		within("Recv", func() error {
			n, err := c.Recv(msgs)
			if err == nil && (n != 1 || psnOf(msgs[0].Buf) != 1) {
				err = fmt.Errorf("read %d datagrams, the first with PSN %d", n, psnOf(msgs[0].Buf))
			}
			return err
		})
		leave()
		send(2)
		within("WaitReadable", c.WaitReadable)
		if n, err := c.TryRecv(msgs); n != 1 || err != nil || psnOf(msgs[0].Buf) != 2 {
			t.Fatalf("TryRecv after WaitReadable = %d, %v", n, err)
		}
	})
}
