package qp

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

func pair(t *testing.T, typ Type, o connOpts) (*fabric, *endpoint, *endpoint) {
	f := newFabric(t)
	a := f.node("198.18.0.1").newQP(t, typ, 64)
	b := f.node("198.18.0.2").newQP(t, typ, 64)
	if typ != UD {
		connect(t, a, b, o)
	}
	return f, a, b
}

func TestRCSendSizes(t *testing.T) {
	for _, mtu := range []MTU{MTU256, MTU1024, MTU4096} {
		m := mtu.Bytes()
		for _, size := range []int{0, 1, m - 1, m, m + 1, 3*m + 7, 1 << 20} {
			o := defaultConn()
			o.mtu = mtu
			o.apsn = 0xffffff - 2 // wrap the PSN space during the message
			f, a, b := pair(t, RC, o)
			smr, sbuf := a.n.reg(t, max(size, 1), allAccess)
			rmr, rbuf := b.n.reg(t, max(size, 1)+16, allAccess)
			fill(sbuf, uint64(size))
			if err := b.qp.PostRecv(RecvWR{ID: 7, SGL: sge(rmr, 0, size+16)}); err != nil {
				t.Fatal(err)
			}
			if err := a.qp.PostSend(SendWR{ID: 9, Opcode: WRSendImm, Imm: 0xdeadbeef, Flags: SendSignaled, SGL: sge(smr, 0, size)}); err != nil {
				t.Fatal(err)
			}
			f.run(time.Second)
			sw, rw := pollAll(a.scq), pollAll(b.rcq)
			if len(sw) != 1 || sw[0].Status != WCSuccess || sw[0].ID != 9 || sw[0].Opcode != WCSend {
				t.Fatalf("mtu %d size %d: send completions %+v", m, size, sw)
			}
			if len(rw) != 1 || rw[0].Status != WCSuccess || rw[0].ID != 7 || rw[0].ByteLen != uint32(size) ||
				rw[0].Imm != 0xdeadbeef || rw[0].Flags&WCWithImm == 0 || rw[0].Opcode != WCRecv || rw[0].SrcQP != a.qp.Num() {
				t.Fatalf("mtu %d size %d: recv completions %+v", m, size, rw)
			}
			if !bytes.Equal(rbuf[:size], sbuf[:size]) {
				t.Fatalf("mtu %d size %d: data differs", m, size)
			}
		}
	}
}

func TestRCWriteReadAtomics(t *testing.T) {
	o := defaultConn()
	f, a, b := pair(t, RC, o)
	const size = 70_000
	lmr, lbuf := a.n.reg(t, 2*size+64, allAccess)
	rmr, rbuf := b.n.reg(t, 2*size+64, allAccess)
	fill(lbuf[:size], 1)
	fill(rbuf[size:2*size], 2)
	// WRITE lbuf[0:size] -> rbuf[0:size]; READ rbuf[size:2size] -> lbuf[size:2size]
	err := a.qp.PostSend(
		SendWR{ID: 1, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, 0, size), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
		SendWR{ID: 2, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, size, size), RemoteAddr: rmr.IOVA() + size, RKey: rmr.RKey()},
	)
	if err != nil {
		t.Fatal(err)
	}
	f.run(time.Second)
	wcs := pollAll(a.scq)
	if len(wcs) != 2 || wcs[0].ID != 1 || wcs[0].Status != WCSuccess || wcs[0].Opcode != WCWrite ||
		wcs[1].ID != 2 || wcs[1].Status != WCSuccess || wcs[1].Opcode != WCRead || wcs[1].ByteLen != size {
		t.Fatalf("completions %+v", wcs)
	}
	if r := pollAll(b.rcq); len(r) != 0 {
		t.Fatalf("WRITE made a receiver completion: %+v", r)
	}
	b.n.e.Sync()
	if !bytes.Equal(rbuf[:size], lbuf[:size]) || !bytes.Equal(lbuf[size:2*size], rbuf[size:2*size]) {
		t.Fatal("data differs")
	}
	// Atomics on an 8-aligned word of rbuf.
	off := 2*size + (8-int(rmr.IOVA()+2*size)%8)%8
	binary.LittleEndian.PutUint64(rbuf[off:], 1000)
	res := 2*size + (8-int(lmr.IOVA()+2*size)%8)%8
	err = a.qp.PostSend(
		SendWR{ID: 3, Opcode: WRFetchAdd, Flags: SendSignaled, SGL: sge(lmr, res, 8), RemoteAddr: rmr.IOVA() + uint64(off), RKey: rmr.RKey(), CompareAdd: 5},
	)
	if err != nil {
		t.Fatal(err)
	}
	f.run(time.Second)
	wcs = pollAll(a.scq)
	if len(wcs) != 1 || wcs[0].Status != WCSuccess || wcs[0].Opcode != WCFetchAdd {
		t.Fatalf("fetch-add completion %+v", wcs)
	}
	if got := binary.LittleEndian.Uint64(lbuf[res:]); got != 1000 {
		t.Fatalf("fetch-add returned %d", got)
	}
	b.n.e.Sync()
	if got := binary.LittleEndian.Uint64(rbuf[off:]); got != 1005 {
		t.Fatalf("remote counter %d", got)
	}
	err = a.qp.PostSend(
		SendWR{ID: 4, Opcode: WRCompareSwap, Flags: SendSignaled, SGL: sge(lmr, res, 8), RemoteAddr: rmr.IOVA() + uint64(off), RKey: rmr.RKey(), CompareAdd: 1005, Swap: 42},
		SendWR{ID: 5, Opcode: WRCompareSwap, Flags: SendSignaled, SGL: sge(lmr, res, 8), RemoteAddr: rmr.IOVA() + uint64(off), RKey: rmr.RKey(), CompareAdd: 1005, Swap: 43},
	)
	if err != nil {
		t.Fatal(err)
	}
	f.run(time.Second)
	wcs = pollAll(a.scq)
	if len(wcs) != 2 || wcs[1].Status != WCSuccess {
		t.Fatalf("cas completions %+v", wcs)
	}
	b.n.e.Sync()
	if got := binary.LittleEndian.Uint64(rbuf[off:]); got != 42 {
		t.Fatalf("after CAS hit and miss: %d", got)
	}
	if got := binary.LittleEndian.Uint64(lbuf[res:]); got != 42 {
		t.Fatalf("second CAS returned %d, want 42 (the miss sees the swapped value)", got)
	}
}
