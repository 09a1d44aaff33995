package qp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/reth"
)

// dropOnce returns a fabric drop function losing, once, the first packet
// pick selects.
func dropOnce(t *testing.T, pick func(bth.Packet) bool) func(wirePkt) bool {
	done := false
	return func(p wirePkt) bool {
		if !done && pick(parse(t, p)) {
			done = true
			return true
		}
		return false
	}
}

// TestOneNAKPerGap: a packet lost in a 20-packet message makes the
// responder send exactly one PSN sequence error NAK however many packets
// follow the gap; a later gap gets its own NAK.
func TestOneNAKPerGap(t *testing.T) {
	o := defaultConn()
	f, a, b := pair(t, RC, o)
	const mtu, npk = 1024, 20
	smr, sbuf := a.n.reg(t, 2*npk*mtu, allAccess)
	rmr, rbuf := b.n.reg(t, 2*npk*mtu, allAccess)
	fill(sbuf, 1)
	naks := 0
	f.tap = func(p wirePkt, pkt bth.Packet) {
		if isNAK(pkt, reth.NAKPSNSeqError) {
			naks++
		}
	}
	first := bth.PSN(o.apsn)
	f.drop = dropOnce(t, func(pkt bth.Packet) bool { return pkt.BTH().PSN() == first.Add(5) })
	b.recv(t, 1, rmr, 0, npk*mtu)
	a.post(t, SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, npk*mtu)})
	f.run(time.Second)
	if naks != 1 || b.n.e.Stats.NAKsSent.Load() != 1 {
		t.Fatalf("%d NAKs seen, %d counted, want 1", naks, b.n.e.Stats.NAKsSent.Load())
	}
	if got := b.n.e.Stats.OutOfSeqRequest.Load(); got != npk-6 {
		t.Fatalf("out_of_seq_request %d, want %d (every packet after the gap)", got, npk-6)
	}
	check(t, "sender", pollAll(a.scq), want{1, WCSuccess, WCSend})
	check(t, "receiver", pollAll(b.rcq), want{1, WCSuccess, WCRecv})
	// A second message with its own gap: one more NAK.
	second := first.Add(npk)
	f.drop = dropOnce(t, func(pkt bth.Packet) bool { return pkt.BTH().PSN() == second.Add(11) })
	b.recv(t, 2, rmr, npk*mtu, npk*mtu)
	a.post(t, SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, npk*mtu, npk*mtu)})
	f.run(time.Second)
	if naks != 2 {
		t.Fatalf("%d NAKs after a second gap, want 2", naks)
	}
	check(t, "sender", pollAll(a.scq), want{2, WCSuccess, WCSend})
	check(t, "receiver", pollAll(b.rcq), want{2, WCSuccess, WCRecv})
	b.n.e.Sync()
	if !bytes.Equal(rbuf, sbuf) {
		t.Fatal("data differs")
	}
	if a.n.e.Stats.RcvdSeqErr.Load() != 2 {
		t.Fatalf("requester counted %d sequence NAKs, want 2", a.n.e.Stats.RcvdSeqErr.Load())
	}
}

// TestDuplicateSendWriteReACKed: a duplicated SEND or WRITE is
// acknowledged again, not executed again.
func TestDuplicateSendWriteReACKed(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	smr, sbuf := a.n.reg(t, 4096, allAccess)
	rmr, rbuf := b.n.reg(t, 4096, allAccess)
	fill(sbuf, 2)
	acks := 0
	f.tap = func(p wirePkt, pkt bth.Packet) {
		if pkt.Info.Op == bth.OpAck && pkt.AETH().Syndrome().Kind() == reth.KindACK {
			acks++
		}
	}
	f.dupIf = func(p wirePkt) bool { return parse(t, p).Info.Flags&bth.Request != 0 }
	b.recv(t, 1, rmr, 0, 1000)
	b.recv(t, 2, rmr, 1000, 1000)
	a.post(t,
		SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 1000)},
		SendWR{ID: 2, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(smr, 1000, 1000), RemoteAddr: rmr.IOVA() + 2000, RKey: rmr.RKey()},
	)
	f.run(time.Second)
	check(t, "sender", pollAll(a.scq), want{1, WCSuccess, WCSend}, want{2, WCSuccess, WCWrite})
	check(t, "receiver", pollAll(b.rcq), want{1, WCSuccess, WCRecv}) // receive 2 stays posted
	if got := b.n.e.Stats.DuplicateRequest.Load(); got != 2 {
		t.Fatalf("duplicate_request %d, want 2", got)
	}
	if acks != 4 {
		t.Fatalf("%d ACKs, want 4 (each request and each duplicate)", acks)
	}
	b.n.e.Sync()
	if !bytes.Equal(rbuf[:1000], sbuf[:1000]) || !bytes.Equal(rbuf[2000:3000], sbuf[1000:2000]) {
		t.Fatal("data differs")
	}
}

// TestReadRetryFromFirstMissingByte: when a READ response is lost mid
// stream, the requester asks again for exactly the bytes not yet
// received, with the PSN of the first missing response, and the responder
// replays them from memory.
func TestReadRetryFromFirstMissingByte(t *testing.T) {
	o := defaultConn()
	f, a, b := pair(t, RC, o)
	const mtu, size = 1024, 20*1024 - 100
	lmr, lbuf, rmr, rbuf := regBoth(t, a, b, size, size)
	fill(rbuf, 3)
	type req struct {
		psn bth.PSN
		va  uint64
		n   uint32
	}
	var reqs []req
	f.tap = func(p wirePkt, pkt bth.Packet) {
		if pkt.Info.Op == bth.OpReadRequest {
			reqs = append(reqs, req{pkt.BTH().PSN(), pkt.RETH().VA(), pkt.RETH().DMALen()})
		}
	}
	first := bth.PSN(o.apsn)
	f.drop = dropOnce(t, func(pkt bth.Packet) bool {
		return pkt.Info.Op == bth.OpReadResponse && pkt.BTH().PSN() == first.Add(7)
	})
	a.post(t, SendWR{ID: 5, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()})
	f.run(time.Second)
	wcs := pollAll(a.scq)
	check(t, "requester", wcs, want{5, WCSuccess, WCRead})
	if wcs[0].ByteLen != size {
		t.Fatalf("READ byte_len %d, want %d", wcs[0].ByteLen, size)
	}
	wantReqs := []req{{first, rmr.IOVA(), size}, {first.Add(7), rmr.IOVA() + 7*mtu, size - 7*mtu}}
	if len(reqs) != 2 || reqs[0] != wantReqs[0] || reqs[1] != wantReqs[1] {
		t.Fatalf("READ requests %+v, want %+v", reqs, wantReqs)
	}
	if !bytes.Equal(lbuf, rbuf) {
		t.Fatal("READ data differs")
	}
	if b.n.e.Stats.DuplicateRequest.Load() != 1 {
		t.Fatalf("duplicate_request %d, want 1", b.n.e.Stats.DuplicateRequest.Load())
	}
}

// TestAtomicReplayNotReexecuted: when an atomic's response is lost the
// requester retries, and the responder answers from its saved result: the
// target changes once and the requester gets the original value.
func TestAtomicReplayNotReexecuted(t *testing.T) {
	for _, op := range []WROpcode{WRFetchAdd, WRCompareSwap} {
		o := defaultConn()
		o.timeout = 8
		f, a, b := pair(t, RC, o)
		lmr, lbuf := a.n.reg(t, 64, allAccess)
		rmr, rbuf := b.n.reg(t, 64, allAccess)
		lo, ro := aligned8(lmr, 0), aligned8(rmr, 0)
		binary.LittleEndian.PutUint64(rbuf[ro:], 1000)
		f.drop = dropOnce(t, func(pkt bth.Packet) bool { return pkt.Info.Op == bth.OpAtomicAck })
		wr := SendWR{ID: 1, Opcode: op, Flags: SendSignaled, SGL: sge(lmr, lo, 8), RemoteAddr: rmr.IOVA() + uint64(ro),
			RKey: rmr.RKey(), CompareAdd: 1000, Swap: 7}
		if op == WRFetchAdd {
			wr.CompareAdd = 5
		}
		a.post(t, wr)
		f.run(time.Second)
		wcop := WCFetchAdd
		wantMem := uint64(1005)
		if op == WRCompareSwap {
			wcop, wantMem = WCCompareSwap, 7
		}
		wcs := pollAll(a.scq)
		check(t, op.String(), wcs, want{1, WCSuccess, wcop})
		if wcs[0].ByteLen != 8 {
			t.Fatalf("%v byte_len %d", op, wcs[0].ByteLen)
		}
		b.n.e.Sync()
		if got := binary.LittleEndian.Uint64(rbuf[ro:]); got != wantMem {
			t.Fatalf("%v: target %d, want %d (executed more than once?)", op, got, wantMem)
		}
		if got := binary.LittleEndian.Uint64(lbuf[lo:]); got != 1000 {
			t.Fatalf("%v: requester got %d, want the original 1000", op, got)
		}
		if b.n.e.Stats.DuplicateRequest.Load() != 1 || a.n.e.Stats.Retransmits.Load() != 1 {
			t.Fatalf("%v: duplicate_request %d, retransmits %d, want 1 and 1", op,
				b.n.e.Stats.DuplicateRequest.Load(), a.n.e.Stats.Retransmits.Load())
		}
	}
}

// TestAtomicWriteAndFlushReplay: a lost response to ATOMIC WRITE or FLUSH
// is answered again without executing again.
func TestAtomicWriteAndFlushReplay(t *testing.T) {
	o := defaultConn()
	o.timeout = 8
	f, a, b := pair(t, RC, o)
	rmr, rbuf := b.n.reg(t, 64, allAccess)
	ro := aligned8(rmr, 0)
	drops := 0
	f.drop = func(p wirePkt) bool {
		if parse(t, p).Info.Op == bth.OpReadResponse && drops < 2 {
			drops++
			return true
		}
		return false
	}
	val := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	a.post(t,
		SendWR{ID: 1, Opcode: WRAtomicWrite, Flags: SendSignaled, RemoteAddr: rmr.IOVA() + uint64(ro), RKey: rmr.RKey(), AtomicValue: val},
		SendWR{ID: 2, Opcode: WRFlush, Flags: SendSignaled, RemoteAddr: rmr.IOVA(), RKey: rmr.RKey(), FlushLength: 64, FlushType: 1},
	)
	// The peer's application overwrites the word after the ATOMIC WRITE
	// landed; a re-executed duplicate would put the old value back.
	f.run(ackTimeout(o.timeout) / 2)
	b.n.e.Sync()
	if !bytes.Equal(rbuf[ro:ro+8], val[:]) {
		t.Fatalf("ATOMIC WRITE landed % x, want % x", rbuf[ro:ro+8], val)
	}
	copy(rbuf[ro:], "overwrit")
	f.run(time.Second)
	check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCAtomicWrite}, want{2, WCSuccess, WCFlush})
	b.n.e.Sync()
	if string(rbuf[ro:ro+8]) != "overwrit" {
		t.Fatal("the duplicate ATOMIC WRITE executed again")
	}
	if b.n.e.Stats.DuplicateRequest.Load() != 2 {
		t.Fatalf("duplicate_request %d, want 2", b.n.e.Stats.DuplicateRequest.Load())
	}
}

// TestRNRThenSuccess: a SEND (or the last packet of a WRITE with
// immediate) that finds no receive posted gets RNR NAKs and succeeds once
// one is posted.
func TestRNRThenSuccess(t *testing.T) {
	cases := []struct {
		name string
		op   WROpcode
		size int
	}{
		{"send-only", WRSend, 100}, {"send-multi", WRSend, 5000},
		{"write-imm-only", WRWriteImm, 100}, {"write-imm-multi", WRWriteImm, 5000},
		{"write-imm-zero", WRWriteImm, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := defaultConn()
			o.minRN = 4 // 40 us
			f, a, b := pair(t, RC, o)
			smr, sbuf := a.n.reg(t, 8192, allAccess)
			rmr, rbuf := b.n.reg(t, 16384, allAccess)
			fill(sbuf, 4)
			rnrs := 0
			f.tap = func(p wirePkt, pkt bth.Packet) {
				if isRNR(pkt) {
					rnrs++
					if v := pkt.AETH().Syndrome().Value(); v != o.minRN {
						t.Fatalf("RNR NAK timer %d, want the responder's min_rnr_timer %d", v, o.minRN)
					}
				}
			}
			a.post(t, SendWR{ID: 1, Opcode: c.op, Imm: 0xabcd, Flags: SendSignaled, SGL: sge(smr, 0, c.size),
				RemoteAddr: rmr.IOVA() + 100, RKey: rmr.RKey()})
			f.run(5 * RNRWait(o.minRN, DefaultRNRTick))
			if rnrs < 3 || len(pollAll(a.scq)) != 0 {
				t.Fatalf("%d RNR NAKs before a receive was posted", rnrs)
			}
			b.recv(t, 9, rmr, 8192, 8192)
			f.run(time.Second)
			wcop := WCSend
			if c.op == WRWriteImm {
				wcop = WCWrite
			}
			check(t, "sender", pollAll(a.scq), want{1, WCSuccess, wcop})
			rw := pollAll(b.rcq)
			if c.op == WRSend {
				check(t, "receiver", rw, want{9, WCSuccess, WCRecv})
				b.n.e.Sync()
				if !bytes.Equal(rbuf[8192:8192+c.size], sbuf[:c.size]) {
					t.Fatal("data differs")
				}
			} else {
				check(t, "receiver", rw, want{9, WCSuccess, WCRecvRDMAImm})
				b.n.e.Sync()
				if !bytes.Equal(rbuf[100:100+c.size], sbuf[:c.size]) {
					t.Fatal("data differs")
				}
			}
			if rw[0].ByteLen != uint32(c.size) || rw[0].Imm != 0xabcd && c.op == WRWriteImm {
				t.Fatalf("receive completion %+v", rw[0])
			}
			if got := b.n.e.Stats.SendRNRErr.Load(); got != uint64(rnrs) {
				t.Fatalf("send_rnr_err %d, RNR NAKs seen %d", got, rnrs)
			}
		})
	}
}

// accessCase is a remote operation the responder must refuse.
type accessCase struct {
	name string
	// setup returns the WR to post and the responder memory it must not
	// touch.
	setup func(t *testing.T, a, b *endpoint) (SendWR, []byte)
}

// remoteOps builds, for an rkey/address chosen by target, a WRITE, a
// WRITE with immediate, a READ, both atomics and an ATOMIC WRITE.
func remoteOps(target func(b *endpoint) (va uint64, rkey uint32, mem []byte)) []accessCase {
	var out []accessCase
	ops := []WROpcode{WRWrite, WRWriteImm, WRRead, WRFetchAdd, WRCompareSwap, WRAtomicWrite, WRFlush}
	for _, op := range ops {
		out = append(out, accessCase{op.String(), func(t *testing.T, a, b *endpoint) (SendWR, []byte) {
			lmr, lbuf := a.n.reg(t, 256, allAccess)
			fill(lbuf, 9)
			va, rkey, mem := target(b)
			wr := SendWR{ID: 1, Opcode: op, Flags: SendSignaled, RemoteAddr: va, RKey: rkey, AtomicValue: [8]byte{9, 9, 9, 9, 9, 9, 9, 9}, FlushLength: 64}
			switch op {
			case WRFetchAdd, WRCompareSwap:
				wr.SGL = sge(lmr, aligned8(lmr, 0), 8)
				wr.CompareAdd = 1
			case WRAtomicWrite, WRFlush:
			default:
				wr.SGL = sge(lmr, 0, 64)
			}
			return wr, mem
		}})
	}
	return out
}

// runAccessError posts the case's WR and checks: the requester completes
// it with st, its other WRs flush, the responder moves to ERR and flushes
// its receives, and the target memory is untouched.
func runAccessError(t *testing.T, o connOpts, c accessCase, st WCStatus) {
	f, a, b := pair(t, RC, o)
	wr, mem := c.setup(t, a, b)
	before := append([]byte(nil), mem...)
	rmr, _ := b.n.reg(t, 64, allAccess)
	b.recv(t, 77, rmr, 0, 64)
	a.post(t, wr, SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled})
	f.run(time.Second)
	check(t, c.name+" requester", pollAll(a.scq), want{1, st, wcOpcodeOf(wr.Opcode)}, want{2, WCWRFlushErr, WCSend})
	if a.qp.State() != Err || b.qp.State() != Err {
		t.Fatalf("%s: states %v/%v, want ERR/ERR", c.name, a.qp.State(), b.qp.State())
	}
	// A WRITE with immediate that fails its rkey check had already taken
	// the receive (rxe checks resources first); it completes with the
	// error. Otherwise the receive is flushed when the responder fails.
	recvSt := WCWRFlushErr
	if wr.Opcode == WRWriteImm && st == WCRemAccessErr {
		recvSt = WCRemAccessErr
	}
	check(t, c.name+" responder", pollAll(b.rcq), want{77, recvSt, WCRecv})
	b.n.e.Sync()
	unchanged(t, c.name, before, mem)
}

// TestRemoteAccessErrors: a bad rkey, an rkey of another PD, a
// deregistered MR, a range outside the MR or wrapping the address space,
// or an MR without the needed access each give REM_ACCESS_ERR, move the
// responder to ERR and write nothing.
func TestRemoteAccessErrors(t *testing.T) {
	// Each target returns an 8-byte aligned VA, the rkey to use and the
	// memory that must stay untouched.
	type target func(t *testing.T, b *endpoint) (uint64, uint32, []byte)
	regAligned := func(t *testing.T, b *endpoint, pd *mr.PD, acc mr.Access) (*mr.MR, uint64, []byte) {
		buf := make([]byte, 72)
		m, err := pd.Register(buf, acc)
		if err != nil {
			t.Fatal(err)
		}
		return m, m.IOVA() + uint64(aligned8(m, 0)), buf
	}
	targets := map[string]target{
		"garbage-rkey": func(t *testing.T, b *endpoint) (uint64, uint32, []byte) {
			m, va, buf := regAligned(t, b, b.n.pd, allAccess)
			return va, m.RKey() ^ 0x5a, buf
		},
		"other-pd": func(t *testing.T, b *endpoint) (uint64, uint32, []byte) {
			m, va, buf := regAligned(t, b, b.n.mrs.AllocPD(), allAccess)
			return va, m.RKey(), buf
		},
		"deregistered": func(t *testing.T, b *endpoint) (uint64, uint32, []byte) {
			m, va, buf := regAligned(t, b, b.n.pd, allAccess)
			key := m.RKey()
			if err := m.Deregister(); err != nil {
				t.Fatal(err)
			}
			return va, key, buf
		},
		"past-end": func(t *testing.T, b *endpoint) (uint64, uint32, []byte) {
			m, _, buf := regAligned(t, b, b.n.pd, allAccess)
			return m.IOVA() + uint64(aligned8(m, len(buf))), m.RKey(), buf
		},
		"wraps-address-space": func(t *testing.T, b *endpoint) (uint64, uint32, []byte) {
			buf := make([]byte, 64)
			m, err := b.n.pd.Register(buf, allAccess, mr.WithIOVA(1<<64-72))
			if err != nil {
				t.Fatal(err)
			}
			return 1<<64 - 16, m.RKey(), buf // 8 bytes fit, 64 wrap
		},
		"mr-without-access": func(t *testing.T, b *endpoint) (uint64, uint32, []byte) {
			_, va, buf := regAligned(t, b, b.n.pd, mr.LocalWrite)
			m, _ := b.n.pd.Register(buf, mr.LocalWrite)
			return va - m.IOVA() + m.IOVA(), m.RKey(), buf
		},
	}
	for name, target := range targets {
		t.Run(name, func(t *testing.T) {
			for _, c := range remoteOps(func(b *endpoint) (uint64, uint32, []byte) { return target(t, b) }) {
				if name == "wraps-address-space" && (c.name == "ATOMIC_FETCH_AND_ADD" || c.name == "ATOMIC_CMP_AND_SWP" || c.name == "ATOMIC_WRITE") {
					continue // 8 bytes at 2^64-8 are inside the MR
				}
				runAccessError(t, defaultConn(), c, WCRemAccessErr)
			}
		})
	}
}

// TestQPAccessFlagsRefuse: a responder QP without RemoteWrite, RemoteRead
// or RemoteAtomic refuses those operations as invalid requests.
func TestQPAccessFlagsRefuse(t *testing.T) {
	cases := map[mr.Access][]WROpcode{
		mr.RemoteWrite:  {WRWrite, WRWriteImm, WRAtomicWrite},
		mr.RemoteRead:   {WRRead},
		mr.RemoteAtomic: {WRFetchAdd, WRCompareSwap},
	}
	for missing, ops := range cases {
		for _, c := range remoteOps(func(b *endpoint) (uint64, uint32, []byte) {
			m, buf := b.n.reg(t, 64, allAccess)
			return m.IOVA() + uint64(aligned8(m, 0)), m.RKey(), buf
		}) {
			hit := false
			for _, op := range ops {
				hit = hit || c.name == op.String()
			}
			if !hit {
				continue
			}
			o := defaultConn()
			o.noAccess = missing
			runAccessError(t, o, c, WCRemInvReqErr)
		}
	}
}

// TestMisalignedAtomicMemory: an atomic whose VA is aligned but whose
// memory is not (an MR with a chosen IOVA over an odd buffer) is refused
// as an invalid request.
func TestMisalignedAtomicMemory(t *testing.T) {
	c := accessCase{"misaligned", func(t *testing.T, a, b *endpoint) (SendWR, []byte) {
		lmr, _ := a.n.reg(t, 64, allAccess)
		raw := make([]byte, 80)
		off := 0
		for addrOf(raw[off:])%8 != 1 {
			off++
		}
		buf := raw[off : off+64] // an odd address
		m, err := b.n.pd.Register(buf, allAccess, mr.WithIOVA(0x10000))
		if err != nil {
			t.Fatal(err)
		}
		return SendWR{ID: 1, Opcode: WRFetchAdd, Flags: SendSignaled, SGL: sge(lmr, aligned8(lmr, 0), 8),
			RemoteAddr: 0x10008, RKey: m.RKey(), CompareAdd: 1}, buf
	}}
	runAccessError(t, defaultConn(), c, WCRemInvReqErr)
}

// TestRecvTooShort: a SEND longer than the posted receive is refused as
// rxe refuses it (6.1, 6.12): a NAK remote operational error, the receive
// completes LOC_QP_OP_ERR and the requester REM_OP_ERR.
func TestRecvTooShort(t *testing.T) {
	for _, sizes := range [][2]int{{100, 50}, {3000, 2000}, {1, 0}} {
		f, a, b := pair(t, RC, defaultConn())
		smr, _ := a.n.reg(t, 4096, allAccess)
		rmr, _ := b.n.reg(t, 4096, allAccess)
		b.recv(t, 1, rmr, 0, sizes[1])
		b.recv(t, 2, rmr, 0, 4096)
		a.post(t, SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, sizes[0])})
		f.run(time.Second)
		check(t, "requester", pollAll(a.scq), want{1, WCRemOpErr, WCSend})
		check(t, "receiver", pollAll(b.rcq), want{1, WCLocQPOpErr, WCRecv}, want{2, WCWRFlushErr, WCRecv})
		if got := b.n.e.Stats.Drops[DropBadLength].Load(); got != 1 {
			t.Fatalf("drop_bad_length %d, want 1", got)
		}
		if b.qp.State() != Err {
			t.Fatalf("responder %v, want ERR", b.qp.State())
		}
	}
}

// TestMisalignedAtomicRejectedAtPost: atomics need an 8-byte aligned
// remote address and one 8-byte SGE; a bad one fails PostSend and nothing
// is queued.
func TestMisalignedAtomicRejectedAtPost(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	lmr, _ := a.n.reg(t, 64, allAccess)
	rmr, _ := b.n.reg(t, 64, allAccess)
	ro := uint64(aligned8(rmr, 0))
	l8 := sge(lmr, aligned8(lmr, 0), 8)
	bad := []SendWR{
		{Opcode: WRFetchAdd, SGL: l8, RemoteAddr: rmr.IOVA() + ro + 4, RKey: rmr.RKey()},
		{Opcode: WRCompareSwap, SGL: l8, RemoteAddr: rmr.IOVA() + ro + 1, RKey: rmr.RKey()},
		{Opcode: WRAtomicWrite, RemoteAddr: rmr.IOVA() + ro + 2, RKey: rmr.RKey()},
		{Opcode: WRFetchAdd, SGL: sge(lmr, 0, 4), RemoteAddr: rmr.IOVA() + ro, RKey: rmr.RKey()},
	}
	sent := a.n.e.Stats.SentPkts.Load()
	for i, wr := range bad {
		good := SendWR{ID: 100, Opcode: WRSend}
		if err := a.qp.PostSend(good, wr); !errors.Is(err, ErrInvalidWR) {
			t.Fatalf("bad WR %d: %v, want ErrInvalidWR", i, err)
		}
	}
	if a.n.e.Stats.SentPkts.Load() != sent {
		t.Fatal("a refused batch sent packets")
	}
	a.post(t, SendWR{ID: 7, Opcode: WRFetchAdd, Flags: SendSignaled, SGL: l8, RemoteAddr: rmr.IOVA() + ro, RKey: rmr.RKey(), CompareAdd: 1})
	f.run(time.Second)
	check(t, "requester", pollAll(a.scq), want{7, WCSuccess, WCFetchAdd})
}

// TestZeroLengthRDMAIgnoresRKey: IBA C9-88 — a zero-length RDMA WRITE or
// READ checks no rkey.
func TestZeroLengthRDMAIgnoresRKey(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	lmr, _ := a.n.reg(t, 64, allAccess)
	a.post(t,
		SendWR{ID: 1, Opcode: WRWrite, Flags: SendSignaled, RemoteAddr: 0xdead0000, RKey: 0xbadbad},
		SendWR{ID: 2, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, 0), RemoteAddr: 0xdead0000, RKey: 0xbadbad},
		SendWR{ID: 3, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, 0, 0), RemoteAddr: 1<<64 - 1, RKey: 0},
	)
	f.run(time.Second)
	check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCWrite}, want{2, WCSuccess, WCRead}, want{3, WCSuccess, WCWrite})
	if b.qp.State() != RTS {
		t.Fatalf("responder %v", b.qp.State())
	}
}

// TestBatchedACKAfterReadResponses: when a SEND and a READ reach the
// responder in one receive batch, the SEND's coalesced ACK leaves after
// the READ responses. The first response implicitly acknowledges the
// SEND; nothing may be retransmitted.
func TestBatchedACKAfterReadResponses(t *testing.T) {
	f, a, b := pair(t, RC, defaultConn())
	f.batch = true
	lmr, lbuf := a.n.reg(t, 8192, allAccess)
	rmr, rbuf := b.n.reg(t, 8192, allAccess)
	fastFill(rbuf, 8)
	var order []bth.Op
	f.tap = func(p wirePkt, pkt bth.Packet) {
		if p.dst == a.n.addr {
			order = append(order, pkt.Info.Op)
		}
	}
	b.recv(t, 1, rmr, 0, 100)
	a.post(t,
		SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 0, 100)},
		SendWR{ID: 2, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 4096, 3000), RemoteAddr: rmr.IOVA() + 4096, RKey: rmr.RKey()},
		SendWR{ID: 3, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 0, 0)},
	)
	b.recv(t, 2, rmr, 0, 0)
	f.run(time.Second)
	check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCSend}, want{2, WCSuccess, WCRead}, want{3, WCSuccess, WCSend})
	if len(order) == 0 || order[0] != bth.OpReadResponse {
		t.Fatalf("responses arrived as %v; the test needs the READ responses first", order)
	}
	if r, d := a.n.e.Stats.Retransmits.Load(), b.n.e.Stats.DuplicateRequest.Load(); r != 0 || d != 0 {
		t.Fatalf("%d retransmissions, %d duplicates", r, d)
	}
	b.n.e.Sync()
	if !bytes.Equal(lbuf[4096:7096], rbuf[4096:7096]) {
		t.Fatal("READ data differs")
	}
}

// TestRDMALengthOver2G: a READ or WRITE asking for more than 2^31 bytes is
// an invalid request (rxe's check_length), whatever the MR.
func TestRDMALengthOver2G(t *testing.T) {
	for _, op := range []WROpcode{WRRead, WRWrite} {
		f, a, b := pair(t, RC, defaultConn())
		lmr, _ := a.n.reg(t, 64, allAccess)
		rmr, _ := b.n.reg(t, 64, allAccess)
		// The requester cannot build such a request; the fabric rewrites
		// the RETH length of a legal one.
		f.drop = func(p wirePkt) bool {
			if pkt := parse(t, p); pkt.Info.Has(bth.First) && pkt.Info.Flags&bth.Request != 0 {
				binary.BigEndian.PutUint32(p.data[bth.Len+12:], 1<<31+1)
			}
			return false
		}
		a.post(t, SendWR{ID: 1, Opcode: op, Flags: SendSignaled, SGL: sge(lmr, 0, 8), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()})
		f.run(time.Second)
		check(t, op.String(), pollAll(a.scq), want{1, WCRemInvReqErr, wcOpcodeOf(op)})
		if b.qp.State() != Err {
			t.Fatalf("responder %v", b.qp.State())
		}
	}
}

// TestReadResponsesKeepTimerAlive: READ responses that arrive past a gap
// are of no use but show the responder at work: after the one gap retry
// they keep re-arming the retransmit timer, so a stream slower than the
// timeout in total starts no timeout retry (rxe's completer likewise), and
// the READ completes from the retry's responses.
func TestReadResponsesKeepTimerAlive(t *testing.T) {
	o := defaultConn()
	f, a, b := pair(t, RC, o)
	const size = 20 * 1024
	lmr, lbuf, rmr, rbuf := regBoth(t, a, b, size, size)
	fill(rbuf, 5)
	var responses []wirePkt
	capture := true
	f.drop = func(p wirePkt) bool {
		pkt, err := bth.Parse(p.data)
		if !capture || err != nil || pkt.Info.Op != bth.OpReadResponse {
			return false
		}
		responses = append(responses, wirePkt{data: append([]byte(nil), p.data...), src: p.src, dst: p.dst, tos: p.tos})
		return true
	}
	a.post(t, SendWR{ID: 9, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()})
	f.run(time.Microsecond) // the request reaches b; its 20 responses are held
	capture = false
	if len(responses) != 20 {
		t.Fatalf("%d READ responses held, want 20", len(responses))
	}
	timeout := ackTimeout(o.timeout)
	// All but the first, one every half timeout: 9.5 timeouts in all.
	for _, p := range responses[1:] {
		f.clock.now += timeout / 2
		a.n.e.Tick()
		f.deliver(p)
	}
	if got := a.n.e.Stats.CompleterRetryErr.Load(); got != 1 {
		t.Fatalf("completer_retry_err %d while responses kept coming, want 1 (the gap's retry)", got)
	}
	f.run(time.Second)
	check(t, "requester", pollAll(a.scq), want{9, WCSuccess, WCRead})
	if !bytes.Equal(lbuf, rbuf) {
		t.Fatal("READ data differs")
	}
	if got := a.n.e.Stats.CompleterRetryErr.Load(); got != 1 {
		t.Errorf("completer_retry_err %d at the end, want 1", got)
	}
}

// TestOneGapRetryPerRead: after a READ's gap starts a retry, a second gap
// (in the retried stream) starts none until the retransmit timer fires,
// as rxe's completer does (started_retry): a responder that keeps sending
// its earlier stream would otherwise meet every retry with another.
func TestOneGapRetryPerRead(t *testing.T) {
	o := defaultConn()
	f, a, b := pair(t, RC, o)
	const size = 20 * 1024
	lmr, lbuf, rmr, rbuf := regBoth(t, a, b, size, size)
	fill(rbuf, 6)
	first := bth.PSN(o.apsn)
	seen := map[bth.PSN]int{}
	f.drop = func(p wirePkt) bool {
		pkt, err := bth.Parse(p.data)
		if err != nil || pkt.Info.Op != bth.OpReadResponse {
			return false
		}
		psn := pkt.BTH().PSN()
		seen[psn]++
		// The first stream loses response 0, the retried one response 5.
		return psn == first && seen[psn] == 1 || psn == first.Add(5) && seen[psn] == 2
	}
	a.post(t, SendWR{ID: 3, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()})
	f.run(time.Second)
	check(t, "requester", pollAll(a.scq), want{3, WCSuccess, WCRead})
	if !bytes.Equal(lbuf, rbuf) {
		t.Fatal("READ data differs")
	}
	s := &a.n.e.Stats
	if seq, all := s.RcvdSeqErr.Load(), s.CompleterRetryErr.Load(); seq != 1 || all != 2 {
		t.Fatalf("rcvd_seq_err %d (gap retries), completer_retry_err %d; want 1 and 2 (the second gap waits for the timer)", seq, all)
	}
}

// TestNoResponderResources: a responder with max_dest_rd_atomic 0 refuses
// READ and atomics with an Invalid Request NAK (as rxe), the requester's
// WQE completes REM_INV_REQ_ERR, and the target memory is untouched.
func TestNoResponderResources(t *testing.T) {
	for _, op := range []WROpcode{WRRead, WRFetchAdd} {
		o := defaultConn()
		f, a, b := pair(t, RC, o)
		b.qp.attr.MaxDestRdAtomic = 0 // as if brought to RTR with 0
		lmr, _ := a.n.reg(t, 64, allAccess)
		rmr, rbuf := b.n.reg(t, 64, allAccess)
		fill(rbuf, 9)
		before := append([]byte(nil), rbuf...)
		wr := SendWR{ID: 4, Opcode: op, Flags: SendSignaled, SGL: sge(lmr, 0, 8), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey(), CompareAdd: 1}
		a.post(t, wr)
		f.run(time.Second)
		wcop := WCRead
		if op == WRFetchAdd {
			wcop = WCFetchAdd
		}
		check(t, op.String(), pollAll(a.scq), want{4, WCRemInvReqErr, wcop})
		b.n.e.Sync()
		if !bytes.Equal(rbuf, before) {
			t.Errorf("%v: responder memory changed", op)
		}
	}
}

// TestQueuedReads: READs that reach the responder while a long READ
// response is going out (it sends readBurst packets per turn) queue behind
// it and are answered in PSN order, instead of being dropped and NAKed for
// the requester to resend, as rxe's responder takes queued requests one
// after another. A SEND among them is still refused until the responses
// are out (its ACK must not pass them), and resent once.
func TestQueuedReads(t *testing.T) {
	o := defaultConn()
	f, a, b := pair(t, RC, o)
	a.n.e.cfg.Window = 1 << 16 // every request leaves at once
	f.batch = true
	const size, nread = 600 << 10, 4 // 600 packets each at MTU 1024
	a.n.e.cfg.ReadChunk = size       // each READ one request (readsplit.go): long responses
	lmr, lbuf, rmr, rbuf := regBoth(t, a, b, nread*size, nread*size+64)
	fastFill(rbuf, 21)
	next := bth.PSN(o.apsn)
	outOfOrder := 0
	f.tap = func(p wirePkt, pkt bth.Packet) {
		if p.dst == a.n.addr && pkt.Info.Op == bth.OpReadResponse {
			if pkt.BTH().PSN() != next {
				outOfOrder++
			}
			next = pkt.BTH().PSN().Add(1)
		}
	}
	wrs := readWRs(lmr, rmr, nread, size)
	b.recv(t, 9, rmr, nread*size, 64)
	wrs = append(wrs, SendWR{ID: 9, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 0, 64)})
	a.post(t, wrs...)
	f.run(time.Minute)
	check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCRead}, want{2, WCSuccess, WCRead},
		want{3, WCSuccess, WCRead}, want{4, WCSuccess, WCRead}, want{9, WCSuccess, WCSend})
	b.n.e.Sync()
	if !bytes.Equal(lbuf, rbuf[:nread*size]) {
		t.Fatal("READ data differs")
	}
	if outOfOrder != 0 {
		t.Errorf("%d READ responses out of PSN order", outOfOrder)
	}
	// Only the SEND was refused while the responses went out, and resent.
	if busy, dup := b.n.e.Stats.Drops[DropBusy].Load(), b.n.e.Stats.DuplicateRequest.Load(); busy != 1 || dup != 0 {
		t.Errorf("responder refused %d requests as busy, saw %d duplicates; want 1 (the SEND) and 0", busy, dup)
	}
	if got := b.n.e.Stats.RDMARecvs.Load(); got != nread {
		t.Errorf("responder executed %d READs, want %d", got, nread)
	}
}

// TestQueuedReadsRetry: a response of the first of several queued READs is
// lost. The requester resends from the gap, and then the READs after it;
// the responder restarts the first where asked and queues the others
// behind it again, rather than letting each resent READ replace the
// stream before it, so one retry completes them all.
func TestQueuedReadsRetry(t *testing.T) {
	o := defaultConn()
	f, a, b := pair(t, RC, o)
	a.n.e.cfg.Window = 1 << 16
	f.batch = true
	const size, nread = 600 << 10, 4
	lmr, lbuf, rmr, rbuf := regBoth(t, a, b, nread*size, nread*size)
	fastFill(rbuf, 22)
	lost := bth.PSN(o.apsn).Add(10)
	dropped := false
	f.drop = func(p wirePkt) bool {
		pkt, err := bth.Parse(p.data)
		if err != nil || dropped || pkt.Info.Op != bth.OpReadResponse || pkt.BTH().PSN() != lost {
			return false
		}
		dropped = true
		return true
	}
	wrs := readWRs(lmr, rmr, nread, size)
	a.post(t, wrs...)
	f.run(time.Minute)
	check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCRead}, want{2, WCSuccess, WCRead},
		want{3, WCSuccess, WCRead}, want{4, WCSuccess, WCRead})
	if !dropped {
		t.Fatal("no response was lost")
	}
	if !bytes.Equal(lbuf, rbuf) {
		t.Fatal("READ data differs")
	}
	if got := a.n.e.Stats.CompleterRetryErr.Load(); got != 1 {
		t.Errorf("%d retries, want 1", got)
	}
	if got := b.n.e.Stats.Drops[DropBusy].Load(); got != 0 {
		t.Errorf("responder refused %d requests as busy", got)
	}
}

// regBoth registers an MR of lsize bytes on a's node and one of rsize
// bytes on b's, with every access.
func regBoth(t *testing.T, a, b *endpoint, lsize, rsize int) (lmr *mr.MR, lbuf []byte, rmr *mr.MR, rbuf []byte) {
	t.Helper()
	lmr, lbuf = a.n.reg(t, lsize, allAccess)
	rmr, rbuf = b.n.reg(t, rsize, allAccess)
	return lmr, lbuf, rmr, rbuf
}

// readWRs are n signaled READs of size bytes each, IDs 1..n, the i-th
// reading rmr at i*size into lmr at i*size.
func readWRs(lmr, rmr *mr.MR, n, size int) []SendWR {
	var wrs []SendWR
	for i := range n {
		wrs = append(wrs, SendWR{ID: uint64(i + 1), Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, i*size, size),
			RemoteAddr: rmr.IOVA() + uint64(i*size), RKey: rmr.RKey()})
	}
	return wrs
}

// TestReadPacing: READ responses into a requester behind a slow link (a
// queue of 64 packets drained at 50,000 packets a second, about 0.4 Gb/s
// at MTU 1024) that drops what overflows. Unpaced, the responder bursts
// every response at once and most are lost and asked for again; paced
// after the first re-issued READ, the waste stays small. Every READ
// completes with the right bytes either way.
func TestReadPacing(t *testing.T) {
	const (
		size, nread = 1 << 20, 8
		queue       = 64.0
		drain       = 50_000.0 / float64(time.Second) // packets per ns
	)
	o := defaultConn()
	f, a, b := pair(t, RC, o)
	lmr, lbuf, rmr, rbuf := regBoth(t, a, b, nread*size, nread*size)
	fastFill(rbuf, 23)
	var level float64
	var last time.Duration
	sent, passed := 0, 0
	f.drop = func(p wirePkt) bool {
		pkt, err := bth.Parse(p.data)
		if err != nil || pkt.Info.Op != bth.OpReadResponse {
			return false
		}
		sent++
		level = max(0, level-float64(f.clock.now-last)*drain)
		last = f.clock.now
		if level+1 > queue {
			return true
		}
		level++
		passed++
		return false
	}
	start := f.clock.now
	a.post(t, readWRs(lmr, rmr, nread, size)...)
	f.run(time.Minute)
	var wants []want
	for i := range nread {
		wants = append(wants, want{uint64(i + 1), WCSuccess, WCRead})
	}
	check(t, "requester", pollAll(a.scq), wants...)
	b.n.e.Sync()
	if !bytes.Equal(lbuf, rbuf) {
		t.Fatal("READ data differs")
	}
	took := f.clock.now - start
	reissued := b.n.e.Stats.DuplicateRequest.Load()
	t.Logf("%d READ responses sent for %d that passed (%.2fx), %d READs re-issued, %v of virtual time (the link alone: %v)",
		sent, passed, float64(sent)/float64(passed), reissued, took, time.Duration(float64(passed)/drain))
	if float64(sent) > 1.5*float64(passed) {
		t.Errorf("%d responses sent for %d that passed: not paced", sent, passed)
	}
}

// TestReadRetryCrossingItsResponses: a READ request and a copy of it that
// reach the responder in one receive batch (the requester asked again
// while its first request still sat in the responder's socket) get their
// responses once, and the copy is not taken for a loss: the responses stay
// unpaced. The same copy a batch later is a retry like any other: the
// responses go again, paced.
func TestReadRetryCrossingItsResponses(t *testing.T) {
	const size = 20 * 1024 // 20 responses at MTU 1024
	for _, later := range []bool{false, true} {
		o := defaultConn()
		f, a, b := pair(t, RC, o)
		f.batch = true
		isRead := func(p wirePkt) bool {
			pkt, err := bth.Parse(append([]byte(nil), p.data...))
			return err == nil && pkt.Info.Op == bth.OpReadRequest
		}
		copies := 0
		f.dupIf = func(p wirePkt) bool {
			if isRead(p) && copies == 0 {
				copies++
				return true
			}
			return false
		}
		if later {
			// The copy (the second READ request on the wire) arrives
			// 10 us after the first, in a batch of its own.
			reads := 0
			f.delay = func(p wirePkt) time.Duration {
				if isRead(p) {
					if reads++; reads == 2 {
						return 10 * time.Microsecond
					}
				}
				return 0
			}
		}
		responses := 0
		f.tap = func(p wirePkt, pkt bth.Packet) {
			if pkt.Info.Op == bth.OpReadResponse {
				responses++
			}
		}
		lmr, lbuf, rmr, rbuf := regBoth(t, a, b, size, size)
		fill(rbuf, 7)
		a.post(t, SendWR{ID: 1, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()})
		f.run(time.Second)
		check(t, "requester", pollAll(a.scq), want{1, WCSuccess, WCRead})
		if !bytes.Equal(lbuf, rbuf) {
			t.Fatalf("later=%v: READ data differs", later)
		}
		if got := b.n.e.Stats.DuplicateRequest.Load(); got != 1 {
			t.Errorf("later=%v: duplicate_request %d, want 1", later, got)
		}
		paced := b.qp.resp.rp.rate != 0
		if !later && (responses != 20 || paced) {
			t.Errorf("copy in the same batch: %d responses (want 20), paced %v (want not)", responses, paced)
		}
		if later && (responses != 40 || !paced) {
			t.Errorf("copy a batch later: %d responses (want 40, replayed), paced %v (want paced)", responses, paced)
		}
	}
}
