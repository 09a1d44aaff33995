package transport

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// readable polls fd without waiting and reports whether it is readable.
func readable(t *testing.T, fd int) bool {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	if err != nil {
		t.Fatalf("poll: %v", err)
	}
	return n == 1 && fds[0].Revents&unix.POLLIN != 0
}

// waitParked waits until c's reader has found its socket empty and is
// about to wait (or waits), so that what is sent next wakes it.
func waitParked(t *testing.T, c *udpConn) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !c.r.parked.Load(); {
		if time.Now().After(end) {
			t.Fatal("the reader never waited")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(5 * time.Millisecond) // from the empty read to the wait
}

// TestArmedOnlyWhileWaiting: the epoll instance the runtime watches in a
// socket's place signals only while the socket is armed: not before the
// first wait, still after a wait that took one datagram (a request and its
// reply make no epoll call), and no longer once the reader keeps finding
// work, though datagrams are queued and more arrive. Every wait is made
// in the runtime's poller, as a stream's are.
func TestArmedOnlyWhileWaiting(t *testing.T) {
	forceWaits(t, waitRuntime)
	a := listenAny(t, "127.0.0.1", Options{})
	c := listenAny(t, "127.0.0.2", Options{BatchSize: 1}).(*udpConn) // one datagram per recvmmsg
	timer := time.AfterFunc(20*time.Second, func() { c.Close() })    // never hang
	defer timer.Stop()
	p := c.rp
	efd := int(p.efd)
	send := func(k int) {
		t.Helper()
		for i := range k {
			if n, err := a.Send([]Message{{Buf: rocePacket(128, uint32(i)), Peer: c.LocalAddr()}}); n != 1 || err != nil {
				t.Fatalf("Send = %d, %v", n, err)
			}
		}
		time.Sleep(10 * time.Millisecond) // loopback delivers as it sends; slack
	}
	msgs := make([]Message, 4)
	recv := func() {
		t.Helper()
		if n, err := c.Recv(msgs); n != 1 || err != nil {
			t.Fatalf("Recv = %d, %v", n, err)
		}
	}
	// Never waited: a queued datagram does not make the instance readable.
	send(1)
	if !readable(t, int(p.fd)) || readable(t, efd) {
		t.Fatalf("before any wait: socket readable %v, instance readable %v; want true, false", readable(t, int(p.fd)), readable(t, efd))
	}
	recv()
	// A reader parks (the socket is armed) and a datagram wakes it.
	done := make(chan struct{})
	go func() { defer close(done); recv() }()
	waitParked(t, c)
	send(1)
	<-done
	if !p.armed {
		t.Fatal("after a wait that took one datagram: disarmed; want it left armed")
	}
	// Armed, with nobody waiting: arrivals make the instance readable.
	send(3)
	if !readable(t, efd) {
		t.Fatal("armed, 3 datagrams queued: instance not readable")
	}
	// Two reads in a row find work: the reader is busy, the socket is
	// disarmed, and neither the datagram left nor new ones signal.
	recv()
	recv()
	if p.armed {
		t.Fatal("after two reads that found work: still armed")
	}
	send(2)
	if !readable(t, int(p.fd)) || readable(t, efd) {
		t.Fatalf("busy reader, 3 datagrams queued: socket readable %v, instance readable %v; want true, false", readable(t, int(p.fd)), readable(t, efd))
	}
	for range 3 {
		recv()
	}
	// The next wait arms the socket again and is woken.
	done = make(chan struct{})
	go func() { defer close(done); recv() }()
	waitParked(t, c)
	send(1)
	<-done
}

// TestArmedBurstsNeverStall: bursts of 1-8 datagrams, sent one per
// system call, each answered once the receiver, reading one datagram per
// recvmmsg, has taken all of it.
// Each side's waits go from armed to busy and back thousands of times; a
// wake-up lost between a read that found nothing and the arm that
// follows would leave a side waiting for good, and the test times out.
func TestArmedBurstsNeverStall(t *testing.T) {
	for _, path := range []struct {
		name string
		path int
	}{{"chosen", waitAuto}, {"runtime", waitRuntime}, {"direct", waitDirect}} {
		t.Run(path.name, func(t *testing.T) {
			forceWaits(t, path.path)
			burstsNeverStall(t)
		})
	}
}

func burstsNeverStall(t *testing.T) {
	a := listenAny(t, "127.0.0.1", Options{})
	b := listenAny(t, "127.0.0.2", Options{BatchSize: 1})
	bursts := 1000
	if testing.Short() || raceEnabled {
		bursts = 200
	}
	fail := make(chan string, 2)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // b: take each burst whole, then answer
		defer wg.Done()
		msgs := make([]Message, 1)
		for k := range bursts {
			for got := 0; got < 1+k%8; {
				n, err := b.Recv(msgs)
				if err != nil {
					fail <- "b: Recv: " + err.Error()
					return
				}
				got += n
			}
			if n, err := b.Send([]Message{{Buf: rocePacket(64, uint32(k)), Peer: a.LocalAddr()}}); n != 1 || err != nil {
				fail <- "b: Send failed"
				return
			}
		}
	}()
	msgs := make([]Message, 1)
	burst := make([]Message, 8)
	for i := range burst {
		burst[i] = Message{Buf: rocePacket(128, uint32(i)), Peer: b.LocalAddr()}
	}
	for k := range bursts {
		timer := time.AfterFunc(5*time.Second, func() { a.Close(); b.Close() })
		// One sendmmsg per datagram: b, reading as fast, finds its
		// socket empty between them and arms it as the next arrives.
		for i := range 1 + k%8 {
			if n, err := a.Send(burst[i : i+1]); n != 1 || err != nil {
				t.Fatalf("burst %d: Send = %d, %v", k, n, err)
			}
		}
		n, err := a.Recv(msgs)
		timer.Stop()
		if err != nil || n != 1 {
			wg.Wait()
			select {
			case s := <-fail:
				t.Fatalf("burst %d: a.Recv = %d, %v; %s", k, n, err, s)
			default:
			}
			t.Fatalf("burst %d: a.Recv = %d, %v (a side stalled for 5 s)", k, n, err)
		}
	}
	wg.Wait()
}

// TestArmRacesArrival: a datagram that arrives after a try found the
// socket empty and before the arm wakes the waiter. The arm sees it, and
// the epoll instance signals it only if the socket is not left on the
// instance's ready list from an earlier wake, which disarm must clear.
func TestArmRacesArrival(t *testing.T) {
	forceWaits(t, waitRuntime)
	a := listenAny(t, "127.0.0.1", Options{})
	c := listenAny(t, "127.0.0.2", Options{BatchSize: 1}).(*udpConn)
	send := func() {
		t.Helper()
		if n, err := a.Send([]Message{{Buf: rocePacket(128, 1), Peer: c.LocalAddr()}}); n != 1 || err != nil {
			t.Errorf("Send = %d, %v", n, err)
		}
	}
	msgs := make([]Message, 1)
	recv := func() <-chan error { return recvOne(c, msgs) }
	// A wait woken by an arrival (the socket joins the instance's ready
	// list), then reads that find work until the reader counts as busy
	// and disarms.
	done := recv()
	waitParked(t, c)
	for range 3 {
		send()
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-recv(); err != nil {
			t.Fatal(err)
		}
	}
	if c.rp.armed {
		t.Fatal("still armed after three reads that found work")
	}
	// The next wait finds nothing; a datagram arrives before its arm.
	armHook = func() {
		armHook = nil
		send()
		time.Sleep(10 * time.Millisecond)
	}
	defer func() { armHook = nil }()
	select {
	case err := <-recv():
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		c.Close()
		t.Fatal("a datagram that arrived just before the arm did not wake the waiter in 3 s")
	}
}

// recvOne receives on c in a goroutine of its own and reports, on the
// channel it returns, whether that took exactly one datagram.
func recvOne(c Conn, msgs []Message) <-chan error {
	done := make(chan error, 1)
	go func() {
		n, err := c.Recv(msgs)
		if err == nil && n != 1 {
			err = errors.New("no datagram")
		}
		done <- err
	}()
	return done
}

// forEachWaitPath runs f as a subtest with every wait forced into the
// kernel ("direct"), then into the runtime's poller ("runtime").
func forEachWaitPath(t *testing.T, f func(t *testing.T)) {
	for _, p := range []struct {
		name string
		path int
	}{{"direct", waitDirect}, {"runtime", waitRuntime}} {
		t.Run(p.name, func(t *testing.T) {
			forceWaits(t, p.path)
			f(t)
		})
	}
}

// forceWaits makes every receive wait of the test take path (waitAuto:
// as the traffic says).
func forceWaits(t *testing.T, path int) {
	waitPath = path
	t.Cleanup(func() { waitPath = waitAuto })
}

// TestRoundTripsWaitDirect: waits that follow a round trip's few packets
// are made in the kernel on the direct instance (the socket left
// disarmed in the one the runtime watches, so its thread is not woken
// too); once modeSwitch waits in a row have followed a stream's many,
// waits park in the runtime's poller, the socket armed, until modeSwitch
// in a row follow few again.
func TestRoundTripsWaitDirect(t *testing.T) {
	a := listenAny(t, "127.0.0.1", Options{})
	c := listenAny(t, "127.0.0.2", Options{}).(*udpConn)
	timer := time.AfterFunc(20*time.Second, func() { c.Close() }) // never hang
	defer timer.Stop()
	send := func(k int) {
		t.Helper()
		for i := range k {
			if n, err := a.Send([]Message{{Buf: rocePacket(128, uint32(i)), Peer: c.LocalAddr()}}); n != 1 || err != nil {
				t.Fatalf("Send = %d, %v", n, err)
			}
		}
	}
	msgs := make([]Message, 64)
	// wait starts a Recv, checks where it waits, then ends it with a
	// datagram and reads what it was sent.
	wait := func(direct bool, what string) {
		t.Helper()
		done := make(chan int, 1)
		go func() {
			n, err := c.Recv(msgs)
			if err != nil {
				n = -1
			}
			done <- n
		}()
		waitParked(t, c)
		if got := c.rp.dw.sleeping.Load(); got != direct {
			t.Errorf("%s: waits in the kernel %v, want %v", what, got, direct)
		}
		send(1)
		if n := <-done; n != 1 {
			t.Fatalf("%s: Recv = %d datagrams", what, n)
		}
		// A wait in the runtime's poller that took one datagram leaves
		// the socket armed there; a direct one leaves it disarmed.
		if c.rp.armed == direct {
			t.Errorf("%s: socket armed in the runtime's instance %v, want %v", what, c.rp.armed, !direct)
		}
	}
	stream := func() {
		t.Helper()
		send(roundTripPackets + 8)
		time.Sleep(10 * time.Millisecond)
		for got := 0; got < roundTripPackets+8; {
			n, err := c.Recv(msgs)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
	wait(true, "first wait")
	wait(true, "after one datagram")
	for i := range modeSwitch {
		stream()
		wait(i < modeSwitch-1, fmt.Sprintf("after stream burst %d", i+1))
	}
	for i := range modeSwitch {
		wait(i == modeSwitch-1, fmt.Sprintf("after one datagram, %d since the bursts", i+1))
	}
}

// TestDirectWaitRacesArrival: a datagram that arrives after a try found
// the socket empty and just before a direct wait sleeps still wakes it
// (the socket is in the direct instance for good).
func TestDirectWaitRacesArrival(t *testing.T) {
	forceWaits(t, waitDirect)
	a := listenAny(t, "127.0.0.1", Options{})
	c := listenAny(t, "127.0.0.2", Options{BatchSize: 1}).(*udpConn)
	msgs := make([]Message, 1)
	for i := range 3 {
		sleepHook = func() {
			sleepHook = nil
			if n, err := a.Send([]Message{{Buf: rocePacket(128, 1), Peer: c.LocalAddr()}}); n != 1 || err != nil {
				t.Errorf("Send = %d, %v", n, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		select {
		case err := <-recvOne(c, msgs):
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(3 * time.Second):
			c.Close()
			t.Fatalf("wait %d: a datagram that arrived just before the sleep did not wake the waiter in 3 s", i)
		}
	}
	sleepHook = nil
}

// TestRoundTripWaitSleepsFirst: once a round trip's wait has slept in the
// kernel, the next sleeps before its first look, and a datagram already
// queued then ends that sleep at once (the direct instance is
// level-triggered), as does a time limit that passes before it sleeps;
// once more than a round trip's packets have moved since a reader last
// came to wait, the first look comes first again.
func TestRoundTripWaitSleepsFirst(t *testing.T) {
	a := listenAny(t, "127.0.0.1", Options{})
	c := listenAny(t, "127.0.0.2", Options{}).(*udpConn)
	timer := time.AfterFunc(20*time.Second, func() { c.Close() }) // never hang
	defer timer.Stop()
	t.Cleanup(func() { sleepHook = nil })
	var fd int
	if err := c.rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	queued := func() bool {
		return pollNow([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}) == 1
	}
	send := func() {
		t.Helper()
		if n, err := a.Send([]Message{{Buf: rocePacket(128, 1), Peer: c.LocalAddr()}}); n != 1 || err != nil {
			t.Fatalf("Send = %d, %v", n, err)
		}
		for i := 0; !queued(); i++ {
			if i == 1000 {
				t.Fatal("a datagram sent on loopback not queued after 1 s")
			}
			time.Sleep(time.Millisecond)
		}
	}
	msgs := make([]Message, 64)
	recv := func(what string) {
		t.Helper()
		if n, err := c.Recv(msgs); n != 1 || err != nil {
			t.Fatalf("%s: Recv = %d, %v", what, n, err)
		}
	}
	// The first wait looks, finds nothing and sleeps until the datagram
	// sent as it sleeps.
	sleeps, queuedAtSleep, late := 0, false, make(chan struct{})
	sleepHook = func() {
		sleeps++
		queuedAtSleep = queued()
		if late != nil {
			go func(done chan struct{}) {
				defer close(done)
				time.Sleep(20 * time.Millisecond)
				if n, err := a.Send([]Message{{Buf: rocePacket(128, 1), Peer: c.LocalAddr()}}); n != 1 || err != nil {
					t.Errorf("Send = %d, %v", n, err)
				}
			}(late)
			late = nil
		}
	}
	done := late
	recv("first wait")
	<-done
	if sleeps != 1 || queuedAtSleep {
		t.Fatalf("first wait: slept %d times, socket queued as it slept %v; want once, with nothing queued", sleeps, queuedAtSleep)
	}
	// The next sleeps at once, though a datagram is queued, and takes it.
	send()
	sleeps = 0
	recv("queued before the wait")
	if sleeps != 1 || !queuedAtSleep {
		t.Fatalf("queued before the wait: slept %d times, socket queued as it slept %v; want once, queued", sleeps, queuedAtSleep)
	}
	// A time limit that passes before that first sleep: the wait still
	// looks once, as one that looked first would have, and takes the
	// datagram queued.
	send()
	counting := sleepHook
	sleepHook = func() { time.Sleep(30 * time.Millisecond) }
	if n, err := c.RecvWait(msgs, c.WakeSeq(), time.Now().Add(10*time.Millisecond)); n != 1 || err != nil {
		t.Fatalf("a limit passed before the first sleep, a datagram queued: RecvWait = %d, %v; want the datagram", n, err)
	}
	sleepHook = counting
	// Bursts of more than roundTripPackets datagrams, each read at once:
	// a datagram queued before the next wait is found by the first look,
	// with no sleep.
	for range modeSwitch + 1 {
		for range roundTripPackets + 1 {
			send()
		}
		for got := 0; got < roundTripPackets+1; {
			n, err := c.Recv(msgs)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
	send()
	sleeps = 0
	recv("after a stream")
	if sleeps != 0 {
		t.Fatalf("after a stream: a datagram queued before the wait slept %d times first, want none", sleeps)
	}
}

// TestWaitEndsEarly, on both paths: a Wake ends a RecvWait that waits
// with no limit, a limit ends one, and Close ends a Recv with
// net.ErrClosed; the kick that ended a wait does not end the next with
// nothing to say.
func TestWaitEndsEarly(t *testing.T) {
	for _, path := range []struct {
		name string
		path int
	}{{"runtime", waitRuntime}, {"direct", waitDirect}} {
		t.Run(path.name, func(t *testing.T) {
			forceWaits(t, path.path)
			c := listenAny(t, "127.0.0.2", Options{}).(*udpConn)
			msgs := make([]Message, 1)
			start := func(f func() (int, error)) <-chan error {
				done := make(chan error, 1)
				go func() {
					n, err := f()
					if err == nil && n != 0 {
						err = errors.New("a datagram came from nowhere")
					}
					done <- err
				}()
				return done
			}
			wait := func(what string, done <-chan error, want error) {
				t.Helper()
				select {
				case err := <-done:
					if !errors.Is(err, want) {
						t.Fatalf("%s: %v, want %v", what, err, want)
					}
				case <-time.After(5 * time.Second):
					c.Close()
					t.Fatalf("%s: still waiting after 5 s", what)
				}
			}
			for range 3 {
				seq := c.WakeSeq()
				done := start(func() (int, error) { return c.RecvWait(msgs, seq, time.Time{}) })
				waitParked(t, c)
				if path.path == waitDirect && !c.rp.dw.sleeping.Load() {
					t.Fatal("a forced direct wait does not wait in the kernel")
				}
				c.Wake()
				wait("RecvWait woken", done, nil)
			}
			begin := time.Now()
			for range 100 {
				if n, err := c.RecvWait(msgs, c.WakeSeq(), time.Now().Add(100*time.Microsecond)); n != 0 || err != nil {
					t.Fatalf("RecvWait with a limit = %d, %v", n, err)
				}
			}
			if d := time.Since(begin); d < 10*time.Millisecond {
				t.Fatalf("100 RecvWaits of 100 µs took %v: the limit did not make them wait", d)
			}
			done := start(func() (int, error) { return c.Recv(msgs) })
			waitParked(t, c)
			c.Close()
			wait("Recv at Close", done, net.ErrClosed)
		})
	}
}

// TestSendOnlyConnRefusesReads: a source-port Conn has no wait for reads;
// reading it returns an error that says so instead of failing inside.
func TestSendOnlyConnRefusesReads(t *testing.T) {
	local, scope, opts, err := resolve(netip.MustParseAddrPort("127.0.0.1:0"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	// A port of its own: 0 resolves to 4791, which another test may hold.
	local = netip.AddrPortFrom(local.Addr(), 0)
	c, err := listenUDP(local, scope, opts, sockSend)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n, err := c.Recv(make([]Message, 1)); n != 0 || !errors.Is(err, errSendOnly) {
		t.Errorf("Recv = %d, %v; want 0, %v", n, err, errSendOnly)
	}
	if err := c.WaitReadable(); !errors.Is(err, errSendOnly) {
		t.Errorf("WaitReadable = %v; want %v", err, errSendOnly)
	}
}

// TestWaitReadableBesideRecv: a WaitReadable (which does not hold the
// receive lock) and a blocking Recv wait on the same socket at once,
// over and over, each on both wait paths: every datagram is read once,
// both end, and (under the race detector) what one wait leaves for its
// caller is not read by the other's.
func TestWaitReadableBesideRecv(t *testing.T) {
	forEachWaitPath(t, func(t *testing.T) {
		a := listenAny(t, "127.0.0.1", Options{})
		c := listenAny(t, "127.0.0.2", Options{}).(*udpConn)
		timer := time.AfterFunc(20*time.Second, func() { c.Close() }) // never hang
		defer timer.Stop()
		const total = 300
		var stop atomic.Bool
		watched := make(chan error, 1)
		go func() { // waits, reads nothing
			for !stop.Load() {
				if err := c.WaitReadable(); err != nil {
					watched <- err
					return
				}
				time.Sleep(50 * time.Microsecond) // let the reader take it
			}
			watched <- nil
		}()
		read := make(chan error, 1)
		go func() {
			msgs := make([]Message, 8)
			for got := 0; got < total; {
				n, err := c.Recv(msgs)
				if err != nil {
					read <- fmt.Errorf("after %d datagrams: %w", got, err)
					return
				}
				for _, m := range msgs[:n] {
					if psnOf(m.Buf) != uint32(got) {
						read <- fmt.Errorf("datagram %d has PSN %d", got, psnOf(m.Buf))
						return
					}
					got++
				}
			}
			read <- nil
		}()
		for i := range total {
			if n, err := a.Send([]Message{{Buf: rocePacket(128, uint32(i)), Peer: c.LocalAddr()}}); n != 1 || err != nil {
				t.Fatalf("Send = %d, %v", n, err)
			}
			time.Sleep(100 * time.Microsecond) // both wait again
		}
		if err := <-read; err != nil {
			t.Fatal(err)
		}
		stop.Store(true)
		// The watcher may be waiting on an empty socket: one more
		// datagram ends its wait.
		if _, err := a.Send([]Message{{Buf: rocePacket(128, total), Peer: c.LocalAddr()}}); err != nil {
			t.Fatal(err)
		}
		if err := <-watched; err != nil {
			t.Fatalf("WaitReadable: %v", err)
		}
	})
}

// watches reports whether epoll instance efd holds descriptor fd, from
// /proc/self/fdinfo (a "tfd:" line for each descriptor it watches).
func watches(t *testing.T, efd uintptr, fd int32) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", efd))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "tfd:" && f[1] == strconv.Itoa(int(fd)) {
			return true
		}
	}
	return false
}

// inWaitQueues reports which of c's three wait instances hold its
// sockets: the receive wait's, the direct wait's, the send wait's.
func inWaitQueues(t *testing.T, c *udpConn) [3]bool {
	t.Helper()
	return [3]bool{watches(t, c.rp.efd, c.rp.fd), watches(t, c.rp.dw.efd, c.rp.fd), watches(t, c.wp.efd, c.wp.fd)}
}

// TestQuiet: Quiet takes a Conn's sockets out of all three of its wait
// instances; datagrams still arrive and TryRecv and a Recv that need not
// block read them without putting the sockets back; a receive that must
// block (Recv, WaitReadable) puts the receiving socket back first and is
// woken, by a datagram sent while it waits and by one that arrived
// between its empty read and its return to the instances; a Quiet while a
// reader waits changes nothing.
func TestQuiet(t *testing.T) {
	for _, how := range []string{"Recv", "WaitReadable"} {
		t.Run(how, func(t *testing.T) {
			forEachWaitPath(t, func(t *testing.T) {
				a := listenAny(t, "127.0.0.1", Options{})
				c := listenAny(t, "127.0.0.2", Options{}).(*udpConn)
				timer := time.AfterFunc(20*time.Second, func() { c.Close() }) // never hang
				defer timer.Stop()
				psn := uint32(0)
				send := func() {
					t.Helper()
					if n, err := a.Send([]Message{{Buf: rocePacket(128, psn), Peer: c.LocalAddr()}}); n != 1 || err != nil {
						t.Fatalf("Send = %d, %v", n, err)
					}
					psn++
				}
				msgs := make([]Message, 4)
				got := uint32(0)
				take := func(n int, err error) {
					t.Helper()
					if n != 1 || err != nil {
						t.Fatalf("receive = %d, %v; want the datagram with PSN %d", n, err, got)
					}
					if p := psnOf(msgs[0].Buf); p != got {
						t.Fatalf("datagram has PSN %d, want %d", p, got)
					}
					got++
				}
				// blocking waits as how says, then reads what woke it.
				blocking := func() (int, error) {
					if how == "WaitReadable" {
						if err := c.WaitReadable(); err != nil {
							return 0, err
						}
						return c.TryRecv(msgs)
					}
					return c.Recv(msgs)
				}
				if q := inWaitQueues(t, c); q != [3]bool{true, true, true} {
					t.Fatalf("new Conn: sockets in the wait instances %v, want all", q)
				}
				c.Quiet()
				if q := inWaitQueues(t, c); q != [3]bool{} {
					t.Fatalf("after Quiet: sockets in the wait instances %v, want none", q)
				}
				c.Quiet() // already out: nothing to do
				if s := c.Stats(); s.Quiets != 1 || s.Rejoins != 0 {
					t.Fatalf("Quiets, Rejoins = %d, %d; want 1, 0", s.Quiets, s.Rejoins)
				}
				// Spinning reads and a wait that need not block.
				send()
				for end := time.Now().Add(5 * time.Second); ; {
					n, err := c.TryRecv(msgs)
					if n > 0 || err != nil {
						take(n, err)
						break
					}
					if time.Now().After(end) {
						t.Fatal("TryRecv never read the datagram sent to a quiet socket")
					}
				}
				send()
				take(blocking())
				if s := c.Stats(); s.Rejoins != 0 || inWaitQueues(t, c) != [3]bool{} {
					t.Fatalf("after reads that did not block: Rejoins %d, in wait instances %v; want 0, none", s.Rejoins, inWaitQueues(t, c))
				}
				// A wait that blocks: the socket rejoins, and a datagram
				// sent meanwhile ends the wait.
				type result struct {
					n   int
					err error
				}
				done := make(chan result, 1)
				go func() { n, err := blocking(); done <- result{n, err} }()
				waitParked(t, c)
				if s := c.Stats(); s.Rejoins != 1 {
					t.Fatalf("a blocked wait: Rejoins %d, want 1", s.Rejoins)
				}
				if q := inWaitQueues(t, c); !q[0] || !q[1] {
					t.Fatalf("a blocked wait: receiving socket in the receive and direct instances %v, want both", q[:2])
				}
				// A Quiet now leaves the waiting socket where it is.
				c.Quiet()
				if q := inWaitQueues(t, c); !q[0] || !q[1] || c.Stats().Quiets != 1 {
					t.Fatalf("Quiet beside a blocked wait: in the instances %v, Quiets %d; want in both, 1", q[:2], c.Stats().Quiets)
				}
				send()
				r := <-done
				take(r.n, r.err)
				// A datagram that arrives between the empty read and the
				// rejoin ends the wait too.
				c.Quiet()
				rejoinHook = func() { rejoinHook = nil; send() }
				defer func() { rejoinHook = nil }()
				n, err := blocking()
				take(n, err)
				if rejoinHook != nil {
					t.Fatal("the wait never rejoined")
				}
			})
		})
	}
}

// TestQuietBesideRoundTrips: two Conns ping-pong 5,000 datagrams with
// blocking receives while a third goroutine keeps quieting both: every
// wait must put its socket back in time, or a side waits for good.
func TestQuietBesideRoundTrips(t *testing.T) {
	forEachWaitPath(t, func(t *testing.T) {
		a := listenAny(t, "127.0.0.1", Options{}).(*udpConn)
		c := listenAny(t, "127.0.0.2", Options{}).(*udpConn)
		timer := time.AfterFunc(30*time.Second, func() { a.Close(); c.Close() }) // never hang
		defer timer.Stop()
		const rounds = 5000
		var stop atomic.Bool
		quieted := make(chan struct{})
		go func() {
			defer close(quieted)
			for !stop.Load() {
				a.Quiet()
				c.Quiet()
				runtime.Gosched()
			}
		}()
		defer func() { stop.Store(true); <-quieted }()
		echoed := make(chan error, 1)
		go func() {
			msgs := make([]Message, 4)
			for range rounds {
				n, err := c.Recv(msgs)
				if n != 1 || err != nil {
					echoed <- fmt.Errorf("echo Recv = %d, %v", n, err)
					return
				}
				if _, err := c.Send([]Message{{Buf: rocePacket(128, psnOf(msgs[0].Buf)), Peer: a.LocalAddr()}}); err != nil {
					echoed <- err
					return
				}
			}
			echoed <- nil
		}()
		msgs := make([]Message, 4)
		for i := range uint32(rounds) {
			if _, err := a.Send([]Message{{Buf: rocePacket(128, i), Peer: c.LocalAddr()}}); err != nil {
				t.Fatal(err)
			}
			n, err := a.Recv(msgs)
			if n != 1 || err != nil {
				t.Fatalf("round trip %d: Recv = %d, %v", i, n, err)
			}
			if p := psnOf(msgs[0].Buf); p != i {
				t.Fatalf("round trip %d: answer has PSN %d", i, p)
			}
		}
		if err := <-echoed; err != nil {
			t.Fatal(err)
		}
		s := a.Stats()
		s.Add(c.Stats())
		if s.Quiets == 0 || s.Rejoins == 0 {
			t.Fatalf("Quiets %d, Rejoins %d: the sockets never left or rejoined the wait instances", s.Quiets, s.Rejoins)
		}
		t.Logf("Quiets %d, Rejoins %d", s.Quiets, s.Rejoins)
	})
}

// TestQuietSourcePorts: Quiet on a Conn with source ports takes every
// pool socket out of its send wait's instance as well, and packets for
// many QPs still leave from the pool and arrive.
func TestQuietSourcePorts(t *testing.T) {
	src := listenAny(t, "127.0.0.1", Options{SourcePorts: 4}).(*portsConn)
	dst := listenAny(t, "127.0.0.1", Options{})
	src.Quiet()
	for i, s := range append([]*udpConn{src.udpConn}, src.pool...) {
		if watches(t, s.wp.efd, s.wp.fd) {
			t.Fatalf("socket %d of the Conn still in its send wait's instance after Quiet", i)
		}
	}
	const qps = 16
	var msgs []Message
	for q := range qps {
		p := rocePacket(128, 0)
		p[5], p[6], p[7] = 0, 0, byte(q)
		msgs = append(msgs, Message{Buf: p, Peer: dst.LocalAddr()})
	}
	if n, err := src.Send(msgs); err != nil || n != qps {
		t.Fatalf("Send = %d, %v", n, err)
	}
	ports := map[uint16]bool{}
	for _, m := range recvN(t, dst, qps, 5*time.Second) {
		ports[m.Peer.Port()] = true
	}
	if len(ports) < 2 {
		t.Fatalf("%d QPs' packets came from %d source ports", qps, len(ports))
	}
}
