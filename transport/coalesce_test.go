package transport

import (
	"net/netip"
	"testing"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/reth"
)

// TestRunLen checks how Coalesce groups messages into GSO runs: adjacent
// in memory, same peer, destination QP and TOS, equal length but a
// shorter last, at most MaxSegments packets and one IPv4 datagram's worth
// of bytes.
func TestRunLen(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:4791")
	b := netip.MustParseAddrPort("127.0.0.2:4791")
	slab := make([]byte, 1<<20)
	// msgs lays out packets of the given lengths back to back in slab.
	msgs := func(lens ...int) []Message {
		var out []Message
		off := 0
		for _, n := range lens {
			out = append(out, Message{Buf: slab[off : off+n], Peer: a})
			off += n
		}
		return out
	}
	rep := func(n, k int) []int {
		l := make([]int, k)
		for i := range l {
			l[i] = n
		}
		return l
	}
	ack := reth.ACKSyndrome(31)
	cases := []struct {
		name  string
		msgs  []Message
		ports int
		want  int
	}{
		{"one", msgs(100), 0, 1},
		{"equal", msgs(1040, 1040, 1040), 0, 3},
		{"shorter last", msgs(1040, 1040, 500), 0, 3},
		{"shorter then equal", msgs(1040, 500, 1040), 0, 2},
		{"longer second (RETH on FIRST is the other way)", msgs(1040, 1056), 0, 1},
		// A FIRST (with its RETH) takes the next packet along as its
		// shorter last segment; the MIDDLEs after it start a new run.
		{"FIRST then MIDDLEs", msgs(1056, 1040, 1040), 0, 2},
		{"segment limit", msgs(rep(100, 70)...), 0, MaxSegments},
		{"byte limit", msgs(rep(4112, 20)...), 0, 15},
		{"other peer", func() []Message { p := msgs(1040, 1040); p[1].Peer = b; return p }(), 0, 1},
		{"other TOS", func() []Message { p := msgs(1040, 1040); p[1].TOS = 2; return p }(), 0, 1},
		// A QP of another block may go to another of the peer's sockets:
		// never in one GSO datagram (Coalesce); QPs of one block always
		// land on one (GroupMember), so they may.
		{"other QP of the block", otherQP(a, 1), 0, 2},
		{"other QP of the block, other of 8 ports", otherQP(a, blockMate(0, 8, false)), 8, 1},
		{"other QP of the block, same of 8 ports", otherQP(a, blockMate(0, 8, true)), 8, 2},
		{"QP of another block", otherQP(a, QPNBlock), 0, 1},
		{"QP of another block, differing in the high byte", otherQP(a, 1<<16), 0, 1},
		// Plain ACKs of any QPs do share one (a late ACK is stale).
		{"ACKs of other blocks' QPs", acks(a, []uint32{1, 17, 33}, ack, ack, ack), 0, 3},
		{"ACKs of other blocks' QPs, same of 8 ports", acks(a, []uint32{1, portMate(1, 8)}, ack, ack), 8, 2},
		{"ACKs of other QPs, other of 8 ports", acks(a, []uint32{1, portOther(1, 8)}, ack, ack), 8, 1},
		{"ACK, then another block's NAK", acks(a, []uint32{1, 17}, ack, reth.NAKSyndrome(0)), 0, 1},
		{"ACK, then another block's RNR NAK", acks(a, []uint32{1, 17}, ack, reth.RNRSyndrome(1)), 0, 1},
		{"ACK, then another block's data", func() []Message {
			p := acks(a, []uint32{1, 17}, ack, ack)
			p[1].Buf[0] = byte(bth.RCSendOnly)
			return p
		}(), 0, 1},
		{"already a run", func() []Message { p := msgs(1040, 1040); p[0].Seg = 520; return p }(), 0, 1},
		{"not adjacent", []Message{{Buf: slab[0:1040], Peer: a}, {Buf: slab[2000:3040], Peer: a}}, 0, 1},
		{"capacity ends", []Message{{Buf: slab[0:1040:1040], Peer: a}, {Buf: slab[1040:2080], Peer: a}}, 0, 1},
	}
	for _, c := range cases {
		if got := runLen(c.msgs, c.ports); got != c.want {
			t.Errorf("%s: run of %d, want %d", c.name, got, c.want)
		}
	}
}

// TestCoalesce checks Coalesce makes one Message per run, with Seg set
// for runs of more than one packet, and leaves no stale entries behind.
func TestCoalesce(t *testing.T) {
	slab := make([]byte, 8192)
	a := netip.MustParseAddrPort("127.0.0.1:4791")
	msgs := []Message{
		{Buf: slab[0:1056], Peer: a},            // FIRST, with the next as its last segment
		{Buf: slab[1056:2096], Peer: a},         // MIDDLE
		{Buf: slab[2096:3136], Peer: a},         // MIDDLE
		{Buf: slab[3136:3156], Peer: a},         // a short LAST ends the run
		{Buf: slab[3156:3176], Peer: a, TOS: 2}, // an ACK with another TOS
	}
	out := Coalesce(msgs, 8)
	want := []struct{ n, seg int }{{2096, 1056}, {1060, 1040}, {20, 0}}
	if len(out) != len(want) {
		t.Fatalf("%d messages, want %d: %+v", len(out), len(want), out)
	}
	for i, w := range want {
		if m := out[i]; len(m.Buf) != w.n || m.Seg != w.seg {
			t.Errorf("message %d: %d bytes, Seg %d; want %d, %d", i, len(m.Buf), m.Seg, w.n, w.seg)
		}
	}
	for i, m := range msgs[len(out):] {
		if m.Buf != nil {
			t.Errorf("entry %d past the result still holds a buffer", len(out)+i)
		}
	}
	if got := testing.AllocsPerRun(100, func() { Coalesce(msgs[:1], 8) }); got != 0 {
		t.Errorf("Coalesce allocates %v times", got)
	}
}

// acks returns back-to-back ACKNOWLEDGE packets with the given AETH
// syndromes, the i-th to QP qpns[i].
func acks(a netip.AddrPort, qpns []uint32, syn ...reth.Syndrome) []Message {
	const n = bth.Len + reth.AETHLen + bth.ICRCLen
	b := make([]byte, n*len(syn))
	var out []Message
	for i, s := range syn {
		p := b[i*n : (i+1)*n]
		bth.BTH(p).SetOpcode(bth.RCAck)
		bth.BTH(p).SetDestQP(qpns[i])
		p[bth.Len] = byte(s)
		out = append(out, Message{Buf: p, Peer: a})
	}
	return out
}

// portMate returns a QP number of another block than q's that leaves
// from q's port of ports (FlowPort); portOther one that leaves from
// another.
func portMate(q uint32, ports int) uint32  { return findQP(q, ports, true) }
func portOther(q uint32, ports int) uint32 { return findQP(q, ports, false) }

func findQP(q uint32, ports int, same bool) uint32 {
	for o := q + QPNBlock; ; o += QPNBlock {
		if (FlowPort(o, ports) == FlowPort(q, ports)) == same {
			return o
		}
	}
}

// blockMate returns another QP number of q's block that leaves from q's
// port of ports (same) or from another.
func blockMate(q uint32, ports int, same bool) uint32 {
	for o := q &^ (QPNBlock - 1); o <= q|(QPNBlock-1); o++ {
		if o != q && (FlowPort(o, ports) == FlowPort(q, ports)) == same {
			return o
		}
	}
	panic("no such QP in the block")
}

// otherQP returns two back-to-back packets, to QP 0 and to QP qpn.
func otherQP(a netip.AddrPort, qpn uint32) []Message {
	b := make([]byte, 2080)
	b[1040+5], b[1040+6], b[1040+7] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
	return []Message{{Buf: b[:1040], Peer: a}, {Buf: b[1040:], Peer: a}}
}
