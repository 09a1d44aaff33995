package transport

import (
	"encoding/binary"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/rxego/rxego/icrc"
	"golang.org/x/sys/unix"
)

// TestIPv6 runs batches, GSO runs and traffic classes over IPv6 between
// two namespaces, checking every captured packet's ICRC and every
// received one in full.
func TestIPv6(t *testing.T) {
	for _, oc := range offloadCases {
		t.Run(oc.name, func(t *testing.T) {
			n := newTestNet(t)
			var a, b Conn
			var capB *capture
			var err, err2 error
			in(t, n.nsA, func() { a, err = Listen(netip.MustParseAddrPort("[2001:2::1]:4791"), oc.opts) })
			in(t, n.nsB, func() {
				b, err2 = Listen(netip.MustParseAddrPort("[2001:2::2]:4791"), oc.opts)
				capB = openCapture(t, n.vethB, Port)
			})
			if err != nil || err2 != nil {
				t.Fatal(err, err2)
			}
			defer a.Close()
			defer b.Close()
			total := sendPattern(t, a, b.LocalAddr())
			frames := capB.read(5, 5*time.Second)
			if pkts := wirePackets(t, frames, 256); len(pkts) < 5 {
				t.Errorf("captured %d packets", len(pkts))
			}
			got := recvN(t, b, total, 5*time.Second)
			tos := map[uint32]uint8{2: 0x02, 3: 0x03}
			for _, m := range got {
				if m.Peer != a.LocalAddr() || m.IPID != 0 || m.TOS != tos[psnOf(m.Buf)] {
					t.Errorf("PSN %d: peer %v id %d tclass %#x", psnOf(m.Buf), m.Peer, m.IPID, m.TOS)
				}
			}
			if s := b.Stats(); s.RecvPackets != uint64(total) || s.Dropped() != 0 {
				t.Errorf("stats %+v", s)
			}
			// A corrupted packet is caught in full (no ID to recover).
			p := rocePacket(64, 99)
			v := icrc.V6{Src: a.LocalAddr().Addr().As16(), Dst: b.LocalAddr().Addr().As16(), SrcPort: Port, DstPort: Port}
			icrc.Put(p, v.Sum(p))
			p[40] ^= 0x80
			sendZeroChecksum(t, n, p, b.LocalAddr(), false)
			if n, err := a.Send([]Message{{Buf: rocePacket(32, 100), Peer: b.LocalAddr()}}); n != 1 {
				t.Fatal(err)
			}
			if got := recvN(t, b, 1, 5*time.Second); psnOf(got[0].Buf) != 100 || b.Stats().Drops[DropBadICRC] != 1 {
				t.Errorf("stats %+v", b.Stats())
			}
		})
	}
}

// sendZeroChecksum sends payload from [2001:2::1]:4792 in namespace A to
// dst, with UDP checksum 0 (UDP_NO_CHECK6_TX) when zero is set, as rxe does.
func sendZeroChecksum(t *testing.T, n *testNet, payload []byte, dst netip.AddrPort, zero bool) {
	t.Helper()
	in(t, n.nsA, func() {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if zero {
			if err := unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_NO_CHECK6_TX, 1); err != nil {
				t.Fatal(err)
			}
		}
		if err := unix.Bind(fd, &unix.SockaddrInet6{Addr: netip.MustParseAddr("2001:2::1").As16(), Port: 4792}); err != nil {
			t.Fatal(err)
		}
		if err := unix.Sendto(fd, payload, 0, &unix.SockaddrInet6{Addr: dst.Addr().As16(), Port: int(dst.Port())}); err != nil {
			t.Fatal(err)
		}
	})
}

// TestIPv6ZeroChecksum checks that a datagram with UDP checksum 0, as rxe
// sends over IPv6, is accepted thanks to UDP_NO_CHECK6_RX, while a plain
// IPv6 socket drops it.
func TestIPv6ZeroChecksum(t *testing.T) {
	n := newTestNet(t)
	var b Conn
	var capB *capture
	var plain int
	var err error
	in(t, n.nsB, func() {
		b, err = Listen(netip.MustParseAddrPort("[2001:2::2]:4791"), Options{})
		capB = openCapture(t, n.vethB, Port)
		plain, _ = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if e := unix.Bind(plain, &unix.SockaddrInet6{Addr: netip.MustParseAddr("2001:2::2").As16(), Port: 4793}); e != nil {
			t.Fatal(e)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	defer unix.Close(plain)
	pkt := func(psn uint32, dport uint16) []byte {
		p := rocePacket(64, psn)
		v := icrc.V6{Src: netip.MustParseAddr("2001:2::1").As16(), Dst: b.LocalAddr().Addr().As16(), SrcPort: 4792, DstPort: dport}
		icrc.Put(p, v.Sum(p))
		return p
	}
	sendZeroChecksum(t, n, pkt(1, Port), b.LocalAddr(), true)
	frames := capB.read(1, 5*time.Second)
	if len(frames) != 1 || binary.BigEndian.Uint16(frames[0].udp[6:]) != 0 {
		t.Fatalf("captured %d frames, checksum not 0", len(frames))
	}
	got := recvN(t, b, 1, 5*time.Second)
	if psnOf(got[0].Buf) != 1 || got[0].Peer != netip.MustParseAddrPort("[2001:2::1]:4792") {
		t.Errorf("got PSN %d from %v", psnOf(got[0].Buf), got[0].Peer)
	}
	// The plain socket: the zero-checksum datagram is dropped, the next one
	// (with a checksum) is the first it reads.
	dst := netip.AddrPortFrom(b.LocalAddr().Addr(), 4793)
	sendZeroChecksum(t, n, pkt(2, 4793), dst, true)
	sendZeroChecksum(t, n, pkt(3, 4793), dst, false)
	buf := make([]byte, 256)
	pfd := []unix.PollFd{{Fd: int32(plain), Events: unix.POLLIN}}
	if k, _ := unix.Poll(pfd, 5000); k != 1 {
		t.Fatal("plain socket got nothing")
	}
	if k, _, err := unix.Recvfrom(plain, buf, unix.MSG_DONTWAIT); err != nil || psnOf(buf[:k]) != 3 {
		t.Errorf("plain socket read PSN %d (%v): the zero-checksum datagram was not dropped", psnOf(buf[:k]), err)
	}
}

// TestGROVeth turns GRO on at the receiving veth. First, GSO runs that
// the sending veth segments (as a NIC would) are coalesced again by GRO
// into batches that Recv splits. Then separate datagrams alternate TOS
// with threaded NAPI, which lets many reach one GRO poll: the kernel never
// coalesces across a TOS change, so every packet keeps its own TOS.
func TestGROVeth(t *testing.T) {
	n := newTestNet(t)
	n.ethtool(t, n.nsA, n.vethA, "tx-udp-segmentation", "off")
	n.ethtool(t, n.nsB, n.vethB, "gro", "on", "rx-udp-gro-forwarding", "on")
	var a, b Conn
	var err, err2 error
	in(t, n.nsA, func() { a, err = Listen(netip.MustParseAddrPort("198.18.0.1:4791"), Options{}) })
	in(t, n.nsB, func() { b, err2 = Listen(netip.MustParseAddrPort("198.18.0.2:4791"), Options{}) })
	if err != nil || err2 != nil {
		t.Fatal(err, err2)
	}
	defer a.Close()
	defer b.Close()
	tosOf := func(psn uint32) uint8 { return 0x02 | uint8(psn/8%2) }
	var msgs []Message
	for r := range 8 {
		var run []byte
		for i := range 8 {
			run = append(run, rocePacket(1024, uint32(r*8+i))...)
		}
		msgs = append(msgs, Message{Buf: run, Peer: b.LocalAddr(), TOS: tosOf(uint32(r * 8)), Seg: 1024})
	}
	if k, err := a.Send(msgs); k != len(msgs) {
		t.Fatal(k, err)
	}
	check := func(got []Message, tosOf func(uint32) uint8) {
		t.Helper()
		for _, m := range got {
			if m.TOS != tosOf(psnOf(m.Buf)) || len(m.Buf) != 1024 {
				t.Errorf("PSN %d: TOS %#x len %d", psnOf(m.Buf), m.TOS, len(m.Buf))
			}
		}
	}
	check(recvN(t, b, 64, 5*time.Second), tosOf)
	s := b.Stats()
	t.Logf("GSO runs: %d datagrams for 64 packets, %d GRO batches holding %d packets", s.RecvDatagrams, s.GROBatches, s.GROSegments)
	if s.GROBatches == 0 || s.GROSegments > 64 {
		t.Errorf("no coalescing: %+v", s)
	}

	if out, err := exec.Command("ip", "netns", "exec", n.nsB, "sh", "-c", "echo 1 > /sys/class/net/"+n.vethB+"/threaded").CombinedOutput(); err != nil {
		t.Skipf("threaded NAPI: %v %s", err, out)
	}
	a.(*udpConn).gso.Store(false) // separate datagrams from here on
	same := func(uint32) uint8 { return 0x02 }
	alt := func(psn uint32) uint8 { return 0x02 | uint8(psn%2) }
	burst := func(base uint32, tos func(uint32) uint8) (datagrams, batches uint64) {
		before := b.Stats()
		for round := range 4 {
			msgs = msgs[:0]
			for i := range 64 {
				psn := base + uint32(round*64+i)
				msgs = append(msgs, Message{Buf: rocePacket(1024, psn), Peer: b.LocalAddr(), TOS: tos(psn)})
			}
			if k, err := a.Send(msgs); k != len(msgs) {
				t.Fatal(k, err)
			}
			check(recvN(t, b, 64, 5*time.Second), tos)
		}
		after := b.Stats()
		return after.RecvDatagrams - before.RecvDatagrams, after.GROBatches - before.GROBatches
	}
	d1, b1 := burst(1000, same)
	d2, b2 := burst(2000, alt)
	t.Logf("threaded NAPI, separate datagrams: one TOS: %d datagrams, %d GRO batches; alternating TOS: %d datagrams, %d GRO batches", d1, b1, d2, b2)
	if b2 != 0 {
		t.Errorf("GRO coalesced packets of different TOS")
	}
}
