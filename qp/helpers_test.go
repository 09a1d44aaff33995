package qp

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/reth"
)

// aligned8 returns the first offset at or after off where the MR's IOVA
// (and so the Go memory behind it) is 8-byte aligned.
func aligned8(m *mr.MR, off int) int {
	return off + int((8-(m.IOVA()+uint64(off))%8)%8)
}

// post posts wrs on ep's send queue or fails the test.
func (ep *endpoint) post(t *testing.T, wrs ...SendWR) {
	t.Helper()
	if err := ep.qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
}

// recv posts one receive of the given MR range or fails the test.
func (ep *endpoint) recv(t *testing.T, id uint64, m *mr.MR, off, n int) {
	t.Helper()
	if err := ep.qp.PostRecv(RecvWR{ID: id, SGL: sge(m, off, n)}); err != nil {
		t.Fatal(err)
	}
}

// want describes an expected completion: ID, status and opcode.
type want struct {
	id uint64
	st WCStatus
	op WCOpcode
}

// check compares completions with the expected ones, in order.
func check(t *testing.T, what string, got []WC, exp ...want) {
	t.Helper()
	ok := len(got) == len(exp)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].ID == exp[i].id && got[i].Status == exp[i].st && got[i].Opcode == exp[i].op
	}
	if !ok {
		t.Fatalf("%s: completions\n got  %s\n want %s", what, fmtWCs(got), fmtWants(exp))
	}
}

func fmtWCs(wcs []WC) string {
	var b strings.Builder
	for _, w := range wcs {
		fmt.Fprintf(&b, "{%d %v %v len=%d} ", w.ID, w.Status, w.Opcode, w.ByteLen)
	}
	return b.String()
}

func fmtWants(ws []want) string {
	var b strings.Builder
	for _, w := range ws {
		fmt.Fprintf(&b, "{%d %v %v} ", w.id, w.st, w.op)
	}
	return b.String()
}

// isNAK reports whether pkt is an ACKNOWLEDGE carrying a NAK with code.
func isNAK(pkt bth.Packet, code uint8) bool {
	if pkt.Info.Op != bth.OpAck {
		return false
	}
	s := pkt.AETH().Syndrome()
	return s.Kind() == reth.KindNAK && s.Value() == code
}

// isRNR reports whether pkt is an RNR NAK.
func isRNR(pkt bth.Packet) bool {
	return pkt.Info.Op == bth.OpAck && pkt.AETH().Syndrome().Kind() == reth.KindRNR
}

// unchanged fails the test if b differs from the copy before.
func unchanged(t *testing.T, what string, before, b []byte) {
	t.Helper()
	if string(before) != string(b) {
		t.Fatalf("%s: memory was written", what)
	}
}

// addrOf returns the address of b's first byte.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// fastFill fills b with pseudo-random bytes from seed, in bulk: the
// per-byte fill is too slow for many megabytes under the race detector.
func fastFill(b []byte, seed uint64) {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	rand.NewChaCha8(key).Read(b)
}

// dumpQP describes a QP's requester, responder and first send WQEs, for
// failure messages.
func dumpQP(q *QP) string {
	q.e.mu.Lock()
	defer q.e.mu.Unlock()
	r := &q.req
	s := fmt.Sprintf("state %v req{psn=%d comp=%d max=%d off=%d rdOut=%d retryLeft=%d rnrWait=%v gap=%v/%d} sq head=%d send=%d tail=%d deadlines=%v resp{ePSN=%d inMsg=%v rq=%d}",
		q.state, r.psn, r.compPSN, r.maxSent, r.off, r.rdOut, r.retryLeft, r.rnrWait, r.gapPending, r.gapPSN, q.sqHead, q.sqSend, q.sqTail, q.timer, q.resp.ePSN, q.resp.inMsg, q.rq.len())
	for i := q.sqHead; i != q.sqTail && i < q.sqHead+6; i++ {
		w := q.wqe(i)
		s += fmt.Sprintf("\n  wqe %d id=%d op=%v fl=%d len=%d started=%v first=%d last=%d acked=%v done=%v", i, w.wr.ID, w.wr.Opcode, w.wr.Flags, w.length, w.started, w.firstPSN, w.lastPSN, w.acked, w.done)
	}
	return s
}
