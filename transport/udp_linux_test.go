package transport

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego/icrc"
)

// offloadCases are the GSO/GRO combinations every loopback test runs.
var offloadCases = []struct {
	name string
	opts Options
}{
	{"plain", Options{NoGSO: true, NoGRO: true}},
	{"gso", Options{NoGRO: true}},
	{"gro", Options{NoGSO: true}},
	{"gso+gro", Options{}},
}

// TestLoopbackBatch sends a batch of packets of mixed sizes from 127.0.0.1
// to 127.0.0.2 in one Send and checks every one arrives intact, verified,
// with IP ID 0 (DF on an unconnected socket) and counted.
func TestLoopbackBatch(t *testing.T) {
	for _, oc := range offloadCases {
		t.Run(oc.name, func(t *testing.T) {
			a := listenAny(t, "127.0.0.1", oc.opts)
			b := listenAny(t, "127.0.0.2", oc.opts)
			const n = 150
			var msgs []Message
			want := map[uint32][]byte{}
			for i := range n {
				size := 16 + 4*(i%300)
				p := rocePacket(size, uint32(i))
				want[uint32(i)] = append([]byte(nil), p...)
				msgs = append(msgs, Message{Buf: p, Peer: b.LocalAddr()})
			}
			sent, err := a.Send(msgs)
			if err != nil || sent != n {
				t.Fatalf("Send = %d, %v", sent, err)
			}
			got := recvN(t, b, n, 5*time.Second)
			for _, m := range got {
				w, ok := want[psnOf(m.Buf)]
				if !ok || !samePayload(m.Buf, w) {
					t.Fatalf("packet PSN %d: got %x", psnOf(m.Buf), m.Buf)
				}
				delete(want, psnOf(m.Buf))
				if m.Peer != a.LocalAddr() || m.IPID != 0 || m.TOS != 0 {
					t.Errorf("packet PSN %d: peer %v id %d tos %#x", psnOf(m.Buf), m.Peer, m.IPID, m.TOS)
				}
			}
			if len(want) != 0 {
				t.Errorf("%d packets missing", len(want))
			}
			sa, sb := a.Stats(), b.Stats()
			if sa.SentPackets != n || sa.SendCalls < 3 || sa.SendCalls > 10 {
				t.Errorf("sender stats %+v", sa)
			}
			if sb.RecvPackets != n || sb.Dropped() != 0 || sb.RecvCalls == 0 || sb.RecvCalls > n {
				t.Errorf("receiver stats %+v", sb)
			}
			if sa.GSO == oc.opts.NoGSO || sb.GRO == oc.opts.NoGRO {
				t.Errorf("offloads: GSO %v GRO %v for %+v", sa.GSO, sb.GRO, oc.opts)
			}
		})
	}
}

// TestGSORun sends runs of packets as Seg messages and checks they arrive
// as separate verified packets with the right contents and, for GSO
// sends, the per-segment IP IDs 0, 1, 2, ... the ICRCs were computed for.
func TestGSORun(t *testing.T) {
	for _, oc := range offloadCases {
		t.Run(oc.name, func(t *testing.T) {
			a := listenAny(t, "127.0.0.1", oc.opts)
			b := listenAny(t, "127.0.0.2", oc.opts)
			const seg, k = 1024, 10
			var want [][]byte
			var run []byte
			for i := range k {
				size := seg
				if i == k-1 {
					size = 520
				}
				p := rocePacket(size, uint32(i))
				want = append(want, p)
				run = append(run, p...)
			}
			msgs := []Message{{Buf: run, Peer: b.LocalAddr(), Seg: seg}, {Buf: rocePacket(64, 100), Peer: b.LocalAddr()}}
			if n, err := a.Send(msgs); n != 2 || err != nil {
				t.Fatalf("Send = %d, %v", n, err)
			}
			got := recvN(t, b, k+1, 5*time.Second)
			for i, m := range got[:k] {
				if !samePayload(m.Buf, want[i]) {
					t.Fatalf("segment %d: got %d bytes PSN %d", i, len(m.Buf), psnOf(m.Buf))
				}
				wantID := uint16(0)
				if !oc.opts.NoGSO {
					wantID = uint16(i)
				}
				if m.IPID != wantID {
					t.Errorf("segment %d: IP ID %d, want %d", i, m.IPID, wantID)
				}
			}
			if psnOf(got[k].Buf) != 100 || got[k].IPID != 0 {
				t.Errorf("last packet PSN %d ID %d", psnOf(got[k].Buf), got[k].IPID)
			}
			sa, sb := a.Stats(), b.Stats()
			if !oc.opts.NoGSO && (sa.GSOSends != 1 || sa.GSOSegments != k || sa.SendCalls != 1) {
				t.Errorf("sender stats %+v", sa)
			}
			if sa.SentPackets != k+1 {
				t.Errorf("sent %d packets", sa.SentPackets)
			}
			// Over lo a GSO datagram reaches a GRO socket whole.
			if !oc.opts.NoGSO && !oc.opts.NoGRO && (sb.GROBatches != 1 || sb.GROSegments != k) {
				t.Errorf("receiver stats %+v", sb)
			}
			if sb.RecvPackets != k+1 || sb.Dropped() != 0 {
				t.Errorf("receiver stats %+v", sb)
			}
		})
	}
}

// TestTOS checks per-message TOS on send (IP_TOS control messages in one
// sendmmsg), the default TOS, and that GSO runs carry their TOS on every
// segment; the receiver reads each through IP_RECVTOS.
func TestTOS(t *testing.T) {
	for _, oc := range offloadCases {
		t.Run(oc.name, func(t *testing.T) {
			opts := oc.opts
			opts.TOS = 0x02 // ECT(0) by default
			a := listenAny(t, "127.0.0.1", opts)
			b := listenAny(t, "127.0.0.2", oc.opts)
			tap := &tapRec{}
			a.SetTap(tap)
			toss := []uint8{0, 0x01, 0x03, 0xb8 | 0x02, 0x02}
			var msgs []Message
			for i, tos := range toss {
				msgs = append(msgs, Message{Buf: rocePacket(100, uint32(i)), Peer: b.LocalAddr(), TOS: tos})
			}
			run := append(rocePacket(200, 10), rocePacket(200, 11)...)
			msgs = append(msgs, Message{Buf: run, Peer: b.LocalAddr(), TOS: 0x03, Seg: 200})
			if n, err := a.Send(msgs); n != len(msgs) || err != nil {
				t.Fatalf("Send = %d, %v", n, err)
			}
			got := recvN(t, b, len(toss)+2, 5*time.Second)
			want := map[uint32]uint8{0: 0x02, 1: 0x01, 2: 0x03, 3: 0xba, 4: 0x02, 10: 0x03, 11: 0x03}
			for _, m := range got {
				if m.TOS != want[psnOf(m.Buf)] {
					t.Errorf("PSN %d: TOS %#x, want %#x", psnOf(m.Buf), m.TOS, want[psnOf(m.Buf)])
				}
			}
			pk, _ := tap.snapshot()
			if len(pk) != len(toss)+2 {
				t.Fatalf("tap saw %d packets", len(pk))
			}
			for _, p := range pk {
				if p.dir != Out || p.tos != want[psnOf(p.pkt)] || p.remote != b.LocalAddr() {
					t.Errorf("tap: %+v", p)
				}
			}
		})
	}
}

// TestDropsAndTap sends, from a plain UDP socket, a good packet, a packet
// with one corrupted byte, a short datagram, a packet with an unknown
// opcode and an empty datagram: only the good one is delivered, the rest
// are counted by reason and shown to the Tap.
func TestDropsAndTap(t *testing.T) {
	for _, oc := range offloadCases[:3] {
		t.Run(oc.name, func(t *testing.T) {
			b := listenAny(t, "127.0.0.2", oc.opts)
			tap := &tapRec{}
			b.SetTap(tap)
			u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 3)})
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			from := u.LocalAddr().(*net.UDPAddr).AddrPort()
			v := icrc.V4{Src: from.Addr().As4(), Dst: b.LocalAddr().Addr().As4(), SrcPort: from.Port(), DstPort: b.LocalAddr().Port(), DF: true}
			good := rocePacket(64, 1)
			v.Fill(0, good)
			bad := rocePacket(64, 2)
			v.Fill(0, bad)
			bad[30] ^= 0x40
			unknown := rocePacket(64, 3)
			unknown[0] = 0x1f
			v.Fill(0, unknown)
			to := net.UDPAddrFromAddrPort(b.LocalAddr())
			for _, d := range [][]byte{bad, []byte("hello"), unknown, {}, good} {
				if _, err := u.WriteToUDP(d, to); err != nil {
					t.Fatal(err)
				}
			}
			got := recvN(t, b, 1, 5*time.Second)
			if psnOf(got[0].Buf) != 1 || got[0].Peer != from {
				t.Fatalf("got PSN %d from %v", psnOf(got[0].Buf), got[0].Peer)
			}
			s := b.Stats()
			want := [NumDropReasons]uint64{DropBadICRC: 1, DropShort: 2, DropNotRoCE: 1}
			if s.Drops != want || s.RecvPackets != 1 {
				t.Errorf("stats %+v", s)
			}
			pk, dr := tap.snapshot()
			if len(pk) != 1 || pk[0].dir != In || psnOf(pk[0].pkt) != 1 {
				t.Errorf("tap packets %+v", pk)
			}
			reasons := map[DropReason]int{}
			for _, d := range dr {
				reasons[d.reason]++
				if d.remote != from {
					t.Errorf("drop from %v", d.remote)
				}
			}
			if reasons[DropBadICRC] != 1 || reasons[DropShort] != 2 || reasons[DropNotRoCE] != 1 {
				t.Errorf("tap drops %v", reasons)
			}
		})
	}
}

// TestTruncated sends a datagram longer than the receive slot.
func TestTruncated(t *testing.T) {
	b := listenAny(t, "127.0.0.2", Options{NoGRO: true, RecvBufSize: 256})
	a := listenAny(t, "127.0.0.1", Options{})
	if n, err := a.Send([]Message{{Buf: rocePacket(512, 1), Peer: b.LocalAddr()}, {Buf: rocePacket(128, 2), Peer: b.LocalAddr()}}); n != 2 {
		t.Fatal(n, err)
	}
	got := recvN(t, b, 1, 5*time.Second)
	if psnOf(got[0].Buf) != 2 || b.Stats().Drops[DropTruncated] != 1 {
		t.Errorf("got PSN %d, stats %+v", psnOf(got[0].Buf), b.Stats())
	}
}

// TestCloseUnblocksRecv checks that Close wakes a blocked Recv with
// net.ErrClosed and that later calls fail the same way.
func TestCloseUnblocksRecv(t *testing.T) {
	c := listenAny(t, "127.0.0.1", Options{})
	done := make(chan error, 1)
	go func() {
		_, err := c.Recv(make([]Message, 4))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Recv after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv still blocked after Close")
	}
	if _, err := c.Send([]Message{{Buf: rocePacket(16, 0), Peer: c.LocalAddr()}}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}
	if _, err := c.Recv(make([]Message, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Recv after Close: %v", err)
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}

// TestListenErrors checks Listen's errors are clear and typed.
func TestListenErrors(t *testing.T) {
	c := listenAny(t, "127.0.0.1", Options{})
	if _, err := Listen(c.LocalAddr(), Options{}); !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("second Listen on %v: %v", c.LocalAddr(), err)
	}
	for _, a := range []string{"0.0.0.0:4791", "[::]:4791", "224.0.0.1:4791"} {
		if _, err := Listen(netip.MustParseAddrPort(a), Options{}); !errors.Is(err, ErrAddress) {
			t.Errorf("Listen %s: %v", a, err)
		}
	}
	if _, err := Listen(netip.AddrPort{}, Options{}); !errors.Is(err, ErrAddress) {
		t.Errorf("Listen zero: %v", err)
	}
	if _, err := Listen(netip.MustParseAddrPort("[::1]:4791"), Options{Mode: RecvRaw}); !errors.Is(err, ErrRawIPv6) {
		t.Errorf("raw IPv6: %v", err)
	}
	if _, err := Listen(netip.MustParseAddrPort("127.0.0.1:4791"), Options{Mode: 7}); err == nil {
		t.Error("unknown mode accepted")
	}
}

// TestSendErrors checks malformed messages are rejected before anything
// of them is sent, with the count of messages sent before them.
func TestSendErrors(t *testing.T) {
	a := listenAny(t, "127.0.0.1", Options{})
	b := listenAny(t, "127.0.0.2", Options{})
	ok := Message{Buf: rocePacket(32, 1), Peer: b.LocalAddr()}
	cases := []struct {
		m    Message
		want error
	}{
		{Message{Buf: make([]byte, 15), Peer: b.LocalAddr()}, ErrPacketSize},
		{Message{Buf: make([]byte, 70000), Peer: b.LocalAddr()}, ErrPacketSize},
		{Message{Buf: rocePacket(32, 1), Peer: netip.MustParseAddrPort("[2001:db8::1]:4791")}, ErrPeer},
		{Message{Buf: rocePacket(32, 1), Peer: netip.AddrPort{}}, ErrPeer},
		{Message{Buf: rocePacket(32, 1), Peer: netip.MustParseAddrPort("127.0.0.2:0")}, ErrPeer},
		{Message{Buf: make([]byte, 40), Peer: b.LocalAddr(), Seg: 12}, ErrSegments},
		{Message{Buf: make([]byte, 40), Peer: b.LocalAddr(), Seg: 32}, ErrSegments}, // last segment 8 bytes
		{Message{Buf: make([]byte, 65*16), Peer: b.LocalAddr(), Seg: 16}, ErrSegments},
	}
	for i, tc := range cases {
		before := a.Stats().SentPackets
		n, err := a.Send([]Message{ok, tc.m, ok})
		if n != 1 || err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("case %d: Send = %d, %v", i, n, err)
		}
		if got := a.Stats().SentPackets - before; got != 1 {
			t.Errorf("case %d: %d packets went out", i, got)
		}
	}
	// An IPv4-mapped peer is fine for an IPv4 Conn.
	m := Message{Buf: rocePacket(32, 9), Peer: netip.AddrPortFrom(netip.AddrFrom16(b.LocalAddr().Addr().As16()), b.LocalAddr().Port())}
	if n, err := a.Send([]Message{m}); n != 1 || err != nil {
		t.Errorf("mapped peer: %d, %v", n, err)
	}
	got := recvN(t, b, len(cases)+1, 5*time.Second)
	if psnOf(got[len(got)-1].Buf) != 9 {
		t.Errorf("last packet PSN %d", psnOf(got[len(got)-1].Buf))
	}
}

// TestGSOTap checks the Tap sees every GSO segment with the ID it carries.
func TestGSOTap(t *testing.T) {
	a := listenAny(t, "127.0.0.1", Options{})
	b := listenAny(t, "127.0.0.2", Options{})
	tap := &tapRec{}
	a.SetTap(tap)
	run := append(append(rocePacket(64, 1), rocePacket(64, 2)...), rocePacket(32, 3)...)
	if n, err := a.Send([]Message{{Buf: run, Peer: b.LocalAddr(), Seg: 64}}); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	pk, _ := tap.snapshot()
	if len(pk) != 3 {
		t.Fatalf("tap saw %d packets", len(pk))
	}
	for i, p := range pk {
		v := icrc.V4{Src: [4]byte{127, 0, 0, 1}, Dst: [4]byte{127, 0, 0, 2}, SrcPort: a.LocalAddr().Port(), DstPort: b.LocalAddr().Port(), DF: true}
		if p.id != uint16(i) || psnOf(p.pkt) != uint32(i+1) || !v.Check(p.id, p.pkt) {
			t.Errorf("segment %d: id %d PSN %d", i, p.id, psnOf(p.pkt))
		}
	}
	a.SetTap(nil)
	if n, _ := a.Send([]Message{{Buf: rocePacket(16, 4), Peer: b.LocalAddr()}}); n != 1 {
		t.Fatal("send")
	}
	if pk, _ := tap.snapshot(); len(pk) != 3 {
		t.Errorf("removed tap still called")
	}
	recvN(t, b, 4, 5*time.Second)
}

// TestNoAllocs checks that a steady stream of batched sends and receives
// allocates nothing per packet, with and without offloads.
func TestNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, oc := range offloadCases {
		t.Run(oc.name, func(t *testing.T) {
			a := listenAny(t, "127.0.0.1", oc.opts)
			b := listenAny(t, "127.0.0.2", oc.opts)
			tap := &countTap{}
			a.SetTap(tap)
			b.SetTap(tap)
			const n = 32
			msgs := make([]Message, 0, n+1)
			for i := range n {
				msgs = append(msgs, Message{Buf: rocePacket(1024, uint32(i)), Peer: b.LocalAddr(), TOS: uint8(i & 3)})
			}
			var run []byte
			for i := range 8 {
				run = append(run, rocePacket(1024, uint32(100+i))...)
			}
			msgs = append(msgs, Message{Buf: run, Peer: b.LocalAddr(), Seg: 1024})
			rmsgs := make([]Message, 64)
			timer := time.AfterFunc(20*time.Second, func() { b.Close() }) // never hang
			defer timer.Stop()
			round := func() {
				if k, err := a.Send(msgs); k != len(msgs) || err != nil {
					t.Fatalf("Send = %d, %v", k, err)
				}
				for got := 0; got < n+8; {
					k, err := b.Recv(rmsgs)
					if err != nil {
						t.Fatalf("Recv: %v", err)
					}
					got += k
				}
			}
			round()
			if allocs := testing.AllocsPerRun(50, round); allocs != 0 {
				t.Errorf("%v allocations per round of %d packets", allocs, n+8)
			}
			if tap.n.Load() == 0 {
				t.Error("tap not called")
			}
		})
	}
}

// countTap counts packets without allocating.
type countTap struct{ n atomic.Int64 }

func (c *countTap) Packet(Dir, time.Time, netip.AddrPort, netip.AddrPort, uint8, uint16, []byte) {
	c.n.Add(1)
}

func (c *countTap) Drop(DropReason, time.Time, netip.AddrPort, netip.AddrPort, uint8, []byte) {}

// TestConcurrentSendRecv runs two Conns that each receive on one goroutine
// and send on another at the same time, echoing packets back, while a
// third goroutine reads Stats: the race detector checks the locking.
func TestConcurrentSendRecv(t *testing.T) {
	a := listenAny(t, "127.0.0.1", Options{})
	b := listenAny(t, "127.0.0.2", Options{})
	const n = 2000
	// b echoes everything back to a from its receive goroutine.
	go func() {
		buf := make([]Message, 64)
		out := make([]Message, 64)
		for {
			k, err := b.Recv(buf)
			if err != nil {
				return
			}
			for i := range buf[:k] {
				out[i] = Message{Buf: buf[i].Buf, Peer: buf[i].Peer, TOS: buf[i].TOS}
			}
			if _, err := b.Send(out[:k]); err != nil {
				return
			}
		}
	}()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				a.Stats()
				b.Stats()
				time.Sleep(time.Millisecond)
			}
		}
	}()
	// a sends from this goroutine while recvN receives on another; the
	// window keeps the socket buffers from overflowing.
	done := make(chan []Message, 1)
	go func() { done <- recvN(t, a, n, 10*time.Second) }()
	for i := 0; i < n; i += 50 {
		var msgs []Message
		for j := i; j < i+50; j++ {
			msgs = append(msgs, Message{Buf: rocePacket(256, uint32(j)), Peer: b.LocalAddr(), TOS: uint8(j % 4)})
		}
		if k, err := a.Send(msgs); k != len(msgs) {
			t.Fatal(k, err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for uint64(i) > a.Stats().RecvPackets+100 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
		}
	}
	got := <-done
	seen := make(map[uint32]bool)
	for _, m := range got {
		if m.TOS != uint8(psnOf(m.Buf)%4) || len(m.Buf) != 256 {
			t.Errorf("PSN %d: TOS %d", psnOf(m.Buf), m.TOS)
		}
		seen[psnOf(m.Buf)] = true
	}
	if len(seen) != n {
		t.Errorf("%d distinct packets", len(seen))
	}
}

// TestRecvBuffer: a Conn reports the receive buffer the kernel gave its
// reading socket, in the kernel's accounting (twice what was asked), in
// both receive modes; devices size their READ budget from it.
func TestRecvBuffer(t *testing.T) {
	for _, mode := range []RecvMode{RecvSocket, RecvRaw} {
		c, err := Listen(netip.MustParseAddrPort("127.0.0.1:0"), Options{Mode: mode, SocketRecvBuffer: 96 << 10})
		if err != nil {
			if mode == RecvRaw {
				t.Logf("raw mode: %v", err)
				continue
			}
			t.Fatal(err)
		}
		got := c.(RecvBufferer).RecvBuffer()
		c.Close()
		if got != 2*96<<10 {
			t.Fatalf("mode %v: RecvBuffer %d, want %d (SO_RCVBUF of 96 KiB, doubled by the kernel)", mode, got, 2*96<<10)
		}
	}
}
