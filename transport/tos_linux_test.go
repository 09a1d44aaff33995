package transport

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestTOSAdopted sends datagrams one at a time with a TOS other than the
// Conn's default: each arrives with its TOS, the first tosAdopt with a
// control message, after which the socket itself takes that TOS (its
// IP_TOS reads it back); a datagram wanting the default (TOS 0) or a
// third TOS then still arrives with its own, and the counters agree.
func TestTOSAdopted(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "::1"} {
		t.Run(addr, func(t *testing.T) {
			const def, data, other = 0x20, 0x02, 0x03
			a := listenAny(t, addr, Options{TOS: def})
			b := listenAny(t, addr, Options{})
			u := a.(*udpConn)
			want := []uint8{}
			send := func(tos, wantTOS uint8) {
				psn := uint32(len(want))
				if n, err := a.Send([]Message{{Buf: rocePacket(64, psn), Peer: b.LocalAddr(), TOS: tos}}); n != 1 {
					t.Fatalf("Send: %v", err)
				}
				want = append(want, wantTOS)
			}
			for range tosAdopt + 1 {
				send(data, data)
			}
			if got := sockTOS(t, u); got != data || u.s.sockTOS != data {
				t.Fatalf("after %d datagrams with TOS %#x the socket's TOS is %#x (recorded %#x)", tosAdopt+1, data, got, u.s.sockTOS)
			}
			send(data, data)
			send(0, def)
			send(other, other)
			send(data, data)
			got := recvN(t, b, len(want), 5*time.Second)
			for _, m := range got {
				if p := psnOf(m.Buf); m.TOS != want[p] {
					t.Errorf("datagram %d arrived with TOS %#x, want %#x", p, m.TOS, want[p])
				}
			}
			if s := b.Stats(); s.RecvPackets != uint64(len(want)) || s.Dropped() != 0 {
				t.Errorf("receiver's stats %+v", s)
			}
		})
	}
}

// sockTOS reads the socket's IP_TOS (IPV6_TCLASS).
func sockTOS(t *testing.T, c *udpConn) uint8 {
	t.Helper()
	var v int
	var err error
	if cerr := c.rc.Control(func(fd uintptr) {
		if c.ep.v6 {
			v, err = unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_TCLASS)
		} else {
			v, err = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TOS)
		}
	}); cerr != nil || err != nil {
		t.Fatal(cerr, err)
	}
	return uint8(v)
}

// TestTryRecvAfterEmpty checks the poller's read sizes: a TryRecv right
// after one that found nothing reads one datagram (a poller's next one
// most often comes alone), and the one after it reads all the rest.
func TestTryRecvAfterEmpty(t *testing.T) {
	a := listenAny(t, "127.0.0.1", Options{NoGSO: true})
	b := listenAny(t, "127.0.0.2", Options{NoGRO: true})
	p := b.(Poller)
	rmsgs := make([]Message, 8)
	if n, err := p.TryRecv(rmsgs); n != 0 || err != nil {
		t.Fatalf("TryRecv on an empty socket = %d, %v", n, err)
	}
	msgs := []Message{{Buf: rocePacket(64, 1), Peer: b.LocalAddr()}, {Buf: rocePacket(64, 2), Peer: b.LocalAddr()}, {Buf: rocePacket(64, 3), Peer: b.LocalAddr()}}
	if k, err := a.Send(msgs); k != len(msgs) {
		t.Fatalf("Send = %d, %v", k, err)
	}
	if err := p.WaitReadable(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // all three queued (loopback delivers within the send)
	calls := b.Stats().RecvCalls
	if n, err := p.TryRecv(rmsgs); n != 1 || err != nil || psnOf(rmsgs[0].Buf) != 1 {
		t.Fatalf("first TryRecv after an empty one = %d, %v, want the first datagram alone", n, err)
	}
	if n, err := p.TryRecv(rmsgs); n != 2 || err != nil || psnOf(rmsgs[0].Buf) != 2 || psnOf(rmsgs[1].Buf) != 3 {
		t.Fatalf("second TryRecv = %d, %v, want the other two", n, err)
	}
	if c := b.Stats().RecvCalls - calls; c != 2 {
		t.Errorf("%d recvmmsg calls for the two reads", c)
	}
}
