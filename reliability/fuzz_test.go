package reliability_test

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/transport"
)

// fuzzRig is a live endpoint on an in-memory network (no sockets, so the
// fuzzing workers run side by side), with its peer and a stranger to send
// from.
type fuzzRig struct {
	g        *target
	peer     transport.Conn
	stranger transport.Conn
	ro       *rxego.MR // registered for remote READ only
	roBuf    []byte
	roOrig   []byte
}

func newFuzzRig(t testing.TB) *fuzzRig {
	t.Helper()
	net := transport.NewPipeNetwork()
	ap := func(s string) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(s), transport.Port) }
	listen := func(a netip.AddrPort) transport.Conn {
		c, err := net.Listen(a, transport.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	r := &fuzzRig{peer: listen(ap("198.18.7.2")), stranger: listen(ap("198.18.7.3"))}
	r.g = newTarget(t, listen(ap("198.18.7.1")), r.peer.LocalAddr())
	pd := r.g.rc.PD()
	r.roBuf = make([]byte, 4096)
	pattern(r.roBuf, 0x77)
	r.roOrig = append([]byte(nil), r.roBuf...)
	var err error
	if r.ro, err = pd.RegMR(r.roBuf, rxego.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	r.g.dev.Sync()
	return r
}

// rearm puts the connected QPs back in RTS expecting rcPSN, with one
// receive posted on each QP that takes receives: every input meets the
// same endpoint.
func (r *fuzzRig) rearm(t *testing.T) {
	g := r.g
	for _, q := range []*rxego.QP{g.rc, g.uc} {
		if err := q.Modify(&rxego.QPAttr{State: rxego.StateReset}, rxego.AttrState); err != nil {
			t.Fatal(err)
		}
		if err := q.Connect(rxego.RemoteQP{Addr: r.peer.LocalAddr(), QPN: 0x99, PSN: rcPSN}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []*rxego.QP{g.rc, g.uc, g.ud} {
		if err := q.PostRecv(rxego.RecvWR{ID: 7, SGL: []rxego.SGE{{Addr: g.mr.IOVA(), Length: 8192, LKey: g.mr.LKey()}}}); err != nil &&
			!errors.Is(err, rxego.ErrQueueFull) {
			t.Fatal(err)
		}
	}
	wcs := make([]rxego.WC, 64)
	for n, _ := g.cq.Poll(wcs); n > 0; n, _ = g.cq.Poll(wcs) {
	}
}

// fuzzSeeds are valid packets of every kind the endpoint serves, aimed at
// the QP the control byte names.
func fuzzSeeds(r *fuzzRig) [][]byte {
	g := r.g
	pl := bytes.Repeat([]byte{0x5a}, 64)
	h := func(op bth.Opcode) bth.Header {
		return bth.Header{Opcode: op, PKey: bth.DefaultPKey, PSN: rcPSN, AckReq: true}
	}
	reth := bth.RETHFields{VA: g.mr.IOVA() + 128, RKey: g.mr.RKey(), DMALen: 64}
	type seed struct {
		ctl     byte // low two bits: 0 RC, 1 UC, 2 UD, 3 RC in INIT; 4: from the stranger
		hdr     bth.Header
		payload []byte
	}
	var seeds []seed
	add := func(ctl byte, hd bth.Header, payload []byte) { seeds = append(seeds, seed{ctl, hd, payload}) }
	add(0, h(bth.RCSendOnly), pl)
	add(0, h(bth.RCSendFirst), bytes.Repeat([]byte{1}, 1024))
	w := h(bth.RCWriteOnly)
	w.RETH = reth
	add(0, w, pl)
	rd := h(bth.RCReadRequest)
	rd.RETH = bth.RETHFields{VA: r.ro.IOVA(), RKey: r.ro.RKey(), DMALen: 4096}
	add(0, rd, nil)
	for _, op := range []bth.Opcode{bth.RCCompareSwap, bth.RCFetchAdd} {
		a := h(op)
		a.Atomic = bth.AtomicFields{VA: g.mr.IOVA() + 64&^7, RKey: g.mr.RKey(), SwapAdd: 1}
		add(0, a, nil)
	}
	aw := h(bth.RCAtomicWrite)
	aw.RETH = bth.RETHFields{VA: g.mr.IOVA() + 64&^7, RKey: g.mr.RKey(), DMALen: 8}
	add(0, aw, pl[:8])
	add(0, h(bth.RCAck), nil)
	add(1, h(bth.UCSendOnly), pl)
	uw := h(bth.UCWriteOnly)
	uw.RETH = reth
	add(1, uw, pl)
	ud := h(bth.UDSendOnly)
	ud.DETH = bth.DETHFields{QKey: targetQKey, SrcQP: 5}
	add(2, ud, pl)
	add(3, h(bth.RCSendOnly), pl)
	add(4, h(bth.RCSendOnly), pl)
	add(0, bth.Header{Opcode: bth.CNPOpcode, PKey: bth.DefaultPKey, BECN: true}, nil)
	var out [][]byte
	for _, s := range seeds {
		buf := make([]byte, bth.PacketLen(s.hdr.Opcode, len(s.payload)))
		n, err := s.hdr.Encode(buf, s.payload)
		if err != nil {
			panic(err)
		}
		out = append(out, append([]byte{s.ctl}, buf[:n]...))
	}
	return out
}

// FuzzLiveEndpoint feeds arbitrary datagrams to a live endpoint with an
// RC, a UC, a UD QP and an RC QP in INIT. The first byte picks the target
// QP (its number is written into the BTH) and whether the datagram comes
// from the connected peer or a stranger; the rest is the datagram, whose
// ICRC the network fills in so that it reaches the engine. Every datagram
// must be dropped by the transport or handed to the engine (never lost
// uncounted), nothing may panic, and the MR registered for remote READ
// only must never change.
func FuzzLiveEndpoint(f *testing.F) {
	rig := newFuzzRig(f)
	for _, s := range fuzzSeeds(rig) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 1+16 || len(data) > 1+9000 {
			return
		}
		r := rig
		g := r.g
		r.rearm(t)
		ctl, pkt := data[0], append([]byte(nil), data[1:]...)
		qpn := []uint32{g.rc.Num(), g.uc.Num(), g.ud.Num(), g.rq.Num()}[ctl&3]
		pkt[5], pkt[6], pkt[7] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
		from := r.peer
		if ctl&4 != 0 {
			from = r.stranger
		}
		seen := func() uint64 {
			return g.dev.Stats().RcvdPkts + g.dev.Transport().Stats().Dropped()
		}
		before := seen()
		if _, err := from.Send([]transport.Message{{Buf: pkt, Peer: g.dev.Addr()}}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for seen() == before {
			if time.Now().After(deadline) {
				t.Fatalf("datagram neither dropped by the transport nor received by the engine")
			}
			time.Sleep(10 * time.Microsecond)
		}
		if got := seen() - before; got != 1 {
			t.Fatalf("one datagram counted %d times", got)
		}
		g.dev.Sync() // the engine has finished with it
		if !bytes.Equal(r.roBuf, r.roOrig) {
			t.Fatalf("read-only MR changed at byte %d", firstDiff(r.roBuf, r.roOrig))
		}
	})
}
