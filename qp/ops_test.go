package qp

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
)

// TestSendWithImmediate: the receiver sees the immediate, in host order,
// with WCWithImm.
func TestSendWithImmediate(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	smr, _ := a.n.reg(t, 3000, allAccess)
	rmr, _ := b.n.reg(t, 3000, allAccess)
	var wire uint32
	f.tap = func(p wirePkt, pkt bth.Packet) {
		if h := pkt.ImmDt(); h != nil {
			wire = binary.BigEndian.Uint32(h)
		}
	}
	b.recv(t, 1, rmr, 0, 3000)
	a.post(t, SendWR{ID: 1, Opcode: WRSendImm, Imm: 0x01020304, Flags: SendSignaled, SGL: sge(smr, 0, 3000)})
	f.run(time.Second)
	check(t, "sender", pollAll(a.scq), want{1, WCSuccess, WCSend})
	rw := pollAll(b.rcq)
	check(t, "receiver", rw, want{1, WCSuccess, WCRecv})
	if rw[0].Imm != 0x01020304 || rw[0].Flags&WCWithImm == 0 || rw[0].ByteLen != 3000 || wire != 0x01020304 {
		t.Fatalf("receive %+v, immediate on the wire %#x", rw[0], wire)
	}
}

// TestSendWithInvalidate: SEND with invalidate invalidates the
// responder's MR (registered as invalidatable), reports it in the WC, and
// later remote access with that rkey fails.
func TestSendWithInvalidate(t *testing.T) {
	for _, size := range []int{0, 100, 3000} {
		f, a, b := pair(t, RC, defaultConn())
		smr, _ := a.n.reg(t, 4096, allAccess)
		rmr, _ := b.n.reg(t, 4096, allAccess)
		target, err := b.n.pd.Register(make([]byte, 64), allAccess, mr.WithInvalidate())
		if err != nil {
			t.Fatal(err)
		}
		key := target.RKey()
		b.recv(t, 1, rmr, 0, 4096)
		a.post(t, SendWR{ID: 1, Opcode: WRSendInv, InvalidateRKey: key, Flags: SendSignaled, SGL: sge(smr, 0, size)})
		f.run(time.Second)
		check(t, "sender", pollAll(a.scq), want{1, WCSuccess, WCSend})
		rw := pollAll(b.rcq)
		check(t, "receiver", rw, want{1, WCSuccess, WCRecv})
		if rw[0].Flags&WCWithInv == 0 || rw[0].InvalidatedRKey != key || rw[0].ByteLen != uint32(size) {
			t.Fatalf("size %d: receive %+v", size, rw[0])
		}
		a.post(t, SendWR{ID: 2, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(smr, 0, 8), RemoteAddr: target.IOVA(), RKey: key})
		f.run(time.Second)
		check(t, "write to the invalidated MR", pollAll(a.scq), want{2, WCRemAccessErr, WCWrite})
	}
}

// TestSendWithInvalidateRefused: invalidating an MR that was not
// registered as invalidatable is an invalid request.
func TestSendWithInvalidateRefused(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	smr, _ := a.n.reg(t, 64, allAccess)
	rmr, _ := b.n.reg(t, 64, allAccess)
	plain, _ := b.n.reg(t, 64, allAccess)
	b.recv(t, 1, rmr, 0, 64)
	a.post(t, SendWR{ID: 1, Opcode: WRSendInv, InvalidateRKey: plain.RKey(), Flags: SendSignaled, SGL: sge(smr, 0, 8)})
	f.run(time.Second)
	check(t, "sender", pollAll(a.scq), want{1, WCRemInvReqErr, WCSend})
	check(t, "receiver", pollAll(b.rcq), want{1, WCRemInvReqErr, WCRecv})
	if _, err := b.n.mrs.Remote(plain.RKey(), b.n.pd, plain.IOVA(), 8, mr.RemoteWrite); err != nil {
		t.Fatalf("the MR was invalidated anyway: %v", err)
	}
}

// TestLocalInvalidate: LOCAL_INV invalidates the QP's own MR; using it
// afterwards is a local protection error. Invalidating an MR that does
// not allow it fails with LOC_QP_OP_ERR (rxe's status).
func TestLocalInvalidate(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	rmr, _ := b.n.reg(t, 64, allAccess)
	buf := make([]byte, 64)
	m, err := a.n.pd.Register(buf, allAccess, mr.WithInvalidate())
	if err != nil {
		t.Fatal(err)
	}
	b.recv(t, 1, rmr, 0, 64)
	a.post(t,
		SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(m, 0, 8)},
		SendWR{ID: 2, Opcode: WRLocalInv, InvalidateRKey: m.LKey(), Flags: SendSignaled},
		SendWR{ID: 3, Opcode: WRLocalInv, InvalidateRKey: m.LKey()}, // again: no effect, no completion
	)
	f.run(time.Second)
	check(t, "invalidate", pollAll(a.scq), want{1, WCSuccess, WCSend}, want{2, WCSuccess, WCLocalInv})
	a.post(t, SendWR{ID: 4, Opcode: WRSend, Flags: SendSignaled, SGL: sge(m, 0, 8)})
	f.run(time.Second)
	check(t, "use after invalidate", pollAll(a.scq), want{4, WCLocProtErr, WCSend})

	f, a, _ = pair(t, RC, defaultConn())
	plain, _ := a.n.reg(t, 64, allAccess)
	a.post(t, SendWR{ID: 5, Opcode: WRLocalInv, InvalidateRKey: plain.LKey()}, SendWR{ID: 6, Opcode: WRSend})
	f.run(time.Second)
	check(t, "invalidate refused", pollAll(a.scq), want{5, WCLocQPOpErr, WCLocalInv}, want{6, WCWRFlushErr, WCSend})
	if n := a.n.e.Stats.SentPkts.Load(); n != 0 || a.qp.State() != Err {
		t.Fatalf("%d packets sent, state %v: the requester ran on past the failure", n, a.qp.State())
	}
}

// TestLocalInvalidateTakesNoPSN: a LOCAL_INV between requests at the PSN
// wrap neither consumes a PSN nor is mistaken for the request at PSN 0: a
// NAK for that request fails that request, and the LOCAL_INV, already
// executed, completes successfully.
func TestLocalInvalidateTakesNoPSN(t *testing.T) {
	o := defaultConn()
	o.apsn = 0xffffff
	f, a, b := pair(t, RC, o)
	lmr, _ := a.n.reg(t, 64, allAccess)
	rmr, _ := b.n.reg(t, 64, allAccess)
	inv, err := a.n.pd.Register(make([]byte, 8), allAccess, mr.WithInvalidate())
	if err != nil {
		t.Fatal(err)
	}
	var psns []bth.PSN
	f.tap = func(p wirePkt, pkt bth.Packet) {
		if pkt.Info.Flags&bth.Request != 0 {
			psns = append(psns, pkt.BTH().PSN())
		}
	}
	// The atomic's response is lost, so when the NAK for the WRITE at PSN 0
	// arrives the atomic and the LOCAL_INV are still on the send queue.
	f.drop = dropOnce(t, func(pkt bth.Packet) bool { return pkt.Info.Op == bth.OpAtomicAck })
	a.post(t,
		SendWR{ID: 1, Opcode: WRFetchAdd, Flags: SendSignaled, SGL: sge(lmr, aligned8(lmr, 0), 8), RemoteAddr: rmr.IOVA() + uint64(aligned8(rmr, 0)), RKey: rmr.RKey()},
		SendWR{ID: 2, Opcode: WRLocalInv, InvalidateRKey: inv.LKey(), Flags: SendSignaled},
		SendWR{ID: 3, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, 0, 8), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey() ^ 0xff},
	)
	f.run(time.Second)
	check(t, "requester", pollAll(a.scq), want{1, WCWRFlushErr, WCFetchAdd}, want{2, WCSuccess, WCLocalInv}, want{3, WCRemAccessErr, WCWrite})
	if len(psns) != 2 || psns[0] != 0xffffff || psns[1] != 0 {
		t.Fatalf("request PSNs %v, want [0xffffff 0]", psns)
	}
}

// TestAtomicWrite: the 8 bytes of an ATOMIC WRITE land as sent.
func TestAtomicWrite(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	rmr, rbuf := b.n.reg(t, 64, allAccess)
	ro := aligned8(rmr, 8)
	val := [8]byte{0xde, 0xad, 0xbe, 0xef, 0x01, 0x02, 0x03, 0x04}
	a.post(t, SendWR{ID: 1, Opcode: WRAtomicWrite, Flags: SendSignaled, RemoteAddr: rmr.IOVA() + uint64(ro), RKey: rmr.RKey(), AtomicValue: val})
	f.run(time.Second)
	check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCAtomicWrite})
	b.n.e.Sync()
	if !bytes.Equal(rbuf[ro:ro+8], val[:]) {
		t.Fatalf("memory % x, want % x", rbuf[ro:ro+8], val)
	}
	if !bytes.Equal(rbuf[:ro], make([]byte, ro)) || !bytes.Equal(rbuf[ro+8:], make([]byte, len(rbuf)-ro-8)) {
		t.Fatal("ATOMIC WRITE touched bytes around its target")
	}
}

// TestFlush: FLUSH of a registered range completes (range and whole-MR
// selectivity).
func TestFlush(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	rmr, _ := b.n.reg(t, 4096, allAccess)
	a.post(t,
		SendWR{ID: 1, Opcode: WRFlush, Flags: SendSignaled, RemoteAddr: rmr.IOVA(), RKey: rmr.RKey(), FlushLength: 4096, FlushType: 1},
		SendWR{ID: 2, Opcode: WRFlush, Flags: SendSignaled, RemoteAddr: rmr.IOVA(), RKey: rmr.RKey(), FlushLevel: 1, FlushType: 2},
	)
	f.run(time.Second)
	check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCFlush}, want{2, WCSuccess, WCFlush})
}

// TestScatterGather: a SEND gathered from 3 SGEs in two MRs scatters into
// 2 receive SGEs whose boundaries fall elsewhere, over several packets;
// WRITE and READ gather and scatter the same way.
func TestScatterGather(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	m1, b1 := a.n.reg(t, 4096, allAccess)
	m2, b2 := a.n.reg(t, 4096, allAccess)
	r1, rb1 := b.n.reg(t, 4096, allAccess)
	r2, rb2 := b.n.reg(t, 4096, allAccess)
	fill(b1, 21)
	fill(b2, 22)
	src := []SGE{
		{Addr: m1.IOVA() + 10, Length: 100, LKey: m1.LKey()},
		{Addr: m2.IOVA() + 500, Length: 1500, LKey: m2.LKey()},
		{Addr: m1.IOVA() + 3000, Length: 37, LKey: m1.LKey()},
	}
	want1 := append(append(append([]byte(nil), b1[10:110]...), b2[500:2000]...), b1[3000:3037]...)
	dst := []SGE{
		{Addr: r2.IOVA() + 7, Length: 700, LKey: r2.LKey()},
		{Addr: r1.IOVA() + 1, Length: 2000, LKey: r1.LKey()}, // room to spare
	}
	if err := b.qp.PostRecv(RecvWR{ID: 1, SGL: dst}); err != nil {
		t.Fatal(err)
	}
	a.post(t, SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: src})
	f.run(time.Second)
	rw := pollAll(b.rcq)
	check(t, "receiver", rw, want{1, WCSuccess, WCRecv})
	b.n.e.Sync()
	got := append(append([]byte(nil), rb2[7:707]...), rb1[1:1+len(want1)-700]...)
	if rw[0].ByteLen != uint32(len(want1)) || !bytes.Equal(got, want1) {
		t.Fatalf("SEND scatter: byte_len %d, data equal %v", rw[0].ByteLen, bytes.Equal(got, want1))
	}
	if rb1[0] != 0 || rb1[1+len(want1)-700] != 0 {
		t.Fatal("SEND wrote outside the receive SGEs")
	}
	// WRITE gathered from src into r2[2000:], then READ it back scattered
	// into m2[3000:3100] and m1[100:1637].
	a.post(t, SendWR{ID: 2, Opcode: WRWrite, Flags: SendSignaled, SGL: src, RemoteAddr: r2.IOVA() + 2000, RKey: r2.RKey()})
	back := []SGE{{Addr: m2.IOVA() + 3000, Length: 100, LKey: m2.LKey()}, {Addr: m1.IOVA() + 200, Length: 1537, LKey: m1.LKey()}}
	a.post(t, SendWR{ID: 3, Opcode: WRRead, Flags: SendSignaled, SGL: back, RemoteAddr: r2.IOVA() + 2000, RKey: r2.RKey()})
	f.run(time.Second)
	check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCSend}, want{2, WCSuccess, WCWrite}, want{3, WCSuccess, WCRead})
	b.n.e.Sync()
	if !bytes.Equal(rb2[2000:2000+len(want1)], want1) {
		t.Fatal("WRITE gather differs")
	}
	if !bytes.Equal(append(append([]byte(nil), b2[3000:3100]...), b1[200:1737]...), want1) {
		t.Fatal("READ scatter differs")
	}
}

// TestInlineSend: inline data is copied at post time; changing the source
// afterwards does not change what the peer receives. Oversized inline
// data is refused at post.
func TestInlineSend(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	lmr, _ := a.n.reg(t, 8192, allAccess)
	rmr, rbuf := b.n.reg(t, 8192, allAccess)
	src := []byte("inline payload that the application reuses at once")
	orig := append([]byte(nil), src...)
	b.recv(t, 1, rmr, 0, 100)
	// The fence behind a READ holds the inline SEND and WRITE back, so
	// they are built from the queued copy long after the post returned.
	a.post(t,
		SendWR{ID: 1, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, 5000), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
		SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled | SendInline | SendFence, Inline: src},
		SendWR{ID: 3, Opcode: WRWrite, Flags: SendSignaled | SendInline, Inline: src, RemoteAddr: rmr.IOVA() + 6000, RKey: rmr.RKey()},
	)
	copy(src, "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX")
	f.run(time.Second)
	check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCRead}, want{2, WCSuccess, WCSend}, want{3, WCSuccess, WCWrite})
	rw := pollAll(b.rcq)
	b.n.e.Sync()
	if len(rw) != 1 || rw[0].ByteLen != uint32(len(orig)) || !bytes.Equal(rbuf[:len(orig)], orig) || !bytes.Equal(rbuf[6000:6000+len(orig)], orig) {
		t.Fatalf("peer saw %q / %q, want %q", rbuf[:len(orig)], rbuf[6000:6000+len(orig)], orig)
	}
	big := make([]byte, a.qp.Caps().MaxInlineData+1)
	if err := a.qp.PostSend(SendWR{Opcode: WRSend, Flags: SendInline, Inline: big}); err == nil {
		t.Fatal("oversized inline data accepted")
	}
	if err := a.qp.PostSend(SendWR{Opcode: WRRead, Flags: SendInline, Inline: src}); err == nil {
		t.Fatal("inline READ accepted")
	}
}

// TestWriteImmConsumesOneReceive: a multi-packet WRITE with immediate
// consumes exactly one receive, reporting the write length and the
// immediate; a plain WRITE consumes none and makes no completion.
func TestWriteImmConsumesOneReceive(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	smr, sbuf := a.n.reg(t, 8192, allAccess)
	rmr, rbuf := b.n.reg(t, 16384, allAccess)
	fill(sbuf, 31)
	b.recv(t, 1, rmr, 12000, 100)
	b.recv(t, 2, rmr, 12100, 100)
	a.post(t,
		SendWR{ID: 1, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(smr, 0, 3000), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
		SendWR{ID: 2, Opcode: WRWriteImm, Imm: 0xfeedface, Flags: SendSignaled, SGL: sge(smr, 3000, 5000), RemoteAddr: rmr.IOVA() + 3000, RKey: rmr.RKey()},
	)
	f.run(time.Second)
	check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCWrite}, want{2, WCSuccess, WCWrite})
	rw := pollAll(b.rcq)
	check(t, "receiver", rw, want{1, WCSuccess, WCRecvRDMAImm})
	if rw[0].ByteLen != 5000 || rw[0].Imm != 0xfeedface || rw[0].Flags&WCWithImm == 0 || rw[0].SrcQP != a.qp.Num() {
		t.Fatalf("receive %+v", rw[0])
	}
	b.n.e.Sync()
	if !bytes.Equal(rbuf[:8000], sbuf[:8000]) {
		t.Fatal("data differs")
	}
	// The second receive is still there: a SEND lands in it.
	a.post(t, SendWR{ID: 3, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 10)})
	f.run(time.Second)
	check(t, "receiver", pollAll(b.rcq), want{2, WCSuccess, WCRecv})
}

// TestSegmentOpcode pins the opcode of every packet position of every
// SEND and WRITE on RC, UC and UD, as the IBTA numbers them.
func TestSegmentOpcode(t *testing.T) {
	type pos struct{ first, last bool }
	only, first, middle, last := pos{true, true}, pos{true, false}, pos{false, false}, pos{false, true}
	for _, c := range []struct {
		t    Type
		op   WROpcode
		at   pos
		want bth.Opcode
	}{
		{RC, WRSend, first, bth.RCSendFirst}, {RC, WRSend, middle, bth.RCSendMiddle},
		{RC, WRSend, last, bth.RCSendLast}, {RC, WRSend, only, bth.RCSendOnly},
		{RC, WRSendImm, first, bth.RCSendFirst}, {RC, WRSendImm, middle, bth.RCSendMiddle},
		{RC, WRSendImm, last, bth.RCSendLastImm}, {RC, WRSendImm, only, bth.RCSendOnlyImm},
		{RC, WRSendInv, first, bth.RCSendFirst}, {RC, WRSendInv, last, bth.RCSendLastInv},
		{RC, WRSendInv, only, bth.RCSendOnlyInv},
		{RC, WRWrite, first, bth.RCWriteFirst}, {RC, WRWrite, middle, bth.RCWriteMiddle},
		{RC, WRWrite, last, bth.RCWriteLast}, {RC, WRWrite, only, bth.RCWriteOnly},
		{RC, WRWriteImm, middle, bth.RCWriteMiddle}, {RC, WRWriteImm, last, bth.RCWriteLastImm},
		{RC, WRWriteImm, only, bth.RCWriteOnlyImm},
		{UC, WRSend, first, bth.UCSendFirst}, {UC, WRSend, middle, bth.UCSendMiddle},
		{UC, WRSendImm, last, bth.UCSendLastImm}, {UC, WRSend, only, bth.UCSendOnly},
		{UC, WRWrite, first, bth.UCWriteFirst}, {UC, WRWrite, last, bth.UCWriteLast},
		{UC, WRWriteImm, only, bth.UCWriteOnlyImm}, {UC, WRWriteImm, last, bth.UCWriteLastImm},
		{UD, WRSend, only, bth.UDSendOnly}, {UD, WRSendImm, only, bth.UDSendOnlyImm},
	} {
		if got := segmentOpcode(c.t, c.op, c.at.first, c.at.last); got != c.want {
			t.Errorf("%v %v first=%v last=%v: %v, want %v", c.t, c.op, c.at.first, c.at.last, got, c.want)
		}
	}
}
