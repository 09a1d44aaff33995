package qp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"
)

// TestMTUSizeMatrix runs SEND, SEND with immediate, WRITE, WRITE with
// immediate and READ at every path MTU with messages of 0, 1, MTU-1, MTU,
// MTU+1 bytes and 1 MiB, each starting two PSNs below the 24-bit wrap;
// then both atomics across the wrap.
func TestMTUSizeMatrix(t *testing.T) {
	ops := []WROpcode{WRSend, WRSendImm, WRWrite, WRWriteImm, WRRead}
	for mtu := MTU256; mtu <= MTU4096; mtu++ {
		m := mtu.Bytes()
		for _, size := range []int{0, 1, m - 1, m, m + 1, 1 << 20} {
			for _, op := range ops {
				name := fmt.Sprintf("mtu %d size %d %v", m, size, op)
				o := defaultConn()
				o.mtu, o.apsn, o.bpsn = mtu, 0xfffffe, 0xfffffd
				f, a, b := pair(t, RC, o)
				lmr, lbuf := a.n.reg(t, size+1, allAccess)
				rmr, rbuf := b.n.reg(t, size+1, allAccess)
				fastFill(lbuf, uint64(size))
				fastFill(rbuf, uint64(size)+1)
				lbuf[size], rbuf[size] = 0xee, 0xee // a guard byte past the message
				b.recv(t, 1, rmr, 0, size)
				a.post(t, SendWR{ID: 2, Opcode: op, Imm: uint32(size), Flags: SendSignaled, SGL: sge(lmr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()})
				f.run(10 * time.Second)
				sw := pollAll(a.scq)
				if len(sw) != 1 || sw[0].Status != WCSuccess || sw[0].Opcode != wcOpcodeOf(op) || op == WRRead && sw[0].ByteLen != uint32(size) {
					t.Fatalf("%s: send completions %s", name, fmtWCs(sw))
				}
				rw := pollAll(b.rcq)
				switch op {
				case WRSend, WRSendImm, WRWriteImm:
					wop := WCRecv
					if op == WRWriteImm {
						wop = WCRecvRDMAImm
					}
					imm := op != WRSend
					if len(rw) != 1 || rw[0].Status != WCSuccess || rw[0].Opcode != wop || rw[0].ByteLen != uint32(size) ||
						imm != (rw[0].Flags&WCWithImm != 0) || imm && rw[0].Imm != uint32(size) {
						t.Fatalf("%s: receive completions %+v", name, rw)
					}
				default:
					if len(rw) != 0 {
						t.Fatalf("%s: receive completions %+v", name, rw)
					}
				}
				b.n.e.Sync()
				if !bytes.Equal(lbuf[:size], rbuf[:size]) || lbuf[size] != 0xee || rbuf[size] != 0xee {
					t.Fatalf("%s: data differs or the guard byte changed", name)
				}
			}
		}
		// Atomics at PSNs 0xffffff, 0 and 1.
		o := defaultConn()
		o.mtu, o.apsn = mtu, 0xffffff
		f, a, b := pair(t, RC, o)
		lmr, lbuf := a.n.reg(t, 64, allAccess)
		rmr, rbuf := b.n.reg(t, 64, allAccess)
		lo, ro := aligned8(lmr, 0), aligned8(rmr, 0)
		binary.LittleEndian.PutUint64(rbuf[ro:], 10)
		at := func(id uint64, op WROpcode, cmp, swap uint64, res int) SendWR {
			return SendWR{ID: id, Opcode: op, Flags: SendSignaled, SGL: sge(lmr, lo+res, 8), RemoteAddr: rmr.IOVA() + uint64(ro), RKey: rmr.RKey(), CompareAdd: cmp, Swap: swap}
		}
		a.post(t, at(1, WRFetchAdd, 5, 0, 0), at(2, WRCompareSwap, 15, 100, 8), at(3, WRFetchAdd, 1, 0, 16))
		f.run(time.Second)
		check(t, "atomics across the wrap", pollAll(a.scq), want{1, WCSuccess, WCFetchAdd}, want{2, WCSuccess, WCCompareSwap}, want{3, WCSuccess, WCFetchAdd})
		b.n.e.Sync()
		if binary.LittleEndian.Uint64(lbuf[lo:]) != 10 || binary.LittleEndian.Uint64(lbuf[lo+8:]) != 15 ||
			binary.LittleEndian.Uint64(lbuf[lo+16:]) != 100 || binary.LittleEndian.Uint64(rbuf[ro:]) != 101 {
			t.Fatalf("mtu %d: atomic results % x, target %d", m, lbuf[lo:lo+24], binary.LittleEndian.Uint64(rbuf[ro:]))
		}
	}
}

// TestHugeWriteRead moves 64 MiB each way once, with a WRITE and a READ.
func TestHugeWriteRead(t *testing.T) {
	if testing.Short() {
		t.Skip("64 MiB transfer")
	}
	const size = 64 << 20
	o := defaultConn()
	o.mtu, o.apsn, o.bpsn = MTU4096, 0xfff000, 0xfff000
	f, a, b := pair(t, RC, o)
	lmr, lbuf := a.n.reg(t, 2*size, allAccess)
	rmr, rbuf := b.n.reg(t, 2*size, allAccess)
	fastFill(lbuf[:size], 64)
	fastFill(rbuf[size:], 65)
	a.post(t,
		SendWR{ID: 1, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
		SendWR{ID: 2, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, size, size), RemoteAddr: rmr.IOVA() + size, RKey: rmr.RKey()},
	)
	f.run(time.Minute)
	sw := pollAll(a.scq)
	check(t, "requester", sw, want{1, WCSuccess, WCWrite}, want{2, WCSuccess, WCRead})
	if sw[1].ByteLen != size {
		t.Fatalf("READ byte_len %d", sw[1].ByteLen)
	}
	b.n.e.Sync()
	if !bytes.Equal(lbuf[:size], rbuf[:size]) || !bytes.Equal(lbuf[size:], rbuf[size:]) {
		t.Fatal("data differs")
	}
}

// TestManyQPs runs 200 RC QP pairs between two engines at once, with
// traffic in both directions interleaved across them: SENDs, WRITEs,
// READs and fetch-adds on one shared counter, every QP's PSNs starting
// near the wrap.
func TestManyQPs(t *testing.T) {
	const nqp, slot = 200, 16 << 10
	f := newFabric(t)
	na, nb := f.node("198.18.0.1"), f.node("198.18.0.2")
	amr, abuf := na.reg(t, nqp*slot, allAccess)
	bmr, bbuf := nb.reg(t, nqp*slot+64, allAccess)
	fastFill(abuf, 100)
	fastFill(bbuf, 200)
	wantB := append([]byte(nil), bbuf...)
	wantA := append([]byte(nil), abuf...)
	ctr := aligned8(bmr, nqp*slot)
	binary.LittleEndian.PutUint64(bbuf[ctr:], 0)
	binary.LittleEndian.PutUint64(wantB[ctr:], nqp)
	var as, bs []*endpoint
	for i := 0; i < nqp; i++ {
		a, b := na.newQP(t, RC, 8), nb.newQP(t, RC, 8)
		o := defaultConn()
		o.apsn, o.bpsn = uint32(0xffffff-i%7), uint32(0xfffff0+i%16)
		connect(t, a, b, o)
		as, bs = append(as, a), append(bs, b)
	}
	// Slot layout: [0,3000) SEND a->b, [3000,8000) WRITE a->b,
	// [8000,15000) READ b->a, [15000,16000) SEND b->a.
	for i := 0; i < nqp; i++ {
		base := i * slot
		bs[i].recv(t, 1, bmr, base, 3000)
		as[i].recv(t, 1, amr, base+15000, 1000)
		copy(wantB[base:base+8000], abuf[base:base+8000])
		copy(wantA[base+8000:base+15000], bbuf[base+8000:base+15000])
		copy(wantA[base+15000:base+16000], bbuf[base+15000:base+16000])
	}
	for i := 0; i < nqp; i++ {
		base := i * slot
		a, b := as[i], bs[i]
		a.post(t,
			SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(amr, base, 3000)},
			SendWR{ID: 2, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(amr, base+3000, 5000), RemoteAddr: bmr.IOVA() + uint64(base+3000), RKey: bmr.RKey()},
			SendWR{ID: 3, Opcode: WRRead, Flags: SendSignaled, SGL: sge(amr, base+8000, 7000), RemoteAddr: bmr.IOVA() + uint64(base+8000), RKey: bmr.RKey()},
			SendWR{ID: 4, Opcode: WRFetchAdd, Flags: SendSignaled, SGL: sge(amr, aligned8(amr, base+16100), 8), RemoteAddr: bmr.IOVA() + uint64(ctr), RKey: bmr.RKey(), CompareAdd: 1},
		)
		b.post(t, SendWR{ID: 5, Opcode: WRSend, Flags: SendSignaled, SGL: sge(bmr, base+15000, 1000)})
	}
	f.run(10 * time.Second)
	for i := 0; i < nqp; i++ {
		check(t, fmt.Sprintf("QP %d a", i), pollAll(as[i].scq), want{1, WCSuccess, WCSend}, want{2, WCSuccess, WCWrite}, want{3, WCSuccess, WCRead}, want{4, WCSuccess, WCFetchAdd})
		check(t, fmt.Sprintf("QP %d b", i), pollAll(bs[i].scq), want{5, WCSuccess, WCSend})
		check(t, fmt.Sprintf("QP %d a recv", i), pollAll(as[i].rcq), want{1, WCSuccess, WCRecv})
		check(t, fmt.Sprintf("QP %d b recv", i), pollAll(bs[i].rcq), want{1, WCSuccess, WCRecv})
	}
	na.e.Sync()
	nb.e.Sync()
	if !bytes.Equal(bbuf, wantB) {
		t.Fatal("responder memory differs")
	}
	seen := map[uint64]bool{}
	for i := 0; i < nqp; i++ {
		base := i * slot
		v := binary.LittleEndian.Uint64(abuf[aligned8(amr, base+16100):])
		if v >= nqp || seen[v] {
			t.Fatalf("QP %d fetch-add returned %d (twice, or out of range)", i, v)
		}
		seen[v] = true
		if !bytes.Equal(abuf[base:base+16000], wantA[base:base+16000]) {
			t.Fatalf("QP %d: requester memory differs", i)
		}
	}
}
