package qp

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// TestRCUnderImpairment runs every RC operation across a lossy,
// duplicating, reordering fabric and checks every byte and completion.
func TestRCUnderImpairment(t *testing.T) {
	cases := []struct {
		name    string
		loss    float64
		dup     float64
		reorder float64
	}{
		{"loss1", 0.01, 0, 0}, {"loss5", 0.05, 0, 0}, {"loss10", 0.10, 0, 0},
		{"dup", 0, 0.05, 0}, {"reorder", 0, 0, 0.05}, {"all", 0.05, 0.05, 0.05},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := defaultConn()
			o.timeout = 8 // ~1 ms
			o.apsn = 0xfffff0
			f, a, b := pair(t, RC, o)
			f.dup, f.reorder = c.dup, c.reorder
			f.drop = func(wirePkt) bool { return f.rng.Float64() < c.loss }
			const msgs, size = 300, 3000
			lmr, lbuf := a.n.reg(t, msgs*size+4096, allAccess)
			rmr, rbuf := b.n.reg(t, msgs*size+4096, allAccess)
			fill(lbuf, 11)
			fill(rbuf, 12)
			want := append([]byte(nil), rbuf...)
			counterOff := msgs*size + (8-int(rmr.IOVA()+msgs*size)%8)%8
			binary.LittleEndian.PutUint64(rbuf[counterOff:], 0)
			binary.LittleEndian.PutUint64(want[counterOff:], 0)
			resOff := msgs*size + (8-int(lmr.IOVA()+msgs*size)%8)%8
			posted := 0
			var recvs int
			for i := 0; i < msgs; i++ {
				off := i * size
				var wr SendWR
				switch i % 5 {
				case 0: // SEND into rbuf slot
					if err := b.qp.PostRecv(RecvWR{ID: uint64(i), SGL: sge(rmr, off, size)}); err != nil {
						t.Fatal(err)
					}
					recvs++
					copy(want[off:off+size], lbuf[off:off+size])
					wr = SendWR{Opcode: WRSend, SGL: sge(lmr, off, size)}
				case 1, 2: // WRITE
					copy(want[off:off+size], lbuf[off:off+size])
					wr = SendWR{Opcode: WRWrite, SGL: sge(lmr, off, size), RemoteAddr: rmr.IOVA() + uint64(off), RKey: rmr.RKey()}
				case 3: // READ rbuf slot back into lbuf slot
					wr = SendWR{Opcode: WRRead, SGL: sge(lmr, off, size), RemoteAddr: rmr.IOVA() + uint64(off), RKey: rmr.RKey()}
				case 4:
					wr = SendWR{Opcode: WRFetchAdd, SGL: sge(lmr, resOff, 8), RemoteAddr: rmr.IOVA() + uint64(counterOff), RKey: rmr.RKey(), CompareAdd: 1}
				}
				wr.ID = uint64(i)
				wr.Flags = SendSignaled
				for {
					err := a.qp.PostSend(wr)
					if err == nil {
						break
					}
					if err != ErrQueueFull {
						t.Fatal(err)
					}
					f.run(10 * time.Millisecond)
					posted += len(pollAllCheck(t, a.scq))
				}
			}
			f.run(10 * time.Second)
			posted += len(pollAllCheck(t, a.scq))
			if posted != msgs {
				t.Fatalf("%d of %d send completions (state %v, dropped %d)", posted, msgs, a.qp.State(), f.dropped)
			}
			rw := pollAllCheck(t, b.rcq)
			if len(rw) != recvs {
				t.Fatalf("%d of %d receive completions", len(rw), recvs)
			}
			b.n.e.Sync()
			binary.LittleEndian.PutUint64(want[counterOff:], uint64(msgs/5))
			for i := 0; i < msgs; i++ {
				off := i * size
				if i%5 == 3 {
					if !bytes.Equal(lbuf[off:off+size], rbuf[off:off+size]) {
						t.Fatalf("READ %d data differs", i)
					}
					continue
				}
				if !bytes.Equal(rbuf[off:off+size], want[off:off+size]) {
					t.Fatalf("message %d (op %d) data differs", i, i%5)
				}
			}
			if got := binary.LittleEndian.Uint64(rbuf[counterOff:]); got != uint64(msgs/5) {
				t.Fatalf("counter %d, want %d: an atomic executed twice or never", got, msgs/5)
			}
			t.Logf("dropped %d, retransmits %d, dup requests %d, seq NAKs %d", f.dropped,
				a.n.e.Stats.Retransmits.Load(), b.n.e.Stats.DuplicateRequest.Load(), a.n.e.Stats.RcvdSeqErr.Load())
		})
	}
}

func pollAllCheck(t *testing.T, cq *CQ) []WC {
	t.Helper()
	wcs := pollAll(cq)
	for _, w := range wcs {
		if w.Status != WCSuccess {
			t.Fatalf("completion %+v: %v", w, w.Status)
		}
	}
	return wcs
}
