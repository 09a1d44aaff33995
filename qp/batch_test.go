package qp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"
)

// TestBatchedUnderImpairment runs a mix of every RC operation with the
// engines reading whole batches (so ACKs coalesce and trail READ
// responses) across loss, duplication and reordering, and checks every
// byte, completion and counter.
func TestBatchedUnderImpairment(t *testing.T) {
	cases := []struct {
		loss, dup, reorder float64
	}{{0, 0, 0}, {0.02, 0, 0}, {0, 0.05, 0}, {0, 0, 0.1}, {0.03, 0.03, 0.03}}
	for _, c := range cases {
		t.Run(fmt.Sprintf("loss%v-dup%v-reorder%v", c.loss, c.dup, c.reorder), func(t *testing.T) {
			o := defaultConn()
			o.timeout, o.apsn, o.bpsn, o.rdAtomic = 8, 0xffff00, 0xfff000, 4
			f, a, b := pair(t, RC, o)
			f.batch = true
			f.dup, f.reorder = c.dup, c.reorder
			f.drop = func(wirePkt) bool { return f.rng.Float64() < c.loss }
			const msgs, size = 240, 2500
			lmr, lbuf := a.n.reg(t, msgs*size+64, allAccess)
			rmr, rbuf := b.n.reg(t, msgs*size+64, allAccess)
			fastFill(lbuf, 1)
			fastFill(rbuf, 2)
			want := append([]byte(nil), rbuf...)
			ctr, res := aligned8(rmr, msgs*size), aligned8(lmr, msgs*size)
			binary.LittleEndian.PutUint64(rbuf[ctr:], 0)
			recvs, done := 0, 0
			var rcvd []WC
			drain := func() {
				f.run(5 * time.Millisecond)
				done += len(pollAllCheck(t, a.scq))
				rcvd = append(rcvd, pollAllCheck(t, b.rcq)...)
			}
			// retry runs the fabric until post stops failing for lack of room.
			retry := func(post func() error) {
				for tries := 0; ; tries++ {
					err := post()
					if err == nil {
						return
					}
					if err != ErrQueueFull || tries > 1000 {
						t.Fatal(err)
					}
					drain()
				}
			}
			recv := func(id uint64, off, n int) {
				retry(func() error { return b.qp.PostRecv(RecvWR{ID: id, SGL: sge(rmr, off, n)}) })
				recvs++
			}
			for i := 0; i < msgs; i++ {
				off := i * size
				wr := SendWR{ID: uint64(i), Flags: SendSignaled, SGL: sge(lmr, off, size), RemoteAddr: rmr.IOVA() + uint64(off), RKey: rmr.RKey()}
				switch i % 8 {
				case 0, 1:
					wr.Opcode = WRSend
					if i%8 == 1 {
						wr.Opcode, wr.Imm = WRSendImm, uint32(i)
					}
					recv(uint64(i), off, size)
					copy(want[off:off+size], lbuf[off:off+size])
				case 2, 3:
					wr.Opcode = WRWrite
					if i%8 == 3 {
						wr.Opcode, wr.Imm = WRWriteImm, uint32(i)
						recv(uint64(i), 0, 0)
					}
					copy(want[off:off+size], lbuf[off:off+size])
				case 4, 5:
					wr.Opcode = WRRead
				case 6:
					wr = SendWR{ID: uint64(i), Opcode: WRFetchAdd, Flags: SendSignaled, SGL: sge(lmr, res, 8), RemoteAddr: rmr.IOVA() + uint64(ctr), RKey: rmr.RKey(), CompareAdd: 1}
				case 7:
					wr = SendWR{ID: uint64(i), Opcode: WRAtomicWrite, Flags: SendSignaled, RemoteAddr: rmr.IOVA() + uint64(aligned8(rmr, off)), RKey: rmr.RKey()}
					binary.NativeEndian.PutUint64(wr.AtomicValue[:], uint64(i))
					w := aligned8(rmr, off)
					copy(want[w:w+8], wr.AtomicValue[:])
				}
				retry(func() error { return a.qp.PostSend(wr) })
			}
			f.run(30 * time.Second)
			done += len(pollAllCheck(t, a.scq))
			rcvd = append(rcvd, pollAllCheck(t, b.rcq)...)
			if done != msgs || len(rcvd) != recvs {
				t.Fatalf("%d of %d send and %d of %d receive completions (state %v/%v)", done, msgs, len(rcvd), recvs, a.qp.State(), b.qp.State())
			}
			for _, wc := range rcvd {
				isImm := wc.ID%8 == 1 || wc.ID%8 == 3
				if isImm != (wc.Flags&WCWithImm != 0) || isImm && wc.Imm != uint32(wc.ID) {
					t.Fatalf("receive completion %+v", wc)
				}
			}
			b.n.e.Sync()
			binary.LittleEndian.PutUint64(want[ctr:], msgs/8)
			for i := 0; i < msgs; i++ {
				off := i * size
				if i%8 == 4 || i%8 == 5 {
					if !bytes.Equal(lbuf[off:off+size], rbuf[off:off+size]) {
						t.Fatalf("READ %d differs", i)
					}
					continue
				}
				if !bytes.Equal(rbuf[off:off+size], want[off:off+size]) {
					t.Fatalf("message %d (kind %d) differs", i, i%8)
				}
			}
			if got := binary.LittleEndian.Uint64(rbuf[ctr:]); got != msgs/8 {
				t.Fatalf("counter %d, want %d", got, msgs/8)
			}
			if c == cases[0] && (a.n.e.Stats.Retransmits.Load() != 0 || b.n.e.Stats.DuplicateRequest.Load() != 0) {
				t.Fatalf("a clean fabric saw %d retransmissions", a.n.e.Stats.Retransmits.Load())
			}
		})
	}
}
