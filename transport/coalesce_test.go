package transport

import (
	"net/netip"
	"testing"
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
	cases := []struct {
		name string
		msgs []Message
		want int
	}{
		{"one", msgs(100), 1},
		{"equal", msgs(1040, 1040, 1040), 3},
		{"shorter last", msgs(1040, 1040, 500), 3},
		{"shorter then equal", msgs(1040, 500, 1040), 2},
		{"longer second (RETH on FIRST is the other way)", msgs(1040, 1056), 1},
		// A FIRST (with its RETH) takes the next packet along as its
		// shorter last segment; the MIDDLEs after it start a new run.
		{"FIRST then MIDDLEs", msgs(1056, 1040, 1040), 2},
		{"segment limit", msgs(rep(100, 70)...), MaxSegments},
		{"byte limit", msgs(rep(4112, 20)...), 15},
		{"other peer", func() []Message { p := msgs(1040, 1040); p[1].Peer = b; return p }(), 1},
		{"other TOS", func() []Message { p := msgs(1040, 1040); p[1].TOS = 2; return p }(), 1},
		// Another QP's packets may go to another of the peer's sockets:
		// never in one GSO datagram (Coalesce), whatever their ports.
		{"other QP", otherQP(a, 1), 1},
		{"other QP, same of 8 source ports", otherQP(a, 8), 1},
		{"other QP, differing in the QP number's high byte", otherQP(a, 1<<16), 1},
		{"already a run", func() []Message { p := msgs(1040, 1040); p[0].Seg = 520; return p }(), 1},
		{"not adjacent", []Message{{Buf: slab[0:1040], Peer: a}, {Buf: slab[2000:3040], Peer: a}}, 1},
		{"capacity ends", []Message{{Buf: slab[0:1040:1040], Peer: a}, {Buf: slab[1040:2080], Peer: a}}, 1},
	}
	for _, c := range cases {
		if got := runLen(c.msgs); got != c.want {
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
	out := Coalesce(msgs)
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
	if got := testing.AllocsPerRun(100, func() { Coalesce(msgs[:1]) }); got != 0 {
		t.Errorf("Coalesce allocates %v times", got)
	}
}

// otherQP returns two back-to-back packets, to QP 0 and to QP qpn.
func otherQP(a netip.AddrPort, qpn uint32) []Message {
	b := make([]byte, 2080)
	b[1040+5], b[1040+6], b[1040+7] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
	return []Message{{Buf: b[:1040], Peer: a}, {Buf: b[1040:], Peer: a}}
}
