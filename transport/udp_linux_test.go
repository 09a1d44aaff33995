package transport

import (
	"testing"
	"time"
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
