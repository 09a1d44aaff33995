package ladder_test

import (
	"encoding/binary"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/app/ladder"
)

// FuzzLadder feeds arbitrary packet sequences (8 bytes each: direction
// and flags, opcode, PSN, syndrome, QP, time step) through the analysis
// and both renderers: whatever the packets, nothing panics and every
// packet lands in exactly one conversation.
func FuzzLadder(f *testing.F) {
	f.Add([]byte{0, 0x06, 0, 10, 0, 0x11, 0, 1, 0, 0x07, 0, 11, 0, 0x11, 0, 1, 1, 0x11, 0, 11, 0x60, 0x12, 0, 1, 0, 0x07, 0, 11, 0, 0x11, 0, 1})
	f.Add([]byte{0, 0x0c, 0, 20, 0, 0x11, 0, 1, 1, 0x0d, 0, 20, 0, 0x12, 0, 1, 1, 0x0f, 0, 22, 0, 0x12, 0, 1, 1, 0x0f, 0, 22, 0, 0x12, 0, 1})
	f.Add([]byte{2, 0x04, 0xff, 0xff, 0x21, 0x11, 0, 0, 5, 0x81, 0, 0, 0, 0x12, 0, 3, 0, 0x64, 0, 0, 0, 1, 0, 0})
	hosts := [2][4]byte{{198, 18, 0, 1}, {198, 18, 0, 2}}
	f.Fuzz(func(t *testing.T, data []byte) {
		b := ladder.NewBuilder()
		at := time.Unix(1700000000, 0)
		n := 0
		for ; len(data) >= 8 && n < 2000; data = data[8:] {
			d := data[0]
			at = at.Add(time.Duration(data[7]) * 10 * time.Microsecond)
			p := ladder.Packet{Frame: n + 1, Time: at, Opcode: bth.Opcode(data[1]), PSN: bth.PSN(binary.BigEndian.Uint16(data[2:4])),
				Syndrome: data[4], HasAETH: true, DestQP: uint32(data[5]), AckReq: d&2 != 0, ICRCOK: d&4 == 0, Len: int(data[6]) * 8,
				DMALen: uint32(data[6]) * 100, HasRETH: true, ECN: d >> 6}
			p.Src, p.Dst = netip.AddrFrom4(hosts[d&1]), netip.AddrFrom4(hosts[1-d&1])
			if d&8 != 0 {
				p.HasDETH, p.SrcQP = true, uint32(data[6])
			}
			if p.Opcode.Info() == nil || d&16 != 0 {
				p = ladder.Packet{Frame: n + 1, Time: at, Src: p.Src, Dst: p.Dst, Err: "malformed"}
			}
			b.AddPacket(p)
			n++
		}
		tr := b.Finish()
		tr.Annotate(at.Add(-time.Millisecond), nil, "note")
		events := 0
		for _, c := range tr.Conversations {
			for _, e := range c.Events {
				if e.Pkt != nil {
					events++
				}
			}
			c.Rows(ladder.RowOptions{MaxRows: 10})
		}
		if events != n || tr.Packets != n {
			t.Fatalf("%d packets in, %d in conversations", n, events)
		}
		if err := ladder.WriteText(io.Discard, tr, ladder.TextOptions{RowOptions: ladder.RowOptions{MaxRows: 7}, Width: 1}); err != nil {
			t.Fatal(err)
		}
		if err := ladder.WriteHTML(io.Discard, tr, ladder.HTMLOptions{MaxTicks: 3}); err != nil {
			t.Fatal(err)
		}
	})
}
