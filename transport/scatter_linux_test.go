package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
)

// dataPacket returns an RC RDMA WRITE packet of op (First or Only carry
// a RETH, Middle and Last do not) with a payload of n bytes derived from
// psn, padded to four bytes, and a zero ICRC placeholder.
func dataPacket(op bth.Opcode, n int, psn uint32) []byte {
	in := op.Info()
	pad := bth.PadFor(n)
	b := make([]byte, in.HdrLen+n+pad+4)
	h := bth.BTH(b)
	h.SetOpcode(op)
	h.SetFlags(false, false, pad, 0)
	h.SetPKey(0xffff)
	h.SetDestQP(0x11)
	h.SetPSN(bth.PSN(psn))
	if in.HdrLen > bth.Len {
		binary.BigEndian.PutUint32(b[bth.Len+8:], 0x1234) // RETH rkey
	}
	for i := range n {
		b[in.HdrLen+i] = byte(int(psn)*7 + i)
	}
	return b
}

// scatter splits whole packets, laid out as one message, into a
// scattered message's Buf and Payload. The slices it returns are each
// one allocation, so consecutive pieces are adjacent.
func scatter(pkts [][]byte) (buf, payload []byte) {
	buf, payload = []byte{}, []byte{}
	for _, p := range pkts {
		h := bth.BTH(p).Opcode().Info().HdrLen
		t := bth.BTH(p).PadCount() + 4
		buf = append(append(buf, p[:h]...), p[len(p)-t:]...)
		payload = append(payload, p[h:len(p)-t]...)
	}
	return buf, payload
}

// writeRun returns the k packets of a WRITE of n bytes at the given MTU.
func writeRun(n, mtu int) [][]byte {
	var pkts [][]byte
	for off, psn := 0, uint32(0); off < n || psn == 0; psn++ {
		k := min(mtu, n-off)
		first, last := off == 0, off+k == n
		op := bth.RCWriteMiddle
		switch {
		case first && last:
			op = bth.RCWriteOnly
		case first:
			op = bth.RCWriteFirst
		case last:
			op = bth.RCWriteLast
		}
		pkts = append(pkts, dataPacket(op, k, psn))
		off += k
	}
	return pkts
}

// TestScatteredSameBytes sends the same packets whole and scattered, one
// per message and coalesced into GSO runs, over IPv4 and IPv6, with GSO
// on and off: the receiver must get identical bytes and IP IDs (so
// identical ICRCs), and the ICRCs Send wrote into the scattered
// trailers must be the whole packets'.
func TestScatteredSameBytes(t *testing.T) {
	fams := []struct{ name, a, b string }{{"v4", "127.0.0.1", "127.0.0.2"}, {"v6", "::1", "::1"}}
	for _, fam := range fams {
		if fam.name == "v6" && !hasIPv6Loopback() {
			continue
		}
		for _, oc := range offloadCases {
			for _, mtu := range []int{1024, 4096} {
				for _, n := range []int{1, 513, mtu, 3*mtu + 2, 14 * mtu / 2} {
					a := listenAny(t, fam.a, oc.opts)
					b := listenAny(t, fam.b, oc.opts)
					pkts := writeRun(n, mtu)
					// Middle packets are shorter than a First (no RETH):
					// send the run's tail after the first packet as one
					// coalesced run, as the engine's slab would.
					// Each packet is a message, laid out as the engine's
					// slab does (back to back), so that Coalesce makes the
					// same runs of both.
					var whole, scat []Message
					all := bytes.Join(pkts, nil)
					sbuf, spay := scatter(pkts)
					for _, p := range pkts {
						h := bth.BTH(p).Opcode().Info().HdrLen
						tl := bth.BTH(p).PadCount() + 4
						pl := len(p) - h - tl
						whole = append(whole, Message{Buf: all[:len(p)], Peer: b.LocalAddr()})
						scat = append(scat, Message{Buf: sbuf[:h+tl], Payload: spay[:pl], Peer: b.LocalAddr()})
						all, sbuf, spay = all[len(p):], sbuf[h+tl:], spay[pl:]
					}
					name := fam.name + "/" + oc.name
					cw := Coalesce(append([]Message(nil), whole...), 0)
					cs := Coalesce(scat, 0)
					if len(cw) != len(cs) {
						t.Fatalf("%s mtu %d n %d: coalesced into %d whole and %d scattered messages", name, mtu, n, len(cw), len(cs))
					}
					got := [2][]Message{}
					var gsoSends [2]uint64
					for i, msgs := range [][]Message{cw, cs} {
						if k, err := a.Send(msgs); k != len(msgs) || err != nil {
							t.Fatalf("%s mtu %d n %d: Send = %d, %v", name, mtu, n, k, err)
						}
						got[i] = recvN(t, b, len(pkts), 10*time.Second)
						gsoSends[i] = a.Stats().GSOSends
					}
					for j := range pkts {
						w, s := got[0][j], got[1][j]
						if !bytes.Equal(w.Buf, s.Buf) || w.IPID != s.IPID {
							t.Fatalf("%s mtu %d n %d packet %d: scattered %d bytes ID %d, whole %d bytes ID %d", name, mtu, n, j, len(s.Buf), s.IPID, len(w.Buf), w.IPID)
						}
						if !samePayload(s.Buf, pkts[j]) {
							t.Fatalf("%s mtu %d n %d packet %d: bytes differ from what was built", name, mtu, n, j)
						}
					}
					if !oc.opts.NoGSO && len(pkts) > 2 && (gsoSends[0] == 0 || gsoSends[1] != 2*gsoSends[0]) {
						t.Fatalf("%s mtu %d n %d: GSO sends %d whole, %d in all: the scattered runs were not sent as the whole ones", name, mtu, n, gsoSends[0], gsoSends[1])
					}
					// The trailers of the scattered messages now carry the
					// ICRCs the whole packets were given.
					g, err := cs[len(cs)-1].Gather(nil)
					if err != nil {
						t.Fatal(err)
					}
					last := cw[len(cw)-1].Buf
					if !bytes.Equal(g, last) {
						t.Fatalf("%s mtu %d n %d: gathered scattered message differs from the whole one after Send", name, mtu, n)
					}
					a.Close()
					b.Close()
				}
			}
		}
	}
}

// TestScatteredErrors checks that a scattered message whose Buf and
// Payload do not split as its BTHs say is refused before anything of it
// is sent, and that Coalesce never merges scattered and whole messages.
func TestScatteredErrors(t *testing.T) {
	a := listenAny(t, "127.0.0.1", Options{})
	b := listenAny(t, "127.0.0.2", Options{})
	p := dataPacket(bth.RCWriteOnly, 2000, 1)
	buf, pay := scatter([][]byte{p})
	bad := []Message{
		{Buf: buf[:20], Payload: pay, Peer: b.LocalAddr()},                                         // trailer cut off
		{Buf: buf, Payload: pay, Peer: b.LocalAddr(), Seg: 1000},                                   // segments cut the payload
		{Buf: append([]byte{0xff}, buf[1:]...), Payload: pay, Peer: b.LocalAddr()},                 // unknown opcode
		{Buf: buf, Payload: make([]byte, 70000), Peer: b.LocalAddr()},                              // longer than a datagram
		{Buf: buf[:8], Payload: append(append([]byte{}, buf[8:]...), pay...), Peer: b.LocalAddr()}, // header cut short
	}
	for i := range bad {
		if n, err := a.Send(bad[i : i+1]); n != 0 || err == nil {
			t.Errorf("bad message %d: Send = %d, %v", i, n, err)
		} else if i < 3 && !errors.Is(err, ErrScattered) {
			t.Errorf("bad message %d: %v, want ErrScattered", i, err)
		}
	}
	if s := a.Stats(); s.SentPackets != 0 {
		t.Errorf("%d packets sent from bad messages", s.SentPackets)
	}
	// Two packets adjacent in memory, one scattered: two messages.
	run := append(dataPacket(bth.RCSendMiddle, 1024, 2), dataPacket(bth.RCSendMiddle, 1024, 3)...)
	msgs := []Message{{Buf: run[:1040], Peer: b.LocalAddr()}, {Buf: run[1040:1052], Payload: run[1052:2076], Peer: b.LocalAddr()}}
	if got := Coalesce(msgs, 0); len(got) != 2 {
		t.Errorf("a whole and a scattered message coalesced into %d", len(got))
	}
}

// TestScatteredNoAllocs checks that scattered sends, GSO runs and single
// packets, with a Tap installed, allocate nothing once warm.
func TestScatteredNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, oc := range offloadCases {
		t.Run(oc.name, func(t *testing.T) {
			a := listenAny(t, "127.0.0.1", oc.opts)
			b := listenAny(t, "127.0.0.2", oc.opts)
			tap := &countTap{}
			a.SetTap(tap)
			pkts := writeRun(8*1024, 1024)
			buf, pay := scatter(pkts[1:])
			first, firstPay := scatter(pkts[:1])
			msgs := []Message{
				{Buf: first, Payload: firstPay, Peer: b.LocalAddr()},
				{Buf: buf, Payload: pay, Peer: b.LocalAddr(), Seg: len(pkts[1])},
			}
			rmsgs := make([]Message, 64)
			timer := time.AfterFunc(20*time.Second, func() { b.Close() }) // never hang
			defer timer.Stop()
			round := func() {
				if k, err := a.Send(msgs); k != len(msgs) || err != nil {
					t.Fatalf("Send = %d, %v", k, err)
				}
				for got := 0; got < len(pkts); {
					k, err := b.Recv(rmsgs)
					if err != nil {
						t.Fatalf("Recv: %v", err)
					}
					got += k
				}
			}
			round()
			if allocs := testing.AllocsPerRun(50, round); allocs != 0 {
				t.Errorf("%v allocations per round of %d packets", allocs, len(pkts))
			}
			if tap.n.Load() == 0 {
				t.Error("tap not called")
			}
		})
	}
}

// TestPipeScattered checks that a pipe delivers a scattered GSO run as
// the same packets, ICRCs included, as the run sent whole.
func TestPipeScattered(t *testing.T) {
	n := NewPipeNetwork()
	a, b := pipePair(t, n, "10.0.0.1:4791", "10.0.0.2:4791")
	pkts := writeRun(5*1024+3, 1024)[1:] // Middle and Last: one run
	sbuf, spay := scatter(pkts)
	for _, msgs := range [][]Message{
		{{Buf: bytes.Join(pkts, nil), Peer: b.LocalAddr(), Seg: len(pkts[0])}},
		{{Buf: sbuf, Payload: spay, Peer: b.LocalAddr(), Seg: len(pkts[0])}},
	} {
		if k, err := a.Send(msgs); k != 1 || err != nil {
			t.Fatalf("Send = %d, %v", k, err)
		}
	}
	got := recvN(t, b, 2*len(pkts), 5*time.Second)
	for i := range pkts {
		w, s := got[i], got[len(pkts)+i]
		if !bytes.Equal(w.Buf, s.Buf) || w.IPID != s.IPID || !samePayload(s.Buf, pkts[i]) {
			t.Fatalf("packet %d: scattered %d bytes ID %d, whole %d bytes ID %d", i, len(s.Buf), s.IPID, len(w.Buf), w.IPID)
		}
	}
}
