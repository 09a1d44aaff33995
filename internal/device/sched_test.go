package device

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// recorder is an Input that notes the PSNs it is handed.
type recorder struct {
	mu   sync.Mutex
	psns []uint32
}

func (r *recorder) take(pkts []qp.InPacket) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range pkts {
		r.psns = append(r.psns, uint32(p.Pkt.BTH().PSN()))
	}
	return false
}

func (r *recorder) InputWoke(pkts []qp.InPacket) bool   { return r.take(pkts) }
func (r *recorder) InputPolled(pkts []qp.InPacket) bool { return r.take(pkts) }
func (r *recorder) FlushAcks()                          {}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.psns)
}

// pair opens two Conns on loopback at random ports.
func pair(t *testing.T) (transport.Conn, transport.Conn) {
	t.Helper()
	var cs []transport.Conn
	for len(cs) < 2 {
		c, err := transport.Listen(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(20000+rand.IntN(40000))), transport.Options{})
		if errors.Is(err, syscall.EADDRINUSE) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs[0], cs[1]
}

// send sends n RC SEND Only packets with PSNs 0..n-1 from a to b.
func send(t *testing.T, a, b transport.Conn, n int) {
	t.Helper()
	var msgs []transport.Message
	for i := range n {
		buf := make([]byte, 64)
		h := bth.Header{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: 17, PSN: bth.PSN(i)}
		k, err := h.Encode(buf, make([]byte, 32))
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, transport.Message{Buf: buf[:k], Peer: b.LocalAddr()})
	}
	if k, err := a.Send(msgs); err != nil || k != n {
		t.Fatalf("Send = %d, %v", k, err)
	}
}

// TestRunTakesIn checks a running Receiver hands every packet, parsed, to
// its Input, and stops when its Conn closes.
func TestRunTakesIn(t *testing.T) {
	a, b := pair(t)
	in := &recorder{}
	stop := make(chan struct{})
	r := NewReceiver(ReceiverConfig{Conn: b, In: in, Local: b.LocalAddr().Addr(), Stop: stop})
	done := make(chan struct{})
	go func() { r.Run(); close(done) }()
	send(t, a, b, 10)
	for end := time.Now().Add(5 * time.Second); in.count() < 10; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d of 10 packets taken in", in.count())
		}
	}
	for i, psn := range in.psns {
		if psn != uint32(i) {
			t.Fatalf("packet %d has PSN %d", i, psn)
		}
	}
	close(stop)
	b.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	r.Close()
}

// TestSettle checks Settle takes in, on the caller's goroutine, what a
// Receiver's socket holds when no other goroutine reads it.
func TestSettle(t *testing.T) {
	a, b := pair(t)
	in := &recorder{}
	r := NewReceiver(ReceiverConfig{Conn: b, In: in, Local: b.LocalAddr().Addr(), Stop: make(chan struct{})})
	send(t, a, b, 5)
	time.Sleep(10 * time.Millisecond) // loopback delivers synchronously; leave room anyway
	r.Settle(time.Millisecond)
	if n := in.count(); n != 5 {
		t.Fatalf("Settle took in %d of 5 queued packets", n)
	}
}

// pathRecorder is a recorder that also counts the packets each path
// took in: the receive goroutine's (InputWoke) and a poller's
// (InputPolled).
type pathRecorder struct {
	recorder
	woke, polled int
}

func (r *pathRecorder) InputWoke(pkts []qp.InPacket) bool {
	r.mu.Lock()
	r.woke += len(pkts)
	r.mu.Unlock()
	return r.take(pkts)
}

func (r *pathRecorder) InputPolled(pkts []qp.InPacket) bool {
	r.mu.Lock()
	r.polled += len(pkts)
	r.mu.Unlock()
	return r.take(pkts)
}

func (r *pathRecorder) paths() (woke, polled int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.woke, r.polled
}

// TestBusyPollStandBack checks that, in busy-poll mode, the receive
// goroutine leaves the socket to an application that polls a CQ: every
// packet sent while the application polls is taken in by the poller, on
// the polling goroutine, and each once; once the application stops
// polling, the receive goroutine takes packets in again; and it returns
// when the device closes while an application polls.
func TestBusyPollStandBack(t *testing.T) {
	a, b := pair(t)
	in := &pathRecorder{}
	stop := make(chan struct{})
	const busy = 200 * time.Millisecond // long beside a poll, on a loaded machine too
	r := NewReceiver(ReceiverConfig{Conn: b, In: in, Local: b.LocalAddr().Addr(), BusyPoll: busy, Stop: stop})
	cq, err := qp.NewCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	Attach(cq, []*Receiver{r}, 0)
	// Poll before the receive goroutine starts, so that it finds an
	// application polling from its first look: started first, it could
	// see no poll yet, be descheduled (a loaded machine, the race
	// detector) and then take in the first packet sent below.
	wcs := make([]qp.WC, 1)
	for range 50 {
		cq.Poll(wcs)
	}
	done := make(chan struct{})
	go func() { r.Run(); close(done) }()

	// Poll for a while, sending a packet now and then: the poller takes
	// each one in, the receive goroutine none.
	const sent = 20
	psn := 0
	for end := time.Now().Add(2 * time.Second); psn < sent || in.count() < sent; {
		if time.Now().After(end) {
			t.Fatalf("%d of %d packets taken in while polling", in.count(), sent)
		}
		if psn < sent {
			sendFrom(t, a, b, psn)
			psn++
		}
		for range 50 {
			cq.Poll(wcs)
		}
	}
	if woke, polled := in.paths(); woke != 0 || polled != sent {
		t.Fatalf("while an application polled: receive goroutine took %d packets, poller %d; want 0 and %d", woke, polled, sent)
	}
	for i, p := range in.psns {
		if p != uint32(i) {
			t.Fatalf("packet %d has PSN %d (taken twice or lost)", i, p)
		}
	}
	// Standing back, the receive goroutine took the socket out of the
	// kernel's wait queues (transport.Quieter).
	for end := time.Now().Add(5 * time.Second); b.Stats().Quiets == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("while an application polled, the socket never left the wait queues")
		}
		cq.Poll(wcs)
	}

	// Stop polling: the receive goroutine takes the next packet in.
	sendFrom(t, a, b, sent)
	for end := time.Now().Add(5 * time.Second); in.count() < sent+1; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the receive goroutine did not take the socket back once polling stopped")
		}
	}
	if woke, _ := in.paths(); woke != 1 {
		t.Fatalf("after polling stopped the receive goroutine took %d packets, want 1", woke)
	}
	// Its wait for the next puts the socket back in the wait queues, and
	// a packet sent then wakes it.
	for end := time.Now().Add(5 * time.Second); b.Stats().Rejoins == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the receive goroutine's wait never put the socket back in the wait queues")
		}
	}
	sendFrom(t, a, b, sent+1)
	for end := time.Now().Add(5 * time.Second); in.count() < sent+2; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the receive goroutine, waiting, was not woken by a packet")
		}
	}

	// Poll again, and close the device meanwhile: Run returns, whether
	// it stood back or waited for the socket.
	polling := make(chan struct{})
	go func() {
		defer close(polling)
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
			select {
			case <-done:
				return
			default:
			}
			cq.Poll(make([]qp.WC, 1))
		}
	}()
	time.Sleep(busy / 2)
	close(stop) // as Device.Close does
	b.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the device stopped")
	}
	<-polling
}

// sendFrom sends one RC SEND Only packet with the given PSN from a to b.
func sendFrom(t *testing.T, a, b transport.Conn, psn int) {
	t.Helper()
	buf := make([]byte, 64)
	h := bth.Header{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: 17, PSN: bth.PSN(psn)}
	k, err := h.Encode(buf, make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := a.Send([]transport.Message{{Buf: buf[:k], Peer: b.LocalAddr()}}); err != nil || n != 1 {
		t.Fatalf("Send = %d, %v", n, err)
	}
}

// TestBusyPollShards checks that a busy-polling CQ on a device with
// several shards polls the sockets of the shards its QPs live on (home
// from the start, the others once marked), and takes in their packets.
func TestBusyPollShards(t *testing.T) {
	a, b0 := pair(t)
	_, b1 := pair(t)
	in := &pathRecorder{}
	rs := []*Receiver{
		NewReceiver(ReceiverConfig{Conn: b0, In: in, Local: b0.LocalAddr().Addr(), BusyPoll: time.Second, Stop: make(chan struct{})}),
		NewReceiver(ReceiverConfig{Conn: b1, In: in, Local: b1.LocalAddr().Addr(), BusyPoll: time.Second, Stop: make(chan struct{})}),
	}
	cq, err := qp.NewCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	use := Attach(cq, rs, 0)
	sendFrom(t, a, b1, 7)
	time.Sleep(10 * time.Millisecond) // loopback delivers synchronously; leave room anyway
	cq.Poll(make([]qp.WC, 1))
	if rs[0].lastPoll.Load() == 0 {
		t.Fatal("polling the CQ did not poll its home shard")
	}
	if rs[1].lastPoll.Load() != 0 || in.count() != 0 {
		t.Fatalf("polling the CQ polled a shard none of its QPs lives on (%d packets taken in)", in.count())
	}
	use(1) // a QP of the CQ on shard 1
	cq.Poll(make([]qp.WC, 1))
	if rs[1].lastPoll.Load() == 0 {
		t.Fatal("polling the CQ did not poll shard 1 once a QP of it lived there")
	}
	if _, polled := in.paths(); polled != 1 || in.psns[0] != 7 {
		t.Fatalf("shard 1's packet: %d taken in by the poller, PSNs %v", polled, in.psns)
	}
}
