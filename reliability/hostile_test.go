package reliability_test

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// target is a live endpoint with one QP of each kind a hostile packet may
// aim at: an RC and a UC QP connected to peer, a UD QP, and an RC QP still
// in INIT. Its memory is one remote-writable MR.
type target struct {
	dev            *rxego.Device
	rc, uc, ud, rq *rxego.QP // rq: the RC QP in INIT
	mr             *rxego.MR
	buf, orig      []byte
	cq             *rxego.CQ
}

const (
	targetQKey = 0x11111111
	rcPSN      = 0x100 // the PSN the RC and UC QPs expect first
)

func newTarget(t testing.TB, c transport.Conn, peer netip.AddrPort) *target {
	t.Helper()
	dev, err := rxego.Open(c.LocalAddr().String(), &rxego.Options{Conn: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	g := &target{dev: dev, buf: make([]byte, 64<<10)}
	pattern(g.buf, 9)
	g.orig = append([]byte(nil), g.buf...)
	pd, _ := dev.AllocPD()
	if g.mr, err = pd.RegMR(g.buf, allAccess); err != nil {
		t.Fatal(err)
	}
	g.cq, _ = dev.CreateCQ(1024)
	mk := func(typ rxego.QPType) *rxego.QP {
		q, err := pd.CreateQP(rxego.QPInitAttr{Type: typ, SendCQ: g.cq, RecvCQ: g.cq, Caps: rxego.Caps{MaxSendWR: 16, MaxRecvWR: 16}})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	g.rc, g.uc, g.ud, g.rq = mk(rxego.RC), mk(rxego.UC), mk(rxego.UD), mk(rxego.RC)
	for _, q := range []*rxego.QP{g.rc, g.uc} {
		if err := q.Connect(rxego.RemoteQP{Addr: peer, QPN: 0x99, PSN: rcPSN}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.ud.ActivateUD(targetQKey, 0); err != nil {
		t.Fatal(err)
	}
	if err := g.rq.Init(0); err != nil {
		t.Fatal(err)
	}
	// Receives for the UD and UC QPs: a hostile packet must not get far
	// enough to consume them.
	for _, q := range []*rxego.QP{g.ud, g.uc, g.rq} {
		if err := q.PostRecv(rxego.RecvWR{ID: 7, SGL: []rxego.SGE{{Addr: g.mr.IOVA(), Length: 8192, LKey: g.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	dev.Sync()
	return g
}

// hostile is one class of bad input, sent count times.
type hostile struct {
	name     string
	stranger bool                   // sent from an address no QP is connected to
	raw      bool                   // sent from a plain UDP socket, ICRC as built
	reason   string                 // the counter that must count each one
	build    func(g *target) []byte // one datagram (RoCE packet, ICRC placeholder)
	// freshPSN gives each copy the UC QP's next PSN (from rcPSN on), as
	// a live UC peer's stream would carry: a UC responder drops a PSN it has just
	// passed as a duplicate, before any other check.
	freshPSN bool
}

// encode builds a packet from h and payload, failing the test on error.
func encode(t testing.TB, h bth.Header, payload []byte) []byte {
	t.Helper()
	buf := make([]byte, bth.PacketLen(h.Opcode, len(payload))+16)
	n, err := h.Encode(buf, payload)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// TestHostileInput sends each class of bad datagram 1,000 times to a live
// endpoint and checks that every one is dropped and counted under its own
// reason, that nothing is written, completed or sent in reply, and that the
// QPs stay in their states.
func TestHostileInput(t *testing.T) {
	const count = 1000
	addrT, addrP := nextLoopback()
	addrX, _ := nextLoopback() // the stranger
	peer := listen(t, addrP, transport.Options{})
	defer peer.Close()
	stranger := listen(t, addrX, transport.Options{})
	defer stranger.Close()
	g := newTarget(t, listen(t, addrT, transport.Options{}), peer.LocalAddr())
	payload := bytes.Repeat([]byte{0xEE}, 64)
	rcSend := func(g *target) bth.Header {
		return bth.Header{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: g.rc.Num(), PSN: rcPSN, AckReq: true}
	}
	classes := []hostile{
		{name: "shorter than BTH+ICRC", raw: true, reason: "transport/short", build: func(*target) []byte { return []byte{1, 2, 3, 4, 5, 6, 7, 8} }},
		{name: "unknown opcode", reason: "transport/not_roce", build: func(g *target) []byte {
			b := encode(t, rcSend(g), payload)
			b[0] = 0x1f // reserved RC opcode
			return b
		}},
		{name: "bad ICRC", raw: true, reason: "transport/bad_icrc", build: func(g *target) []byte {
			b := encode(t, rcSend(g), payload)
			copy(b[len(b)-4:], []byte{0xde, 0xad, 0xbe, 0xef})
			return b
		}},
		{name: "bad P_Key", reason: "bad_pkey", build: func(g *target) []byte {
			h := rcSend(g)
			h.PKey = 0x1234
			return encode(t, h, payload)
		}},
		{name: "unknown QP", reason: "unknown_qp", build: func(g *target) []byte {
			h := rcSend(g)
			h.DestQP = 0xabcdef
			return encode(t, h, payload)
		}},
		{name: "connected QP, stranger's address", stranger: true, reason: "wrong_source", build: func(g *target) []byte {
			return encode(t, rcSend(g), payload)
		}},
		{name: "CNP from a stranger", stranger: true, reason: "wrong_source", build: func(g *target) []byte {
			return encode(t, bth.Header{Opcode: bth.CNPOpcode, PKey: bth.DefaultPKey, DestQP: g.rc.Num(), BECN: true}, nil)
		}},
		{name: "UD opcode to an RC QP", reason: "wrong_opcode", build: func(g *target) []byte {
			return encode(t, bth.Header{Opcode: bth.UDSendOnly, PKey: bth.DefaultPKey, DestQP: g.rc.Num(),
				DETH: bth.DETHFields{QKey: targetQKey, SrcQP: 5}}, payload)
		}},
		{name: "RC opcode to a UD QP", reason: "wrong_opcode", build: func(g *target) []byte {
			h := rcSend(g)
			h.DestQP = g.ud.Num()
			return encode(t, h, payload)
		}},
		{name: "wrong Q_Key", reason: "bad_qkey", build: func(g *target) []byte {
			return encode(t, bth.Header{Opcode: bth.UDSendOnly, PKey: bth.DefaultPKey, DestQP: g.ud.Num(),
				DETH: bth.DETHFields{QKey: targetQKey + 1, SrcQP: 5}}, payload)
		}},
		{name: "UD payload over the MTU", reason: "bad_length", build: func(g *target) []byte {
			return encode(t, bth.Header{Opcode: bth.UDSendOnly, PKey: bth.DefaultPKey, DestQP: g.ud.Num(),
				DETH: bth.DETHFields{QKey: targetQKey, SrcQP: 5}}, make([]byte, 4100))
		}},
		{name: "request to a QP in INIT", reason: "bad_state", build: func(g *target) []byte {
			h := rcSend(g)
			h.DestQP = g.rq.Num()
			return encode(t, h, payload)
		}},
		{name: "ACK for nothing outstanding", reason: "stale_response", build: func(g *target) []byte {
			return encode(t, bth.Header{Opcode: bth.RCAck, PKey: bth.DefaultPKey, DestQP: g.rc.Num(), PSN: 0x5555}, nil)
		}},
		{name: "UC WRITE, bad rkey", reason: "bad_access", freshPSN: true, build: func(g *target) []byte {
			return encode(t, bth.Header{Opcode: bth.UCWriteOnly, PKey: bth.DefaultPKey, DestQP: g.uc.Num(), PSN: rcPSN,
				RETH: bth.RETHFields{VA: g.mr.IOVA(), RKey: g.mr.RKey() ^ 0x55, DMALen: 64}}, payload)
		}},
		{name: "UC WRITE, out of bounds", reason: "out_of_bounds", freshPSN: true, build: func(g *target) []byte {
			return encode(t, bth.Header{Opcode: bth.UCWriteOnly, PKey: bth.DefaultPKey, DestQP: g.uc.Num(), PSN: rcPSN,
				RETH: bth.RETHFields{VA: g.mr.IOVA() + uint64(len(g.buf)) - 32, RKey: g.mr.RKey(), DMALen: 64}}, payload)
		}},
	}
	counter := func(name string) uint64 {
		ts := g.dev.Transport().Stats()
		for r := transport.DropReason(0); r < transport.NumDropReasons; r++ {
			if "transport/"+r.String() == name {
				return ts.Drops[r]
			}
		}
		for _, r := range qp.DropReasons() {
			if r.String() == name {
				return g.dev.Stats().Drops[r]
			}
		}
		t.Fatalf("no counter %q", name)
		return 0
	}
	rawFrom := func(from netip.AddrPort) *net.UDPConn {
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from.Addr(), 0)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	raw := rawFrom(peer.LocalAddr())
	sentBefore := g.dev.Stats().SentPkts
	ucPSN := bth.PSN(rcPSN)
	for _, h := range classes {
		before := counter(h.reason)
		pkt := h.build(g)
		for i := range count {
			if h.freshPSN {
				bth.BTH(pkt).SetPSN(ucPSN)
				ucPSN = ucPSN.Next()
			}
			switch {
			case h.raw:
				if _, err := raw.WriteToUDPAddrPort(pkt, g.dev.Addr()); err != nil {
					t.Fatal(err)
				}
			default:
				from := peer
				if h.stranger {
					from = stranger
				}
				if _, err := from.Send([]transport.Message{{Buf: pkt, Peer: g.dev.Addr()}}); err != nil {
					t.Fatalf("%s: %v", h.name, err)
				}
			}
			// 50 at a time, so a busy machine's socket buffer never
			// overflows: a datagram the kernel drops is not the endpoint's.
			if i%50 == 49 {
				waitFor(t, 10*time.Second, h.name, func() bool { return counter(h.reason)-before >= uint64(i+1) })
			}
		}
		got := counter(h.reason) - before
		t.Logf("%-35s %5d sent, %5d counted as %s", h.name, count, got, h.reason)
		if got != count {
			t.Errorf("%s: %d of %d counted as %s; engine: %s", h.name, got, count, h.reason, engineStats(g.dev))
		}
	}
	g.dev.Sync()
	if !bytes.Equal(g.buf, g.orig) {
		t.Errorf("registered memory changed at byte %d", firstDiff(g.buf, g.orig))
	}
	if n := g.cq.Len(); n != 0 {
		t.Errorf("%d completions from hostile input", n)
	}
	if n := g.dev.Stats().SentPkts - sentBefore; n != 0 {
		t.Errorf("the endpoint sent %d packets in reply to hostile input", n)
	}
	for _, c := range []struct {
		q    *rxego.QP
		want rxego.QPState
	}{{g.rc, rxego.StateRTS}, {g.uc, rxego.StateRTS}, {g.ud, rxego.StateRTS}, {g.rq, rxego.StateInit}} {
		if st := c.q.State(); st != c.want {
			t.Errorf("QP %d (%v) in %v, want %v", c.q.Num(), c.q.Type(), st, c.want)
		}
	}
}
