package qp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
)

// TestUCBothDirections: SEND, WRITE and WRITE with immediate over UC,
// both ways, multi-packet.
func TestUCBothDirections(t *testing.T) {
	f, a, b := pair(t, UC, defaultConn())
	for _, dir := range [][2]*endpoint{{a, b}, {b, a}} {
		s, r := dir[0], dir[1]
		smr, sbuf := s.n.reg(t, 9000, allAccess)
		rmr, rbuf := r.n.reg(t, 20000, allAccess)
		fill(sbuf, uint64(s.qp.Num()))
		r.recv(t, 1, rmr, 0, 3000)
		r.recv(t, 2, rmr, 19000, 10)
		s.post(t,
			SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 3000)},
			SendWR{ID: 2, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(smr, 3000, 3000), RemoteAddr: rmr.IOVA() + 3000, RKey: rmr.RKey()},
			SendWR{ID: 3, Opcode: WRWriteImm, Imm: 77, Flags: SendSignaled, SGL: sge(smr, 6000, 3000), RemoteAddr: rmr.IOVA() + 6000, RKey: rmr.RKey()},
		)
		f.run(time.Second)
		check(t, "UC sender", pollAll(s.scq), want{1, WCSuccess, WCSend}, want{2, WCSuccess, WCWrite}, want{3, WCSuccess, WCWrite})
		rw := pollAll(r.rcq)
		check(t, "UC receiver", rw, want{1, WCSuccess, WCRecv}, want{2, WCSuccess, WCRecvRDMAImm})
		if rw[0].ByteLen != 3000 || rw[1].ByteLen != 3000 || rw[1].Imm != 77 {
			t.Fatalf("UC receives %+v", rw)
		}
		r.n.e.Sync()
		if !bytes.Equal(rbuf[:9000], sbuf) {
			t.Fatal("UC data differs")
		}
	}
	if a.n.e.Stats.SentPkts.Load() != 9 || b.n.e.Stats.SentPkts.Load() != 9 {
		t.Fatalf("UC sent %d/%d packets, want 9/9 (no acknowledgements)", a.n.e.Stats.SentPkts.Load(), b.n.e.Stats.SentPkts.Load())
	}
}

// TestUCLossDropsOneMessage: a packet lost from a UC message drops that
// message only: the receiver completes nothing for it (the receive WQE
// it had started is reused, as rxe does), the next message arrives
// intact, and the sender, which has no acknowledgements to wait for,
// completes both.
func TestUCLossDropsOneMessage(t *testing.T) {
	for _, lost := range []int{0, 1, 2} { // first, middle or last packet of message 1
		for _, op := range []WROpcode{WRSend, WRWriteImm} {
			o := defaultConn()
			o.apsn = 0xfffffe // the PSNs wrap inside message 1
			f, a, b := pair(t, UC, o)
			smr, sbuf := a.n.reg(t, 8192, allAccess)
			rmr, rbuf := b.n.reg(t, 16384, allAccess)
			fill(sbuf, 5)
			f.drop = dropOnce(t, func(pkt bth.Packet) bool { return pkt.BTH().PSN() == bth.PSN(o.apsn).Add(lost) })
			b.recv(t, 1, rmr, 0, 4000)
			b.recv(t, 2, rmr, 4000, 4000)
			a.post(t,
				SendWR{ID: 1, Opcode: op, Flags: SendSignaled, SGL: sge(smr, 0, 3000), RemoteAddr: rmr.IOVA() + 8000, RKey: rmr.RKey()},
				SendWR{ID: 2, Opcode: op, Flags: SendSignaled, SGL: sge(smr, 3000, 2500), RemoteAddr: rmr.IOVA() + 12000, RKey: rmr.RKey()},
			)
			f.run(time.Second)
			check(t, "UC sender", pollAll(a.scq), want{1, WCSuccess, wcOpcodeOf(op)}, want{2, WCSuccess, wcOpcodeOf(op)})
			rw := pollAll(b.rcq)
			if len(rw) != 1 || rw[0].Status != WCSuccess || rw[0].ByteLen != 2500 {
				t.Fatalf("lost packet %d of %v: receive completions %+v", lost, op, rw)
			}
			// Message 2 takes the first receive: a SEND's damaged message 1
			// had started it and it is reused; a WRITE with immediate takes
			// its receive only at a last packet that arrives.
			b.n.e.Sync()
			ok := rw[0].ID == 1
			if op == WRSend {
				ok = ok && rw[0].Opcode == WCRecv && bytes.Equal(rbuf[:2500], sbuf[3000:5500])
			} else {
				ok = ok && rw[0].Opcode == WCRecvRDMAImm && bytes.Equal(rbuf[12000:14500], sbuf[3000:5500])
			}
			if !ok {
				t.Fatalf("lost packet %d of %v: message 2 completion %+v", lost, op, rw[0])
			}
			// The QP carries on: a third message arrives.
			a.post(t, SendWR{ID: 3, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 10)})
			f.run(time.Second)
			if rw := pollAll(b.rcq); len(rw) != 1 || rw[0].Status != WCSuccess || rw[0].ByteLen != 10 {
				t.Fatalf("third message: %+v", rw)
			}
			if b.qp.State() != RTS {
				t.Fatalf("UC receiver %v", b.qp.State())
			}
		}
	}
}

// udPair makes two UD endpoints in RTS with the given Q_Keys.
func udPair(t *testing.T, addrA, addrB string, qa, qb uint32) (*fabric, *endpoint, *endpoint) {
	f := newFabric(t)
	a := f.node(addrA).newQP(t, UD, 16)
	b := f.node(addrB).newQP(t, UD, 16)
	bringUD(t, a, 0x10, qa)
	bringUD(t, b, 0x20, qb)
	return f, a, b
}

// TestUDSendGRH: a UD receive buffer gets the 40 bytes of GRH space
// first (over IPv4: 20 zero bytes, then the IPv4 header) and then the
// payload; the WC names the sender.
func TestUDSendGRH(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		addrA, addrB := "198.18.0.1", "198.18.0.2"
		if v6 {
			addrA, addrB = "2001:db8::1", "2001:db8::2"
		}
		f, a, b := udPair(t, addrA, addrB, 0x1111, 0x2222)
		smr, sbuf := a.n.reg(t, 4096, allAccess)
		rmr, rbuf := b.n.reg(t, 8192, allAccess)
		fill(sbuf, 6)
		var raw []byte
		var tos uint8
		f.tap = func(p wirePkt, pkt bth.Packet) { raw, tos = pkt.Raw, p.tos }
		b.recv(t, 1, rmr, 0, 8192)
		const n = 1000
		a.post(t, SendWR{ID: 1, Opcode: WRSendImm, Imm: 0xabc, Flags: SendSignaled, SGL: sge(smr, 0, n),
			AH: &AH{Dest: b.n.addr}, RemoteQPN: b.qp.Num(), RemoteQKey: 0x2222})
		f.run(time.Second)
		check(t, "UD sender", pollAll(a.scq), want{1, WCSuccess, WCSend})
		rw := pollAll(b.rcq)
		check(t, "UD receiver", rw, want{1, WCSuccess, WCRecv})
		wc := rw[0]
		if wc.ByteLen != GRHLen+n || wc.SrcQP != a.qp.Num() || wc.Flags&WCWithGRH == 0 || wc.Flags&WCWithImm == 0 ||
			wc.Imm != 0xabc || wc.Src != a.n.addr || wc.QPN != b.qp.Num() {
			t.Fatalf("UD WC %+v", wc)
		}
		b.n.e.Sync()
		if !bytes.Equal(rbuf[GRHLen:GRHLen+n], sbuf[:n]) {
			t.Fatal("UD payload differs")
		}
		g := rbuf[:GRHLen]
		src, dst := a.n.addr.Addr(), b.n.addr.Addr()
		if !v6 {
			ip := g[20:]
			s4, d4 := src.As4(), dst.As4()
			if !bytes.Equal(g[:20], make([]byte, 20)) || ip[0] != 0x45 || ip[1] != tos ||
				binary.BigEndian.Uint16(ip[2:]) != uint16(20+8+len(raw)) || ip[6]&0x40 == 0 || ip[8] != 64 || ip[9] != 17 ||
				!bytes.Equal(ip[12:16], s4[:]) || !bytes.Equal(ip[16:20], d4[:]) {
				t.Fatalf("IPv4 GRH % x", g)
			}
			continue
		}
		s16, d16 := src.As16(), dst.As16()
		if g[0]>>4 != 6 || binary.BigEndian.Uint16(g[4:]) != uint16(8+len(raw)) || g[6] != 17 || g[7] != 64 ||
			!bytes.Equal(g[8:24], s16[:]) || !bytes.Equal(g[24:40], d16[:]) || g[0]&0xf != tos>>4 || g[1]>>4 != tos&0xf {
			t.Fatalf("IPv6 GRH % x", g)
		}
	}
}

// TestUDQKey: a datagram whose Q_Key differs from the receiver's is
// dropped and counted; a Q_Key with the high bit set means "use the
// sending QP's own Q_Key".
func TestUDQKey(t *testing.T) {
	f, a, b := udPair(t, "198.18.0.1", "198.18.0.2", 0x5555, 0x5555)
	smr, _ := a.n.reg(t, 64, allAccess)
	rmr, _ := b.n.reg(t, 4096, allAccess)
	b.recv(t, 1, rmr, 0, 4096)
	ah := &AH{Dest: b.n.addr}
	a.post(t, SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 8), AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: 0x5556})
	f.run(time.Second)
	check(t, "sender", pollAll(a.scq), want{1, WCSuccess, WCSend})
	if len(pollAll(b.rcq)) != 0 || b.n.e.Stats.Drops[DropBadQKey].Load() != 1 {
		t.Fatalf("bad Q_Key: drops %d", b.n.e.Stats.Drops[DropBadQKey].Load())
	}
	a.post(t, SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 8), AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: 0x80000000})
	f.run(time.Second)
	check(t, "sender", pollAll(a.scq), want{2, WCSuccess, WCSend})
	check(t, "receiver", pollAll(b.rcq), want{1, WCSuccess, WCRecv})
}

// TestUDLimits: a UD message over the MTU is refused at post; one that
// finds no receive, or a receive too small, is dropped or fails there.
func TestUDLimits(t *testing.T) {
	f, a, b := udPair(t, "198.18.0.1", "198.18.0.2", 1, 1)
	smr, _ := a.n.reg(t, 8192, allAccess)
	rmr, _ := b.n.reg(t, 8192, allAccess)
	ah := &AH{Dest: b.n.addr}
	err := a.qp.PostSend(SendWR{ID: 1, Opcode: WRSend, SGL: sge(smr, 0, 4097), AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: 1})
	if !errors.Is(err, ErrInvalidWR) {
		t.Fatalf("4097-byte UD send: %v", err)
	}
	for _, bad := range []SendWR{
		{Opcode: WRWrite, AH: ah, RemoteQPN: 1},
		{Opcode: WRSend},                                   // no address handle
		{Opcode: WRSend, AH: ah, RemoteQPN: 1 << 24},       // QPN too large
		{Opcode: WRSend, AH: &AH{}, RemoteQPN: b.qp.Num()}, // empty address
	} {
		if err := a.qp.PostSend(bad); !errors.Is(err, ErrInvalidWR) {
			t.Fatalf("bad UD WR %+v: %v", bad, err)
		}
	}
	// No receive posted: dropped and counted.
	a.post(t, SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 4096), AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: 1})
	f.run(time.Second)
	check(t, "sender", pollAll(a.scq), want{2, WCSuccess, WCSend})
	if b.n.e.Stats.Drops[DropNoRecvWQE].Load() != 1 {
		t.Fatalf("no_recv_wqe drops %d", b.n.e.Stats.Drops[DropNoRecvWQE].Load())
	}
	// A receive without room for the GRH and the payload.
	b.recv(t, 3, rmr, 0, GRHLen+99)
	b.recv(t, 4, rmr, 0, GRHLen+100)
	a.post(t,
		SendWR{ID: 5, Opcode: WRSend, SGL: sge(smr, 0, 100), AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: 1},
		SendWR{ID: 6, Opcode: WRSend, SGL: sge(smr, 0, 100), AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: 1},
	)
	f.run(time.Second)
	rw := pollAll(b.rcq)
	check(t, "receiver", rw, want{3, WCLocLenErr, WCRecv}, want{4, WCSuccess, WCRecv})
	if b.qp.State() != RTS {
		t.Fatalf("UD receiver %v after a length error", b.qp.State())
	}
}

// TestUCRefusalsDrop: a UC request that fails a check RC would NAK (a bad
// rkey here) or finds no receive WQE (a WRITE with immediate) is dropped
// with its message and counted; the responder sends nothing, stays in
// RTS, and the next message arrives.
func TestUCRefusalsDrop(t *testing.T) {
	f, a, b := pair(t, UC, defaultConn())
	smr, sbuf := a.n.reg(t, 4096, allAccess)
	rmr, rbuf := b.n.reg(t, 4096, allAccess)
	fill(sbuf, 9)
	a.post(t,
		SendWR{ID: 1, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(smr, 0, 100), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey() ^ 0x55},
		SendWR{ID: 2, Opcode: WRWriteImm, Flags: SendSignaled, SGL: sge(smr, 0, 100), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
	)
	f.run(time.Second)
	if n := len(pollAll(b.rcq)); n != 0 {
		t.Fatalf("%d receive completions for dropped messages", n)
	}
	st := &b.n.e.Stats
	if st.Drops[DropBadAccess].Load() != 1 || st.Drops[DropNoRecvWQE].Load() != 1 || st.SentPkts.Load() != 0 ||
		st.SendRNRErr.Load() != 0 || b.qp.State() != RTS {
		t.Fatalf("bad_access %d, no_recv_wqe %d, sent %d, rnr %d, state %v", st.Drops[DropBadAccess].Load(),
			st.Drops[DropNoRecvWQE].Load(), st.SentPkts.Load(), st.SendRNRErr.Load(), b.qp.State())
	}
	b.recv(t, 3, rmr, 0, 200)
	a.post(t, SendWR{ID: 3, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 200)})
	f.run(time.Second)
	check(t, "UC sender", pollAll(a.scq), want{1, WCSuccess, WCWrite}, want{2, WCSuccess, WCWrite}, want{3, WCSuccess, WCSend})
	rw := pollAll(b.rcq)
	b.n.e.Sync()
	if len(rw) != 1 || rw[0].ID != 3 || rw[0].ByteLen != 200 || !bytes.Equal(rbuf[:200], sbuf[:200]) {
		t.Fatalf("receive after the drops: %+v", rw)
	}
}
