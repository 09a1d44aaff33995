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
