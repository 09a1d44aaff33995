package reliability_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/rxego/rxego"
)

// rcOp is one RC operation the end-to-end runs exercise.
type rcOp struct {
	name string
	op   rxego.WROpcode
}

// rcOps is every RC operation the issue names.
var rcOps = []rcOp{
	{"SEND", rxego.WRSend},
	{"SEND_IMM", rxego.WRSendImm},
	{"WRITE", rxego.WRWrite},
	{"WRITE_IMM", rxego.WRWriteImm},
	{"READ", rxego.WRRead},
	{"CMP_SWAP", rxego.WRCompareSwap},
	{"FETCH_ADD", rxego.WRFetchAdd},
	{"ATOMIC_WRITE", rxego.WRAtomicWrite},
}

// isAtomic reports whether op moves one 8-byte word.
func isAtomic(op rxego.WROpcode) bool {
	return op == rxego.WRCompareSwap || op == rxego.WRFetchAdd || op == rxego.WRAtomicWrite
}

// consumesRecv reports whether op completes at the responder.
func consumesRecv(op rxego.WROpcode) bool {
	return op == rxego.WRSend || op == rxego.WRSendImm || op == rxego.WRWriteImm
}

// opRun is n messages of one operation from a (requester) to b.
type opRun struct {
	op       rxego.WROpcode
	n        int
	size     int           // message bytes (atomics: 8)
	inFlight int           // most WRs outstanding at once
	timeout  time.Duration // for the whole run
}

// bufSize is the buffer each end needs for r: n message slots, then n
// 8-byte result or counter words.
func (r opRun) bufSize() int { return r.n*max(r.size, 8) + r.n*8 + 64 }

// pattern fills b with bytes that differ per offset and per seed.
func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*131+i>>8*7) ^ seed
	}
}

// runOp runs r between a and b (connected, fresh) and checks that every
// message arrived exactly once and in order and that every completion
// succeeded. It returns how long the run took.
func runOp(t testing.TB, a, b *end, r opRun) time.Duration {
	t.Helper()
	if isAtomic(r.op) {
		r.size = 8
	}
	pattern(a.buf, 0x11)
	pattern(b.buf, 0x22)
	words := a.aligned8(r.n * r.size) // a: atomic results; b: the counter or ATOMIC WRITE targets
	bw := b.aligned8(r.n * r.size)
	if words+8*r.n > len(a.buf) || bw+8*r.n > len(b.buf) {
		t.Fatalf("buffers too small for %d messages of %d bytes", r.n, r.size)
	}
	binary.LittleEndian.PutUint64(b.buf[bw:], 0) // the CMP_SWAP / FETCH_ADD counter
	want := append([]byte(nil), b.buf...)        // b's memory as it must end
	for i := range r.n {
		switch r.op {
		case rxego.WRSend, rxego.WRSendImm, rxego.WRWrite, rxego.WRWriteImm:
			copy(want[i*r.size:(i+1)*r.size], a.buf[i*r.size:(i+1)*r.size])
		case rxego.WRAtomicWrite:
			binary.BigEndian.PutUint64(want[bw+8*i:], uint64(i)+1)
		}
	}
	if r.op == rxego.WRCompareSwap || r.op == rxego.WRFetchAdd {
		binary.LittleEndian.PutUint64(want[bw:], uint64(r.n))
	}
	if consumesRecv(r.op) {
		for i := range r.n {
			wr := rxego.RecvWR{ID: uint64(i)}
			if r.op != rxego.WRWriteImm {
				wr.SGL = b.sge(i*r.size, r.size)
			}
			if err := b.qp.PostRecv(wr); err != nil {
				t.Fatalf("post receive %d: %v", i, err)
			}
		}
	}
	// The engines read these bytes for peers; Sync orders the writes
	// above before them (the network is a path the race detector cannot see).
	a.dev.Sync()
	b.dev.Sync()
	execBefore, readsBefore := b.dev.Stats().RDMARecvs, a.dev.Stats().RDMASends
	mk := func(i int) rxego.SendWR {
		wr := rxego.SendWR{ID: uint64(i), Opcode: r.op, Flags: rxego.SendSignaled, Imm: uint32(i)}
		switch r.op {
		case rxego.WRSend, rxego.WRSendImm:
			wr.SGL = a.sge(i*r.size, r.size)
		case rxego.WRWrite, rxego.WRWriteImm, rxego.WRRead:
			wr.SGL = a.sge(i*r.size, r.size)
			wr.RemoteAddr, wr.RKey = b.addr(i*r.size), b.mr.RKey()
		case rxego.WRCompareSwap:
			wr.SGL = a.sge(words+8*i, 8)
			wr.RemoteAddr, wr.RKey = b.addr(bw), b.mr.RKey()
			wr.CompareAdd, wr.Swap = uint64(i), uint64(i)+1
		case rxego.WRFetchAdd:
			wr.SGL = a.sge(words+8*i, 8)
			wr.RemoteAddr, wr.RKey = b.addr(bw), b.mr.RKey()
			wr.CompareAdd = 1
		case rxego.WRAtomicWrite:
			wr.RemoteAddr, wr.RKey = b.addr(bw+8*i), b.mr.RKey()
			binary.BigEndian.PutUint64(wr.AtomicValue[:], uint64(i)+1)
		}
		return wr
	}
	start := time.Now()
	drive(t, a, r, mk, func(i int, wc rxego.WC) {
		if wc.Status != 0 || wc.ID != uint64(i) {
			t.Fatalf("%v %d: completion %+v (status %v), want wr_id %d success; a: %s; b: %s",
				r.op, i, wc, wc.Status, i, a.stats(), b.stats())
		}
	})
	took := time.Since(start)
	if consumesRecv(r.op) {
		pollN(t, b.rcq, r.n, r.timeout, func(i int, wc rxego.WC) {
			ok := wc.Status == 0 && wc.ID == uint64(i) && wc.ByteLen == uint32(r.size)
			switch r.op {
			case rxego.WRSendImm, rxego.WRWriteImm:
				ok = ok && wc.Flags&rxego.WCWithImm != 0 && wc.Imm == uint32(i)
			}
			if !ok {
				t.Fatalf("%v: receive completion %d is %+v", r.op, i, wc)
			}
		})
	}
	// Everything the requester sent is acknowledged, so nothing more may
	// arrive: a duplicate executed late would show now.
	time.Sleep(20 * time.Millisecond)
	if n := b.rcq.Len(); n != 0 {
		t.Fatalf("%v: %d receive completions beyond the %d messages", r.op, n, r.n)
	}
	b.dev.Sync()
	a.dev.Sync()
	if !bytes.Equal(b.buf, want) {
		i := firstDiff(b.buf, want)
		t.Fatalf("%v: responder memory differs first at byte %d (got %#x want %#x)", r.op, i, b.buf[i], want[i])
	}
	switch r.op {
	case rxego.WRRead:
		if !bytes.Equal(a.buf[:r.n*r.size], b.buf[:r.n*r.size]) {
			t.Fatalf("READ: requester memory differs first at byte %d", firstDiff(a.buf[:r.n*r.size], b.buf[:r.n*r.size]))
		}
	case rxego.WRCompareSwap, rxego.WRFetchAdd:
		// Each WR saw the counter at its own index: executed once, in order.
		for i := range r.n {
			if v := binary.LittleEndian.Uint64(a.buf[words+8*i:]); v != uint64(i) {
				t.Fatalf("%v %d returned %d, want %d", r.op, i, v, i)
			}
		}
	}
	if !consumesRecv(r.op) || r.op == rxego.WRWriteImm {
		// The responder executed each RDMA request once: retries and
		// duplicates were answered, not executed again. A READ work
		// request may be several READ requests (qp/readsplit.go): as
		// many as the requester sent.
		want := uint64(r.n)
		if r.op == rxego.WRRead {
			want = a.dev.Stats().RDMASends - readsBefore
		}
		if got := b.dev.Stats().RDMARecvs - execBefore; got != want || got < uint64(r.n) {
			t.Fatalf("%v: responder executed %d requests, want %d (%d work requests)", r.op, got, want, r.n)
		}
	}
	if st := a.qp.State(); st != rxego.StateRTS {
		t.Fatalf("requester QP ended in %v", st)
	}
	return took
}

// drive posts r.n work requests made by mk, keeping at most r.inFlight
// outstanding, and checks each completion in order.
func drive(t testing.TB, a *end, r opRun, mk func(i int) rxego.SendWR, check func(i int, wc rxego.WC)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	wcs := make([]rxego.WC, 64)
	posted, done := 0, 0
	batch := make([]rxego.SendWR, 0, 64)
	for done < r.n {
		batch = batch[:0]
		for posted+len(batch) < r.n && posted+len(batch)-done < r.inFlight && len(batch) < cap(batch) {
			batch = append(batch, mk(posted+len(batch)))
		}
		if len(batch) > 0 {
			if err := a.qp.PostSend(batch...); err != nil {
				t.Fatalf("post %d: %v", posted, err)
			}
			posted += len(batch)
		}
		k, err := a.scq.PollWait(ctx, wcs)
		if err != nil {
			t.Fatalf("%v: %d of %d completed, %d posted: %v; a: %s", r.op, done, r.n, posted, err, a.stats())
		}
		for _, wc := range wcs[:k] {
			check(done, wc)
			done++
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
