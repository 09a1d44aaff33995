package transport

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego/icrc"
)

// wirePkt is one RoCE packet seen on the wire, with the ID it carried.
type wirePkt struct {
	id    uint16
	psn   uint32
	size  int
	super bool // part of a GSO datagram captured whole
	csum  uint16
	df    bool
}

// wirePackets checks every captured frame's ICRC against the headers it
// really travelled under and returns its packets. A frame longer than seg
// is a GSO datagram that was not segmented before the capture point: its
// packets are checked with the IDs the kernel gives segments when it does
// segment it (first ID, +1, +2, ...).
func wirePackets(t *testing.T, frames []capFrame, seg int) []wirePkt {
	t.Helper()
	var out []wirePkt
	for _, f := range frames {
		ipv4 := f.ip[0]>>4 == 4
		var id uint16
		df := true
		if ipv4 {
			id = binary.BigEndian.Uint16(f.ip[4:])
			df = f.ip[6]&0x40 != 0
		}
		csum := binary.BigEndian.Uint16(f.udp[6:])
		if len(f.payload) <= seg {
			crc, ok := icrc.FromHeaders(f.ip, f.udp, f.payload)
			if !ok || crc != icrc.Get(f.payload) {
				t.Errorf("captured packet PSN %d ID %d: ICRC %08x, stored %08x", psnOf(f.payload), id, crc, icrc.Get(f.payload))
			}
			out = append(out, wirePkt{id, psnOf(f.payload), len(f.payload), false, csum, df})
			continue
		}
		sport, dport := binary.BigEndian.Uint16(f.udp[0:]), binary.BigEndian.Uint16(f.udp[2:])
		check := func(id uint16, p []byte) bool {
			if ipv4 {
				v := icrc.V4{Src: [4]byte(f.ip[12:16]), Dst: [4]byte(f.ip[16:20]), SrcPort: sport, DstPort: dport, DF: df}
				return v.Check(id, p)
			}
			v := icrc.V6{Src: [16]byte(f.ip[8:24]), Dst: [16]byte(f.ip[24:40]), SrcPort: sport, DstPort: dport}
			return v.Sum(p) == icrc.Get(p)
		}
		for off := 0; off < len(f.payload); off += seg {
			p := f.payload[off:min(off+seg, len(f.payload))]
			if !check(id, p) {
				t.Errorf("segment PSN %d of a whole GSO datagram: ICRC wrong for ID %d", psnOf(p), id)
			}
			out = append(out, wirePkt{id, psnOf(p), len(p), true, csum, df})
			if ipv4 {
				id++
			}
		}
	}
	return out
}

// sendPattern sends three single packets and two GSO runs of 7 (6 x 256
// bytes and 128) to peer, and returns how many packets that is.
func sendPattern(t *testing.T, c Conn, peer netip.AddrPort) int {
	t.Helper()
	run := func(base uint32) []byte {
		var b []byte
		for i := range 7 {
			size := 256
			if i == 6 {
				size = 128
			}
			b = append(b, rocePacket(size, base+uint32(i))...)
		}
		return b
	}
	msgs := []Message{
		{Buf: rocePacket(100, 1), Peer: peer},
		{Buf: run(10), Peer: peer, Seg: 256},
		{Buf: rocePacket(100, 2), Peer: peer, TOS: 0x02},
		{Buf: run(20), Peer: peer, Seg: 256},
		{Buf: rocePacket(100, 3), Peer: peer, TOS: 0x03},
	}
	if n, err := c.Send(msgs); n != len(msgs) || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	return 17
}

// wantID is the ID each packet of sendPattern must carry: 0 for single
// packets (DF on an unconnected socket), the segment index within a GSO
// run, or 0 when the runs were sent as separate datagrams.
func wantID(psn uint32, gso bool) uint16 {
	if !gso || psn < 10 {
		return 0
	}
	return uint16(psn % 10)
}

// TestWireIPID measures, on a veth pair between two namespaces, which IPv4
// ID the kernel writes on each kind of send, and checks the ICRC of every
// packet captured on the receiving device against its real headers.
func TestWireIPID(t *testing.T) {
	cases := []struct {
		name    string
		opts    Options
		segment bool // turn the sending veth's UDP segmentation offload off
	}{
		// Software GSO segments before the device: segments on the wire.
		{"gso-software-segmentation", Options{}, true},
		// veth passes GSO datagrams whole; the receiving UDP socket
		// segments them, numbering IDs the same way.
		{"gso-passthrough", Options{}, false},
		{"no-gso", Options{NoGSO: true}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNet(t)
			if tc.segment {
				n.ethtool(t, n.nsA, n.vethA, "tx-udp-segmentation", "off")
			}
			var a, b Conn
			var capB *capture
			var err error
			in(t, n.nsA, func() { a, err = Listen(netip.MustParseAddrPort("198.18.0.1:4791"), tc.opts) })
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			in(t, n.nsB, func() {
				b, err = Listen(netip.MustParseAddrPort("198.18.0.2:4791"), Options{NoGRO: true})
				capB = openCapture(t, n.vethB, Port)
			})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			total := sendPattern(t, a, b.LocalAddr())
			gso := !tc.opts.NoGSO
			wantFrames := total
			if gso && !tc.segment {
				wantFrames = 3 + 2
			}
			frames := capB.read(wantFrames, 5*time.Second)
			if len(frames) != wantFrames {
				t.Fatalf("captured %d frames, want %d", len(frames), wantFrames)
			}
			pkts := wirePackets(t, frames, 256)
			if len(pkts) != total {
				t.Fatalf("captured %d packets, want %d", len(pkts), total)
			}
			for _, p := range pkts {
				if p.id != wantID(p.psn, gso) || !p.df {
					t.Errorf("PSN %d: ID %d DF %v on the wire, want ID %d DF", p.psn, p.id, p.df, wantID(p.psn, gso))
				}
				if p.super != (gso && !tc.segment && p.psn >= 10) {
					t.Errorf("PSN %d: whole GSO datagram %v", p.psn, p.super)
				}
				// SO_NO_CHECK: checksum 0 like rxe when GSO is off.
				if !gso && p.csum != 0 {
					t.Errorf("PSN %d: UDP checksum %#04x with SO_NO_CHECK", p.psn, p.csum)
				}
			}
			got := recvN(t, b, total, 5*time.Second)
			for _, m := range got {
				if m.IPID != wantID(psnOf(m.Buf), gso) {
					t.Errorf("received PSN %d with recovered ID %d", psnOf(m.Buf), m.IPID)
				}
			}
			t.Logf("%d frames, %d packets: IDs as computed, every ICRC verified", len(frames), len(pkts))
		})
	}
}

// TestWireKernelIDs documents the IDs the kernel picks for sockets rxego
// does not use, which is why it uses an unconnected DF socket: in the
// default PMTU mode and on connected sockets the ID comes from a counter
// whose start cannot be known (hashed per destination, or per socket).
func TestWireKernelIDs(t *testing.T) {
	n := newTestNet(t)
	var capB *capture
	var plain, conn *net.UDPConn
	var err, err2 error
	in(t, n.nsB, func() {
		capB = openCapture(t, n.vethB, Port)
		_, err = Listen(netip.MustParseAddrPort("198.18.0.2:4791"), Options{}) // so the port is open
	})
	if err != nil {
		t.Fatal(err)
	}
	dst := &net.UDPAddr{IP: net.IPv4(198, 18, 0, 2), Port: Port}
	in(t, n.nsA, func() {
		plain, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(198, 18, 0, 1)})
		conn, err2 = net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(198, 18, 0, 1)}, dst)
	})
	if err != nil || err2 != nil {
		t.Fatal(err, err2)
	}
	defer plain.Close()
	defer conn.Close()
	for i := range 3 {
		plain.WriteToUDP(rocePacket(64, uint32(i)), dst)
	}
	for i := range 3 {
		conn.Write(rocePacket(64, uint32(10+i)))
	}
	frames := capB.read(6, 5*time.Second)
	if len(frames) != 6 {
		t.Fatalf("captured %d frames", len(frames))
	}
	var ids []uint16
	for _, f := range frames {
		ids = append(ids, binary.BigEndian.Uint16(f.ip[4:]))
	}
	t.Logf("default PMTU mode IDs %v, connected socket IDs %v", ids[:3], ids[3:])
	for _, g := range [][]uint16{ids[:3], ids[3:]} {
		if g[0] == 0 && g[1] == 0 && g[2] == 0 {
			t.Errorf("IDs %v: the kernel wrote 0 where a counter was expected", g)
		}
	}
	// The per-socket counter counts up by one; the hashed one does too
	// within a jiffy but jumps by a random amount after one passes.
	if c := ids[3:]; c[1] != c[0]+1 || c[2] != c[1]+1 {
		t.Errorf("connected socket IDs %v do not count up", c)
	}
}

// TestLoopbackWire captures on lo (inside a namespace): DF packets carry
// ID 0 and a GSO run crosses lo whole, as one datagram with the first ID.
func TestLoopbackWire(t *testing.T) {
	n := newTestNet(t)
	var a, b Conn
	var capLo *capture
	var err, err2 error
	in(t, n.nsA, func() {
		a, err = Listen(netip.MustParseAddrPort("127.0.0.1:4791"), Options{})
		b, err2 = Listen(netip.MustParseAddrPort("127.0.0.2:4791"), Options{})
		capLo = openCapture(t, "lo", Port)
	})
	if err != nil || err2 != nil {
		t.Fatal(err, err2)
	}
	defer a.Close()
	defer b.Close()
	total := sendPattern(t, a, b.LocalAddr())
	// lo shows every frame twice: leaving and arriving.
	frames := capLo.read(2*5, 5*time.Second)
	var arriving []capFrame
	for _, f := range frames {
		if !f.outgoing {
			arriving = append(arriving, f)
		}
	}
	pkts := wirePackets(t, arriving, 256)
	if len(arriving) != 5 || len(pkts) != total {
		t.Fatalf("captured %d frames, %d packets", len(arriving), len(pkts))
	}
	for _, p := range pkts {
		if p.id != wantID(p.psn, true) {
			t.Errorf("PSN %d: ID %d", p.psn, p.id)
		}
	}
	recvN(t, b, total, 5*time.Second)
}
