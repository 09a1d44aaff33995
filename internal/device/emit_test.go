package device

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// TestEmitSendsRuns checks a shard's Emit hands the transport one Message
// per run the engine built back to back (transport.Coalesce), with Seg set
// for runs of more than one packet.
func TestEmitSendsRuns(t *testing.T) {
	rec := &recordConn{}
	s := &shard{conn: rec, sendMu: new(sync.Mutex)}
	slab := make([]byte, 8192)
	a := netip.MustParseAddrPort("127.0.0.1:4791")
	pkts := []qp.OutPacket{
		{Buf: slab[0:1056], Dest: a},            // FIRST, with the next as its last segment
		{Buf: slab[1056:2096], Dest: a},         // MIDDLE
		{Buf: slab[2096:3136], Dest: a},         // MIDDLE
		{Buf: slab[3136:3156], Dest: a},         // a short LAST ends the run
		{Buf: slab[3156:3176], Dest: a, TOS: 2}, // an ACK with another TOS
	}
	(*shardOut)(s).Emit(pkts)
	want := []struct{ n, seg int }{{2096, 1056}, {1060, 1040}, {20, 0}}
	if len(rec.msgs) != len(want) {
		t.Fatalf("%d messages, want %d: %+v", len(rec.msgs), len(want), rec.msgs)
	}
	for i, w := range want {
		if m := rec.msgs[i]; len(m.Buf) != w.n || m.Seg != w.seg {
			t.Errorf("message %d: %d bytes, Seg %d; want %d, %d", i, len(m.Buf), m.Seg, w.n, w.seg)
		}
	}
	if len(s.msgs) != 0 && s.msgs[0].Buf != nil {
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
