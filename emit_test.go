package rxego

import (
	"net/netip"
	"testing"

	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// TestRunLen checks how Emit groups the engine's packets into GSO runs:
// adjacent in memory, same peer and TOS, equal length but a shorter last,
// at most 64 packets and one IPv4 datagram's worth of bytes.
func TestRunLen(t *testing.T) {
	a := netip.MustParseAddrPort("127.0.0.1:4791")
	b := netip.MustParseAddrPort("127.0.0.2:4791")
	slab := make([]byte, 1<<20)
	// pkts lays out packets of the given lengths back to back in slab.
	pkts := func(lens ...int) []qp.OutPacket {
		var out []qp.OutPacket
		off := 0
		for _, n := range lens {
			out = append(out, qp.OutPacket{Buf: slab[off : off+n], Dest: a})
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
		pkts []qp.OutPacket
		max  int
		want int
	}{
		{"one", pkts(100), 64, 1},
		{"equal", pkts(1040, 1040, 1040), 64, 3},
		{"shorter last", pkts(1040, 1040, 500), 64, 3},
		{"shorter then equal", pkts(1040, 500, 1040), 64, 2},
		{"longer second (RETH on FIRST is the other way)", pkts(1040, 1056), 64, 1},
		// A FIRST (with its RETH) takes the next packet along as its
		// shorter last segment; the MIDDLEs after it start a new run.
		{"FIRST then MIDDLEs", pkts(1056, 1040, 1040), 64, 2},
		{"segment limit", pkts(rep(100, 70)...), 64, 64},
		{"byte limit", pkts(rep(4112, 20)...), 64, 15},
		{"no GSO", pkts(1040, 1040), 1, 1},
		{"other peer", func() []qp.OutPacket { p := pkts(1040, 1040); p[1].Dest = b; return p }(), 64, 1},
		{"other TOS", func() []qp.OutPacket { p := pkts(1040, 1040); p[1].TOS = 2; return p }(), 64, 1},
		{"not adjacent", []qp.OutPacket{{Buf: slab[0:1040], Dest: a}, {Buf: slab[2000:3040], Dest: a}}, 64, 1},
		{"capacity ends", []qp.OutPacket{{Buf: slab[0:1040:1040], Dest: a}, {Buf: slab[1040:2080], Dest: a}}, 64, 1},
	}
	for _, c := range cases {
		if got := runLen(c.pkts, c.max); got != c.want {
			t.Errorf("%s: run of %d, want %d", c.name, got, c.want)
		}
	}
}

// TestEmitSendsRuns checks Emit hands the transport one Message per run,
// with Seg set for runs of more than one packet.
func TestEmitSendsRuns(t *testing.T) {
	rec := &recordConn{}
	d := &Device{conn: rec, eng: nil}
	slab := make([]byte, 8192)
	a := netip.MustParseAddrPort("127.0.0.1:4791")
	pkts := []qp.OutPacket{
		{Buf: slab[0:1056], Dest: a},            // FIRST, with the next as its last segment
		{Buf: slab[1056:2096], Dest: a},         // MIDDLE
		{Buf: slab[2096:3136], Dest: a},         // MIDDLE
		{Buf: slab[3136:3156], Dest: a},         // a short LAST ends the run
		{Buf: slab[3156:3176], Dest: a, TOS: 2}, // an ACK with another TOS
	}
	(*deviceOut)(d).Emit(pkts)
	want := []struct{ n, seg int }{{2096, 1056}, {1060, 1040}, {20, 0}}
	if len(rec.msgs) != len(want) {
		t.Fatalf("%d messages, want %d: %+v", len(rec.msgs), len(want), rec.msgs)
	}
	for i, w := range want {
		if m := rec.msgs[i]; len(m.Buf) != w.n || m.Seg != w.seg {
			t.Errorf("message %d: %d bytes, Seg %d; want %d, %d", i, len(m.Buf), m.Seg, w.n, w.seg)
		}
	}
	if len(d.msgs) != 0 && d.msgs[0].Buf != nil {
		t.Error("Emit kept references to the engine's buffers")
	}
}

// recordConn is a transport.Conn that records what it is asked to send.
type recordConn struct {
	transport.Conn
	msgs []transport.Message
}

func (r *recordConn) Send(msgs []transport.Message) (int, error) {
	for _, m := range msgs {
		r.msgs = append(r.msgs, transport.Message{Buf: append([]byte(nil), m.Buf...), Peer: m.Peer, TOS: m.TOS, Seg: m.Seg})
	}
	return len(msgs), nil
}
