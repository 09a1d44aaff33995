package transport

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego/icrc"
)

func pipePair(t testing.TB, n *PipeNetwork, a, b string) (Conn, Conn) {
	t.Helper()
	ca, err := n.Listen(netip.MustParseAddrPort(a), Options{})
	if err != nil {
		t.Fatal(err)
	}
	cb, err := n.Listen(netip.MustParseAddrPort(b), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ca.Close(); cb.Close() })
	return ca, cb
}

// TestPipe sends single packets and a Seg run between two pipe Conns and
// checks contents, IDs, TOS and ICRCs (which must match what a UDP socket
// would have put on the wire).
func TestPipe(t *testing.T) {
	for _, addrs := range [][2]string{{"10.0.0.1:4791", "10.0.0.2:4791"}, {"[fd00::1]:4791", "[fd00::2]:4791"}} {
		t.Run(addrs[0], func(t *testing.T) {
			n := NewPipeNetwork()
			a, b := pipePair(t, n, addrs[0], addrs[1])
			tap := &tapRec{}
			b.SetTap(tap)
			run := append(rocePacket(64, 10), rocePacket(64, 11)...)
			msgs := []Message{{Buf: rocePacket(100, 1), Peer: b.LocalAddr(), TOS: 2}, {Buf: run, Peer: b.LocalAddr(), Seg: 64}}
			if k, err := a.Send(msgs); k != 2 || err != nil {
				t.Fatal(k, err)
			}
			got := recvN(t, b, 3, time.Second)
			v4 := b.LocalAddr().Addr().Is4()
			for i, m := range got {
				wantID := uint16(0)
				if v4 && i == 2 {
					wantID = 1
				}
				if m.Peer != a.LocalAddr() || m.IPID != wantID || psnOf(m.Buf) != []uint32{1, 10, 11}[i] {
					t.Errorf("packet %d: %+v", i, m)
				}
				var crc uint32
				if v4 {
					v := icrc.V4{Src: a.LocalAddr().Addr().As4(), Dst: b.LocalAddr().Addr().As4(), SrcPort: 4791, DstPort: 4791, DF: true}
					crc = v.Sum(m.IPID, m.Buf)
				} else {
					v := icrc.V6{Src: a.LocalAddr().Addr().As16(), Dst: b.LocalAddr().Addr().As16(), SrcPort: 4791, DstPort: 4791}
					crc = v.Sum(m.Buf)
				}
				if crc != icrc.Get(m.Buf) {
					t.Errorf("packet %d: ICRC", i)
				}
			}
			if got[0].TOS != 2 {
				t.Errorf("TOS %#x", got[0].TOS)
			}
			if pk, _ := tap.snapshot(); len(pk) != 3 {
				t.Errorf("tap saw %d", len(pk))
			}
			if s := a.Stats(); s.SentPackets != 3 || s.GSOSends != 1 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// TestPipeDrops checks the pipe's failure modes: a full queue, an unknown
// address, a bound address, closed Conns, and bad messages.
func TestPipeDrops(t *testing.T) {
	n := NewPipeNetwork()
	n.QueueLen = 4
	a, b := pipePair(t, n, "10.0.0.1:4791", "10.0.0.2:4791")
	var msgs []Message
	for i := range 10 {
		msgs = append(msgs, Message{Buf: rocePacket(32, uint32(i)), Peer: b.LocalAddr()})
	}
	msgs = append(msgs, Message{Buf: rocePacket(32, 99), Peer: netip.MustParseAddrPort("10.0.0.9:4791")})
	if k, err := a.Send(msgs); k != 11 || err != nil {
		t.Fatal(k, err)
	}
	got := recvN(t, b, 4, time.Second)
	if psnOf(got[3].Buf) != 3 || b.Stats().Drops[DropOverflow] != 6 || a.Stats().SendDrops != 1 {
		t.Errorf("stats %+v %+v", a.Stats(), b.Stats())
	}
	if _, err := n.Listen(b.LocalAddr(), Options{}); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("double bind: %v", err)
	}
	if _, err := n.Listen(netip.MustParseAddrPort("0.0.0.0:1"), Options{}); !errors.Is(err, ErrAddress) {
		t.Errorf("unspecified: %v", err)
	}
	if k, err := a.Send([]Message{{Buf: make([]byte, 8), Peer: b.LocalAddr()}}); k != 0 || !errors.Is(err, ErrPacketSize) {
		t.Errorf("short: %d %v", k, err)
	}
	if k, err := a.Send([]Message{{Buf: rocePacket(32, 1), Peer: netip.MustParseAddrPort("[fd00::1]:4791")}}); k != 0 || !errors.Is(err, ErrPeer) {
		t.Errorf("family: %d %v", k, err)
	}
	done := make(chan error)
	go func() {
		_, err := b.Recv(make([]Message, 1))
		done <- err
	}()
	b.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Recv after Close: %v", err)
	}
	// The address is free again.
	c, err := n.Listen(b.LocalAddr(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}
