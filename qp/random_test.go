package qp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rxego/rxego/mr"
)

// TestRandomWorkloads runs seeded random mixes of every RC operation —
// random sizes, fences, unsignaled WRs, receives posted late (RNR), small
// max_rd_atomic, any MTU, PSNs near the wrap, batched or per-packet
// delivery, loss, duplication and reordering — and checks every
// completion and every byte against a model. Each WR has its own remote
// region, so the model does not depend on timing.
func TestRandomWorkloads(t *testing.T) {
	seeds := 12
	if testing.Short() {
		seeds = 4
	}
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runRandomWorkload(t, seed) })
	}
}

func runRandomWorkload(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	o := defaultConn()
	o.mtu = MTU(1 + rng.IntN(5))
	o.apsn = uint32(0xffffff - rng.IntN(64))
	o.bpsn = uint32(rng.IntN(1 << 24))
	o.rdAtomic = uint8(1 + rng.IntN(4))
	o.timeout, o.minRN = 8, 1
	f, a, b := pair(t, RC, o)
	f.rng = rand.New(rand.NewPCG(seed, 7))
	f.batch = rng.IntN(2) == 0
	loss, dup, reorder := []float64{0, 0.01, 0.03}[rng.IntN(3)], []float64{0, 0.02}[rng.IntN(2)], []float64{0, 0.05}[rng.IntN(2)]
	f.dup, f.reorder = dup, reorder
	f.drop = func(wirePkt) bool { return f.rng.Float64() < loss }
	mtu := o.mtu.Bytes()
	const nwr, region = 120, 3 * 4096
	lmr, lbuf := a.n.reg(t, nwr*region+64, allAccess)
	rmr, rbuf := b.n.reg(t, nwr*region+64, allAccess)
	fastFill(lbuf, seed)
	fastFill(rbuf, seed+1000)
	wantR := append([]byte(nil), rbuf...)
	wantL := append([]byte(nil), lbuf...)
	ctr := aligned8(rmr, nwr*region)
	binary.LittleEndian.PutUint64(rbuf[ctr:], 0)
	binary.LittleEndian.PutUint64(wantR[ctr:], 0)

	type recvWant struct {
		id   uint64
		op   WCOpcode
		n    int
		imm  uint32
		hasI bool
		inv  uint32 // rkey a SEND with invalidate invalidated
	}
	var wantSend []want
	var wantRecv []recvWant
	var pendingRecv []RecvWR // posted late, to provoke RNR
	type inv struct {
		ep *endpoint
		m  *mr.MR
	}
	var invalidated []inv
	var casResults [][2]uint64 // local offset, the value it must hold
	adds := uint64(0)
	for i := 0; i < nwr; i++ {
		off := i * region
		size := []int{0, 1, mtu - 1, mtu, mtu + 1, rng.IntN(region)}[rng.IntN(6)]
		wr := SendWR{ID: uint64(i), SGL: sge(lmr, off, size), RemoteAddr: rmr.IOVA() + uint64(off), RKey: rmr.RKey(), Imm: uint32(i)}
		if rng.IntN(4) != 0 {
			wr.Flags |= SendSignaled
		}
		if rng.IntN(8) == 0 {
			wr.Flags |= SendFence
		}
		switch k := rng.IntN(12); k {
		case 0, 1: // SEND, SEND with immediate into region i of b
			wr.Opcode = WRSend
			if k == 1 {
				wr.Opcode = WRSendImm
			}
			pendingRecv = append(pendingRecv, RecvWR{ID: uint64(i), SGL: sge(rmr, off, region)})
			wantRecv = append(wantRecv, recvWant{id: uint64(i), op: WCRecv, n: size, imm: uint32(i), hasI: k == 1})
			copy(wantR[off:off+size], lbuf[off:off+size])
		case 2, 3: // WRITE, WRITE with immediate
			wr.Opcode = WRWrite
			if k == 3 {
				wr.Opcode = WRWriteImm
				pendingRecv = append(pendingRecv, RecvWR{ID: uint64(i)})
				wantRecv = append(wantRecv, recvWant{id: uint64(i), op: WCRecvRDMAImm, n: size, imm: uint32(i), hasI: true})
			}
			copy(wantR[off:off+size], lbuf[off:off+size])
		case 4, 5: // READ region i of b into region i of a
			wr.Opcode = WRRead
			copy(wantL[off:off+size], rbuf[off:off+size])
		case 6: // fetch-add on the shared counter, result into region i of a
			wr = SendWR{ID: uint64(i), Opcode: WRFetchAdd, Flags: wr.Flags, SGL: sge(lmr, aligned8(lmr, off), 8),
				RemoteAddr: rmr.IOVA() + uint64(ctr), RKey: rmr.RKey(), CompareAdd: uint64(1 + rng.IntN(9))}
			adds += wr.CompareAdd
		case 7: // ATOMIC WRITE into region i
			at := aligned8(rmr, off)
			wr = SendWR{ID: uint64(i), Opcode: WRAtomicWrite, Flags: wr.Flags, RemoteAddr: rmr.IOVA() + uint64(at), RKey: rmr.RKey()}
			binary.NativeEndian.PutUint64(wr.AtomicValue[:], rng.Uint64())
			copy(wantR[at:at+8], wr.AtomicValue[:])
		case 8:
			wr = SendWR{ID: uint64(i), Opcode: WRFlush, Flags: wr.Flags, RemoteAddr: rmr.IOVA() + uint64(off), RKey: rmr.RKey(), FlushLength: region, FlushType: 1}
		case 9: // LOCAL_INV of an MR of a's own
			m, err := a.n.pd.Register(make([]byte, 8), allAccess, mr.WithInvalidate())
			if err != nil {
				t.Fatal(err)
			}
			invalidated = append(invalidated, inv{a, m})
			wr = SendWR{ID: uint64(i), Opcode: WRLocalInv, Flags: wr.Flags, InvalidateRKey: m.LKey()}
		case 10: // SEND with invalidate of an MR of b's
			m, err := b.n.pd.Register(make([]byte, 8), allAccess, mr.WithInvalidate())
			if err != nil {
				t.Fatal(err)
			}
			invalidated = append(invalidated, inv{b, m})
			wr.Opcode, wr.InvalidateRKey = WRSendInv, m.RKey()
			pendingRecv = append(pendingRecv, RecvWR{ID: uint64(i), SGL: sge(rmr, off, region)})
			wantRecv = append(wantRecv, recvWant{id: uint64(i), op: WCRecv, n: size, inv: m.RKey()})
			copy(wantR[off:off+size], lbuf[off:off+size])
		case 11: // compare-and-swap on region i's first word: it hits
			at, lat := aligned8(rmr, off), aligned8(lmr, off)
			old := binary.NativeEndian.Uint64(rbuf[at:])
			wr = SendWR{ID: uint64(i), Opcode: WRCompareSwap, Flags: wr.Flags, SGL: sge(lmr, lat, 8),
				RemoteAddr: rmr.IOVA() + uint64(at), RKey: rmr.RKey(), CompareAdd: old, Swap: rng.Uint64()}
			binary.NativeEndian.PutUint64(wantR[at:], wr.Swap)
			casResults = append(casResults, [2]uint64{uint64(lat), old})
		}
		if wr.Flags&SendSignaled != 0 {
			wantSend = append(wantSend, want{wr.ID, WCSuccess, wcOpcodeOf(wr.Opcode)})
		}
		// postRecvs lets the receiver post up to k of its late receives.
		postRecvs := func(k int) {
			k = min(k, len(pendingRecv))
			if k > 0 && b.qp.PostRecv(pendingRecv[:k]...) == nil {
				pendingRecv = pendingRecv[k:]
			}
		}
		for tries := 0; ; tries++ {
			err := a.qp.PostSend(wr)
			if err == nil {
				break
			}
			if tries > 10000 || err != ErrQueueFull {
				t.Fatalf("%v at %v: send queue never drained:\n%s\n%s", err, f.clock.now, dumpQP(a.qp), dumpQP(b.qp))
			}
			postRecvs(8)
			f.runFor(time.Millisecond)
		}
		// The receiver posts its receives late, in small bursts.
		if rng.IntN(3) == 0 && len(pendingRecv) > 0 {
			postRecvs(1 + rng.IntN(len(pendingRecv)))
		}
		if rng.IntN(4) == 0 {
			f.runFor(time.Duration(rng.IntN(200)) * time.Microsecond)
		}
	}
	for tries := 0; len(pendingRecv) > 0; tries++ {
		if tries > 10000 {
			t.Fatal("receive queue never drained")
		}
		if err := b.qp.PostRecv(pendingRecv[0]); err == nil {
			pendingRecv = pendingRecv[1:]
		} else {
			f.runFor(time.Millisecond)
		}
	}
	f.run(time.Minute)
	what := fmt.Sprintf("seed %d (mtu %d, rd_atomic %d, batch %v, loss %v dup %v reorder %v)", seed, mtu, o.rdAtomic, f.batch, loss, dup, reorder)
	check(t, what+" send CQ", pollAll(a.scq), wantSend...)
	rw := pollAll(b.rcq)
	if len(rw) != len(wantRecv) {
		t.Fatalf("%s: %d of %d receive completions", what, len(rw), len(wantRecv))
	}
	for i, w := range wantRecv {
		wc := rw[i]
		if wc.ID != w.id || wc.Status != WCSuccess || wc.Opcode != w.op || wc.ByteLen != uint32(w.n) ||
			w.hasI != (wc.Flags&WCWithImm != 0) || w.hasI && wc.Imm != w.imm ||
			(w.inv != 0) != (wc.Flags&WCWithInv != 0) || wc.InvalidatedRKey != w.inv {
			t.Fatalf("%s: receive %d: %+v, want %+v", what, i, wc, w)
		}
	}
	a.n.e.Sync()
	b.n.e.Sync()
	binary.LittleEndian.PutUint64(wantR[ctr:], adds)
	if i := firstDiff(rbuf, wantR); i >= 0 {
		t.Fatalf("%s: responder memory differs at %d (region %d)", what, i, i/region)
	}
	for _, c := range casResults {
		if got := binary.NativeEndian.Uint64(lbuf[c[0]:]); got != c[1] {
			t.Fatalf("%s: compare-and-swap returned %#x, want %#x", what, got, c[1])
		}
		binary.NativeEndian.PutUint64(wantL[c[0]:], c[1])
	}
	for _, v := range invalidated {
		if _, err := v.ep.n.mrs.Local(v.m.LKey(), v.ep.n.pd, v.m.IOVA(), 8, 0); err == nil {
			t.Fatalf("%s: an MR was not invalidated", what)
		}
	}
	// Fetch-add results are timing-dependent; check the rest of a.
	for i := 0; i < nwr; i++ {
		off := i * region
		at := aligned8(lmr, off)
		if !bytes.Equal(lbuf[off:at], wantL[off:at]) || !bytes.Equal(lbuf[at+8:off+region], wantL[at+8:off+region]) {
			t.Fatalf("%s: requester region %d differs", what, i)
		}
	}
	if a.qp.State() != RTS || b.qp.State() != RTS {
		t.Fatalf("%s: states %v/%v", what, a.qp.State(), b.qp.State())
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}
