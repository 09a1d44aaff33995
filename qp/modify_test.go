package qp

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
)

// kernelRule is one entry of the kernel's qp_state_table
// (drivers/infiniband/core/verbs.c), written out here independently of
// attr.go so the test checks the engine against the kernel, not itself.
type kernelRule struct{ req, opt map[Type]AttrMask }

var kernelTable = map[transition]kernelRule{
	{Reset, Reset}: {},
	{Reset, Init}: {req: map[Type]AttrMask{
		UD: AttrPKeyIndex | AttrPort | AttrQKey,
		UC: AttrPKeyIndex | AttrPort | AttrAccessFlags,
		RC: AttrPKeyIndex | AttrPort | AttrAccessFlags,
	}},
	{Init, Reset}: {},
	{Init, Err}:   {},
	{Init, Init}: {opt: map[Type]AttrMask{
		UD: AttrPKeyIndex | AttrPort | AttrQKey,
		UC: AttrPKeyIndex | AttrPort | AttrAccessFlags,
		RC: AttrPKeyIndex | AttrPort | AttrAccessFlags,
	}},
	{Init, RTR}: {
		req: map[Type]AttrMask{
			UC: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			RC: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
		},
		opt: map[Type]AttrMask{
			UD: AttrPKeyIndex | AttrQKey,
			UC: AttrAltPath | AttrAccessFlags | AttrPKeyIndex,
			RC: AttrAltPath | AttrAccessFlags | AttrPKeyIndex,
		},
	},
	{RTR, Reset}: {},
	{RTR, Err}:   {},
	{RTR, RTS}: {
		req: map[Type]AttrMask{
			UD: AttrSQPSN,
			UC: AttrSQPSN,
			RC: AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrSQPSN | AttrMaxQPRdAtomic,
		},
		opt: map[Type]AttrMask{
			UD: AttrCurState | AttrQKey,
			UC: AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState,
			RC: AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState,
		},
	},
	{RTS, Reset}: {},
	{RTS, Err}:   {},
	{RTS, RTS}: {opt: map[Type]AttrMask{
		UD: AttrCurState | AttrQKey,
		UC: AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState,
		RC: AttrCurState | AttrAccessFlags | AttrAltPath | AttrPathMigState | AttrMinRNRTimer,
	}},
	{RTS, SQD}:   {opt: map[Type]AttrMask{UD: AttrEnSQDAsyncNotif, UC: AttrEnSQDAsyncNotif, RC: AttrEnSQDAsyncNotif}},
	{SQD, Reset}: {},
	{SQD, Err}:   {},
	{SQD, RTS}: {opt: map[Type]AttrMask{
		UD: AttrCurState | AttrQKey,
		UC: AttrCurState | AttrAltPath | AttrAccessFlags | AttrPathMigState,
		RC: AttrCurState | AttrAltPath | AttrAccessFlags | AttrMinRNRTimer | AttrPathMigState,
	}},
	{SQD, SQD}: {opt: map[Type]AttrMask{
		UD: AttrPKeyIndex | AttrQKey,
		UC: AttrAV | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrPathMigState,
		RC: AttrPort | AttrAV | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic |
			AttrMaxDestRdAtomic | AttrAltPath | AttrAccessFlags | AttrPKeyIndex | AttrMinRNRTimer | AttrPathMigState,
	}},
	{SQE, Reset}: {},
	{SQE, Err}:   {},
	{SQE, RTS}:   {opt: map[Type]AttrMask{UD: AttrCurState | AttrQKey, UC: AttrCurState | AttrAccessFlags}},
	{Err, Reset}: {},
	{Err, Err}:   {},
}

// kernelAllows reports whether the kernel's table has a transition. (It
// has SQE -> RTS for RC too, with no optional attribute, though an RC QP
// never reaches SQE.)
func kernelAllows(t Type, from, to State) (kernelRule, bool) {
	r, ok := kernelTable[transition{from, to}]
	return r, ok
}

const allAttrBits = AttrMask(1<<21 - 1)

// fullAttr returns attributes with a valid value in every field, so a
// mask alone decides what a Modify sets.
func fullAttr(to, cur State) *Attr {
	return &Attr{
		State: to, CurState: cur, PathMTU: MTU2048, QKey: 0x11111111, RQPSN: 0x123456, SQPSN: 0x654321,
		DestQPN: 0x42, AccessFlags: allAccess, Port: 1, Timeout: 12, RetryCnt: 5, RNRRetry: 4,
		MinRNRTimer: 3, MaxRdAtomic: 8, MaxDestRdAtomic: 9, Dest: netip.MustParseAddrPort("198.18.0.99:4791"),
	}
}

// bringTo moves a fresh QP to state s along the shortest legal path with
// the required attributes only.
func bringTo(t *testing.T, q *QP, s State) {
	t.Helper()
	step := func(to State) {
		t.Helper()
		from := q.State()
		r, _ := kernelAllows(q.Type(), from, to)
		if err := q.Modify(fullAttr(to, from), AttrState|r.req[q.Type()]); err != nil {
			t.Fatalf("%v %v -> %v: %v", q.Type(), from, to, err)
		}
	}
	switch s {
	case Reset:
	case Err:
		step(Init)
		step(Err)
	case SQE:
		step(Init)
		step(RTR)
		step(RTS)
		// Nothing the engine does moves a QP to SQE (rxe moves a QP whose
		// send side failed to ERR), and verbs cannot ask for it, so the
		// test puts it there itself.
		q.e.mu.Lock()
		q.state = SQE
		q.e.mu.Unlock()
	default:
		for _, to := range []State{Init, RTR, RTS, SQD} {
			step(to)
			if to == s {
				break
			}
		}
	}
	if got := q.State(); got != s {
		t.Fatalf("bringTo %v: QP is %v", s, got)
	}
}

func maskBits(m AttrMask) []AttrMask {
	var out []AttrMask
	for m != 0 {
		b := AttrMask(1) << bits.TrailingZeros32(uint32(m))
		out = append(out, b)
		m &^= b
	}
	return out
}

var allStates = []State{Reset, Init, RTR, RTS, SQD, SQE, Err}

// TestModifyStateMachine checks every (type, from, to) against the
// kernel's table: legal transitions succeed with exactly the required
// attributes plus any optional one, and fail — changing nothing — when a
// required attribute is missing or any other attribute is added; illegal
// transitions fail whatever the mask.
func TestModifyStateMachine(t *testing.T) {
	f := newFabric(t)
	n := f.node("198.18.0.1")
	fresh := func(typ Type, s State) *QP {
		ep := n.newQP(t, typ, 4)
		bringTo(t, ep.qp, s)
		return ep.qp
	}
	expectFail := func(t *testing.T, q *QP, a *Attr, mask AttrMask, what string) {
		t.Helper()
		before := q.Query()
		err := q.Modify(a, mask)
		if !errors.Is(err, ErrInvalidModify) {
			t.Fatalf("%s: mask %#x: got %v, want ErrInvalidModify", what, mask, err)
		}
		if after := q.Query(); after != before {
			t.Fatalf("%s: failed Modify changed the QP:\n before %+v\n after  %+v", what, before, after)
		}
	}
	for _, typ := range []Type{RC, UC, UD} {
		for _, from := range allStates {
			for _, to := range allStates {
				name := fmt.Sprintf("%v/%v->%v", typ, from, to)
				r, legal := kernelAllows(typ, from, to)
				req, opt := r.req[typ], r.opt[typ]
				if !legal {
					q := fresh(typ, from)
					expectFail(t, q, fullAttr(to, from), AttrState, name+" (illegal)")
					r2, _ := kernelAllows(typ, Reset, Init)
					expectFail(t, q, fullAttr(to, from), AttrState|r2.req[typ], name+" (illegal, with attributes)")
					continue
				}
				// Exactly the required attributes: accepted.
				q := fresh(typ, from)
				if err := q.Modify(fullAttr(to, from), AttrState|req); err != nil {
					t.Fatalf("%s with required mask %#x: %v", name, req, err)
				}
				if got := q.State(); got != to {
					t.Fatalf("%s: QP is %v after Modify", name, got)
				}
				// Each required attribute missing: refused.
				for _, b := range maskBits(req) {
					expectFail(t, fresh(typ, from), fullAttr(to, from), AttrState|req&^b, name+" missing "+fmt.Sprintf("%#x", b))
				}
				// Each optional attribute added: accepted.
				for _, b := range maskBits(opt) {
					q := fresh(typ, from)
					if err := q.Modify(fullAttr(to, from), AttrState|req|b); err != nil {
						t.Fatalf("%s with optional %#x: %v", name, b, err)
					}
				}
				// Any other attribute added: refused.
				for _, b := range maskBits(allAttrBits &^ (AttrState | req | opt)) {
					expectFail(t, fresh(typ, from), fullAttr(to, from), AttrState|req|b, name+" extra "+fmt.Sprintf("%#x", b))
				}
			}
		}
	}
}

// TestModifyQueryReflectsAttributes checks that what Modify sets is what
// Query returns, and that a transition leaves attributes it did not set
// alone.
func TestModifyQueryReflectsAttributes(t *testing.T) {
	f := newFabric(t)
	q := f.node("198.18.0.1").newQP(t, RC, 4).qp
	bringTo(t, q, RTS)
	want := fullAttr(RTS, RTS)
	want.MinRNRTimer = 3
	got := q.Query()
	if got.State != RTS || got.PathMTU != want.PathMTU || got.RQPSN != want.RQPSN || got.SQPSN != want.SQPSN ||
		got.DestQPN != want.DestQPN || got.AccessFlags != want.AccessFlags || got.Port != 1 ||
		got.Timeout != want.Timeout || got.RetryCnt != want.RetryCnt || got.RNRRetry != want.RNRRetry ||
		got.MinRNRTimer != want.MinRNRTimer || got.MaxRdAtomic != want.MaxRdAtomic ||
		got.MaxDestRdAtomic != want.MaxDestRdAtomic || got.Dest != want.Dest || got.QKey != 0 {
		t.Fatalf("Query after RESET->INIT->RTR->RTS: %+v", got)
	}
	// RTS -> RTS changes only what the mask names.
	a := &Attr{AccessFlags: mr.RemoteRead, MinRNRTimer: 17, Timeout: 1, RetryCnt: 1}
	if err := q.Modify(a, AttrAccessFlags|AttrMinRNRTimer); err != nil {
		t.Fatal(err)
	}
	got2 := q.Query()
	got.AccessFlags, got.MinRNRTimer = mr.RemoteRead, 17
	if got2 != got {
		t.Fatalf("RTS->RTS changed more than asked:\n want %+v\n got  %+v", got, got2)
	}
}

// TestModifyValueRanges checks every attribute's range: a value out of
// range is refused with ErrInvalidModify and changes nothing, and the
// extreme legal values are accepted.
func TestModifyValueRanges(t *testing.T) {
	f := newFabric(t)
	n := f.node("198.18.0.1")
	type tc struct {
		name  string
		from  State
		to    State
		typ   Type
		edit  func(a *Attr)
		valid bool
	}
	var cases []tc
	add := func(name string, typ Type, from, to State, valid bool, edit func(a *Attr)) {
		cases = append(cases, tc{name, from, to, typ, edit, valid})
	}
	for m := MTU(0); m <= 7; m++ {
		add(fmt.Sprintf("path MTU %d", m), RC, Init, RTR, m >= MTU256 && m <= MTU4096, func(a *Attr) { a.PathMTU = m })
	}
	add("rq_psn 0xffffff", RC, Init, RTR, true, func(a *Attr) { a.RQPSN = 0xffffff })
	add("rq_psn 2^24", RC, Init, RTR, false, func(a *Attr) { a.RQPSN = 1 << 24 })
	add("dest_qpn 0xffffff", RC, Init, RTR, true, func(a *Attr) { a.DestQPN = 0xffffff })
	add("dest_qpn 2^24", UC, Init, RTR, false, func(a *Attr) { a.DestQPN = 1 << 24 })
	add("min_rnr_timer 31", RC, Init, RTR, true, func(a *Attr) { a.MinRNRTimer = 31 })
	add("min_rnr_timer 32", RC, Init, RTR, false, func(a *Attr) { a.MinRNRTimer = 32 })
	add("max_dest_rd_atomic 0", RC, Init, RTR, true, func(a *Attr) { a.MaxDestRdAtomic = 0 })
	add("max_dest_rd_atomic 128", RC, Init, RTR, true, func(a *Attr) { a.MaxDestRdAtomic = MaxRdAtomicLimit })
	add("max_dest_rd_atomic 129", RC, Init, RTR, false, func(a *Attr) { a.MaxDestRdAtomic = MaxRdAtomicLimit + 1 })
	add("AV without address", RC, Init, RTR, false, func(a *Attr) { a.Dest = netip.AddrPort{} })
	add("AV without port", UC, Init, RTR, false, func(a *Attr) { a.Dest = netip.AddrPortFrom(a.Dest.Addr(), 0) })
	add("sq_psn 0xffffff", RC, RTR, RTS, true, func(a *Attr) { a.SQPSN = 0xffffff })
	add("sq_psn 2^24", UD, RTR, RTS, false, func(a *Attr) { a.SQPSN = 1 << 24 })
	add("timeout 31", RC, RTR, RTS, true, func(a *Attr) { a.Timeout = 31 })
	add("timeout 32", RC, RTR, RTS, false, func(a *Attr) { a.Timeout = 32 })
	add("retry_cnt 7", RC, RTR, RTS, true, func(a *Attr) { a.RetryCnt = 7 })
	add("retry_cnt 8", RC, RTR, RTS, false, func(a *Attr) { a.RetryCnt = 8 })
	add("rnr_retry 7", RC, RTR, RTS, true, func(a *Attr) { a.RNRRetry = 7 })
	add("rnr_retry 8", RC, RTR, RTS, false, func(a *Attr) { a.RNRRetry = 8 })
	add("max_rd_atomic 128", RC, RTR, RTS, true, func(a *Attr) { a.MaxRdAtomic = MaxRdAtomicLimit })
	add("max_rd_atomic 129", RC, RTR, RTS, false, func(a *Attr) { a.MaxRdAtomic = MaxRdAtomicLimit + 1 })
	add("port 1", RC, Reset, Init, true, func(a *Attr) { a.Port = 1 })
	add("port 0", RC, Reset, Init, false, func(a *Attr) { a.Port = 0 })
	add("port 2", UD, Reset, Init, false, func(a *Attr) { a.Port = 2 })
	add("pkey_index 1", UC, Reset, Init, false, func(a *Attr) { a.PKeyIndex = 1 })
	add("access ZeroBased", RC, Reset, Init, false, func(a *Attr) { a.AccessFlags |= mr.ZeroBased })
	add("access unknown bit", UC, Reset, Init, false, func(a *Attr) { a.AccessFlags |= 1 << 20 })
	add("access none", RC, Reset, Init, true, func(a *Attr) { a.AccessFlags = 0 })
	add("qkey any 32 bits", UD, Reset, Init, true, func(a *Attr) { a.QKey = 0xffffffff })
	add("cur_state wrong", RC, RTR, RTS, false, func(a *Attr) { a.CurState = Init })
	add("unknown state", RC, Init, 9, false, func(a *Attr) {})
	for _, c := range cases {
		ep := n.newQP(t, c.typ, 4)
		q := ep.qp
		bringTo(t, q, c.from)
		r, _ := kernelAllows(c.typ, c.from, c.to)
		mask := AttrState | r.req[c.typ]
		a := fullAttr(c.to, c.from)
		c.edit(a)
		if c.name == "cur_state wrong" {
			mask |= AttrCurState
		}
		before := q.Query()
		err := q.Modify(a, mask)
		if c.valid {
			if err != nil {
				t.Errorf("%s (%v %v->%v): %v", c.name, c.typ, c.from, c.to, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidModify) {
			t.Errorf("%s (%v %v->%v): got %v, want ErrInvalidModify", c.name, c.typ, c.from, c.to, err)
		}
		if after := q.Query(); after != before {
			t.Errorf("%s: refused Modify changed the QP", c.name)
		}
	}
}

// TestModifyToResetAndErr: every state may go to RESET and (except RESET
// itself, which the kernel refuses) to ERR, with no attribute but the
// state.
func TestModifyToResetAndErr(t *testing.T) {
	f := newFabric(t)
	n := f.node("198.18.0.1")
	for _, typ := range []Type{RC, UC, UD} {
		for _, from := range allStates {
			for _, to := range []State{Reset, Err} {
				ep := n.newQP(t, typ, 4)
				bringTo(t, ep.qp, from)
				before := ep.qp.Query()
				for _, extra := range []AttrMask{AttrCurState, AttrAccessFlags, AttrQKey, AttrTimeout} {
					if err := ep.qp.Modify(fullAttr(to, from), AttrState|extra); !errors.Is(err, ErrInvalidModify) {
						t.Fatalf("%v %v->%v with %#x: %v", typ, from, to, extra, err)
					}
				}
				if ep.qp.Query() != before {
					t.Fatalf("%v %v->%v: refused Modify changed the QP", typ, from, to)
				}
				err := ep.qp.Modify(&Attr{State: to}, AttrState)
				if from == Reset && to == Err {
					if !errors.Is(err, ErrInvalidModify) {
						t.Fatalf("%v RESET->ERR: %v, want ErrInvalidModify (the kernel has no such transition)", typ, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%v %v->%v: %v", typ, from, to, err)
				}
				got := ep.qp.Query()
				if got.State != to {
					t.Fatalf("%v %v->%v: QP is %v", typ, from, to, got.State)
				}
				if to == Reset && got != (Attr{}) {
					t.Fatalf("%v %v->RESET: attributes survive: %+v", typ, from, got)
				}
			}
		}
	}
}

// TestModifyResetDiscardsWork: a move to RESET drops posted sends and
// receives without completions, stops the timers, and the QP can be
// brought up again and used with fresh PSNs.
func TestModifyResetDiscardsWork(t *testing.T) {
	o := defaultConn()
	o.timeout = 10
	f, a, b := pair(t, RC, o)
	smr, sbuf := a.n.reg(t, 4096, allAccess)
	fill(sbuf, 3)
	f.drop = func(wirePkt) bool { return true } // the peer is silent
	for i := 0; i < 4; i++ {
		if err := a.qp.PostRecv(RecvWR{ID: uint64(100 + i), SGL: sge(smr, 0, 64)}); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(SendWR{ID: uint64(i), Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 100)}); err != nil {
			t.Fatal(err)
		}
	}
	f.run(2 * ackTimeout(o.timeout)) // some retransmissions happen
	if err := a.qp.Modify(&Attr{State: Reset}, AttrState); err != nil {
		t.Fatal(err)
	}
	sent := a.n.e.Stats.SentPkts.Load()
	f.run(time.Second)
	if got := a.n.e.Stats.SentPkts.Load(); got != sent {
		t.Fatalf("a RESET QP sent %d packets (its timers still run)", got-sent)
	}
	if w := append(pollAll(a.scq), pollAll(a.rcq)...); len(w) != 0 {
		t.Fatalf("RESET produced completions: %+v", w)
	}
	if _, ok := a.n.e.NextDeadline(); ok {
		t.Fatal("a timer is still armed after RESET")
	}
	if err := a.qp.PostSend(SendWR{Opcode: WRSend}); err == nil {
		t.Fatal("PostSend on a RESET QP succeeded")
	}
	if err := a.qp.PostRecv(RecvWR{}); err == nil {
		t.Fatal("PostRecv on a RESET QP succeeded")
	}
	// Bring both sides up again with new PSNs: the old work is gone and
	// new work flows.
	f.drop = nil
	if err := b.qp.Modify(&Attr{State: Reset}, AttrState); err != nil {
		t.Fatal(err)
	}
	o.apsn, o.bpsn = 0x777, 0x999
	connect(t, a, b, o)
	rmr, rbuf := b.n.reg(t, 4096, allAccess)
	if err := b.qp.PostRecv(RecvWR{ID: 55, SGL: sge(rmr, 0, 4096)}); err != nil {
		t.Fatal(err)
	}
	var psns []bth.PSN
	f.tap = func(p wirePkt, pkt bth.Packet) {
		if pkt.Info.Op == bth.OpSend {
			psns = append(psns, pkt.BTH().PSN())
		}
	}
	if err := a.qp.PostSend(SendWR{ID: 9, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 300)}); err != nil {
		t.Fatal(err)
	}
	f.run(time.Second)
	sw, rw := pollAll(a.scq), pollAll(b.rcq)
	if len(sw) != 1 || sw[0].ID != 9 || sw[0].Status != WCSuccess {
		t.Fatalf("send completions after re-connect: %+v", sw)
	}
	if len(rw) != 1 || rw[0].ID != 55 || rw[0].ByteLen != 300 || string(rbuf[:300]) != string(sbuf[:300]) {
		t.Fatalf("recv completions after re-connect: %+v", rw)
	}
	if len(psns) != 1 || psns[0] != 0x777 {
		t.Fatalf("PSNs after RESET: %v, want [0x777]", psns)
	}
}

// TestSQDDrainsAndResumes: in SQD the requester finishes what it started
// (including retransmissions) but starts nothing new; SQD -> SQD may
// change attributes; SQD -> RTS resumes.
func TestSQDDrainsAndResumes(t *testing.T) {
	o := defaultConn()
	o.rdAtomic = 1
	o.timeout = 10
	f, a, b := pair(t, RC, o)
	lmr, lbuf := a.n.reg(t, 1<<16, allAccess)
	rmr, rbuf := b.n.reg(t, 1<<16, allAccess)
	fill(rbuf, 7)
	secondRead := 0
	f.tap = func(p wirePkt, pkt bth.Packet) {
		if pkt.Info.Op == bth.OpReadRequest && pkt.RETH().VA() == rmr.IOVA()+5000 {
			secondRead++
		}
	}
	// The first SEND is lost once, so it must be retransmitted while the
	// QP is in SQD. The second READ waits for max_rd_atomic = 1.
	if err := b.qp.PostRecv(RecvWR{ID: 1, SGL: sge(rmr, 40000, 100)}); err != nil {
		t.Fatal(err)
	}
	lost := false
	f.drop = func(p wirePkt) bool {
		if !lost && parse(t, p).Info.Op == bth.OpSend {
			lost = true
			return true
		}
		return false
	}
	err := a.qp.PostSend(
		SendWR{ID: 10, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 40000, 100)},
		SendWR{ID: 11, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 0, 5000), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
		SendWR{ID: 12, Opcode: WRRead, Flags: SendSignaled, SGL: sge(lmr, 5000, 5000), RemoteAddr: rmr.IOVA() + 5000, RKey: rmr.RKey()},
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.qp.Modify(&Attr{State: SQD}, AttrState|AttrEnSQDAsyncNotif); err != nil {
		t.Fatal(err)
	}
	// Posting in SQD is allowed; the WR waits.
	if err := a.qp.PostSend(SendWR{ID: 13, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, 20000, 10), RemoteAddr: rmr.IOVA() + 20000, RKey: rmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	f.run(time.Second)
	wcs := pollAll(a.scq)
	if len(wcs) != 2 || wcs[0].ID != 10 || wcs[0].Status != WCSuccess || wcs[1].ID != 11 || wcs[1].Status != WCSuccess {
		t.Fatalf("completions in SQD: %+v (state %v)", wcs, a.qp.State())
	}
	if secondRead != 0 {
		t.Fatal("the second READ was started in SQD")
	}
	if err := a.qp.Modify(&Attr{Timeout: 11, RetryCnt: 3}, AttrTimeout|AttrRetryCnt); err != nil {
		t.Fatalf("SQD -> SQD: %v", err)
	}
	if q := a.qp.Query(); q.State != SQD || q.Timeout != 11 || q.RetryCnt != 3 {
		t.Fatalf("after SQD -> SQD: %+v", q)
	}
	if err := a.qp.Modify(&Attr{State: RTS}, AttrState); err != nil {
		t.Fatal(err)
	}
	f.run(time.Second)
	wcs = pollAll(a.scq)
	if len(wcs) != 2 || wcs[0].ID != 12 || wcs[0].Status != WCSuccess || wcs[1].ID != 13 || wcs[1].Status != WCSuccess {
		t.Fatalf("completions after SQD -> RTS: %+v", wcs)
	}
	b.n.e.Sync()
	if string(lbuf[:10000]) != string(rbuf[:10000]) {
		t.Fatal("READ data differs")
	}
}

// TestSQEToRTS: a UC or UD QP in SQE returns to RTS and goes on sending
// with the next PSN (not the initial sq_psn).
func TestSQEToRTS(t *testing.T) {
	for _, typ := range []Type{UC, UD} {
		f := newFabric(t)
		a := f.node("198.18.0.1").newQP(t, typ, 8)
		b := f.node("198.18.0.2").newQP(t, typ, 8)
		var ah *AH
		if typ == UC {
			connect(t, a, b, defaultConn())
		} else {
			bringUD(t, a, 0x1000, 0x11)
			bringUD(t, b, 0x2000, 0x11)
			ah = &AH{Dest: b.n.addr}
		}
		smr, _ := a.n.reg(t, 64, allAccess)
		rmr, _ := b.n.reg(t, 4096, allAccess)
		var psns []bth.PSN
		f.tap = func(p wirePkt, pkt bth.Packet) { psns = append(psns, pkt.BTH().PSN()) }
		send := func(id uint64) {
			t.Helper()
			if err := b.qp.PostRecv(RecvWR{ID: id, SGL: sge(rmr, 0, 4096)}); err != nil {
				t.Fatal(err)
			}
			wr := SendWR{ID: id, Opcode: WRSend, Flags: SendSignaled, SGL: sge(smr, 0, 64), AH: ah, RemoteQPN: b.qp.Num(), RemoteQKey: 0x11}
			if err := a.qp.PostSend(wr); err != nil {
				t.Fatal(err)
			}
			f.run(time.Second)
		}
		send(1)
		a.qp.e.mu.Lock()
		a.qp.state = SQE // see bringTo
		a.qp.e.mu.Unlock()
		before := a.qp.Query()
		if err := a.qp.Modify(&Attr{State: RTS, CurState: SQE}, AttrState|AttrCurState); err != nil {
			t.Fatalf("%v SQE -> RTS: %v", typ, err)
		}
		if q := a.qp.Query(); q.SQPSN != before.SQPSN {
			t.Fatalf("SQE -> RTS changed sq_psn")
		}
		send(2)
		if len(psns) != 2 || psns[1] != psns[0].Next() {
			t.Fatalf("%v PSNs across SQE -> RTS: %v, want consecutive", typ, psns)
		}
		if sw, rw := pollAll(a.scq), pollAll(b.rcq); len(sw) != 2 || len(rw) != 2 {
			t.Fatalf("%v completions: send %+v recv %+v", typ, sw, rw)
		}
	}
}

// bringUD brings a UD endpoint to RTS with the given sq_psn and Q_Key.
func bringUD(t *testing.T, ep *endpoint, sqpsn, qkey uint32) {
	t.Helper()
	if err := ep.qp.Modify(&Attr{State: Init, Port: 1, QKey: qkey}, AttrState|AttrPKeyIndex|AttrPort|AttrQKey); err != nil {
		t.Fatal(err)
	}
	if err := ep.qp.Modify(&Attr{State: RTR}, AttrState); err != nil {
		t.Fatal(err)
	}
	if err := ep.qp.Modify(&Attr{State: RTS, SQPSN: sqpsn}, AttrState|AttrSQPSN); err != nil {
		t.Fatal(err)
	}
}

// TestQueryCurrentPSNs checks that Query reports the PSNs the QP is at, as
// rxe does, not those it was configured with: after nine packets (three
// 2,500-byte WRITEs at MTU 1024) across the PSN wrap, the requester's
// sq_psn and the responder's rq_psn have both moved on by nine, and the
// directions that carried nothing still read as configured.
func TestQueryCurrentPSNs(t *testing.T) {
	o := defaultConn()
	o.apsn = 0xffffff - 2
	f, a, b := pair(t, RC, o)
	if q := a.qp.Query(); q.SQPSN != o.apsn || q.RQPSN != o.bpsn {
		t.Fatalf("before traffic: sq_psn %#x rq_psn %#x, want %#x %#x", q.SQPSN, q.RQPSN, o.apsn, o.bpsn)
	}
	lmr, _ := a.n.reg(t, 2500, allAccess)
	rmr, _ := b.n.reg(t, 2500, allAccess)
	for i := range 3 {
		wr := SendWR{ID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, 0, 2500), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
	}
	f.run(time.Second)
	if wcs := pollAll(a.scq); len(wcs) != 3 || wcs[2].Status != WCSuccess {
		t.Fatalf("completions %+v", wcs)
	}
	want := (o.apsn + 9) & 0xffffff
	if q := a.qp.Query(); q.SQPSN != want || q.RQPSN != o.bpsn {
		t.Fatalf("requester: sq_psn %#x rq_psn %#x, want %#x %#x", q.SQPSN, q.RQPSN, want, o.bpsn)
	}
	if q := b.qp.Query(); q.RQPSN != want || q.SQPSN != o.bpsn {
		t.Fatalf("responder: rq_psn %#x sq_psn %#x, want %#x %#x", q.RQPSN, q.SQPSN, want, o.bpsn)
	}
	// RESET forgets them with everything else.
	if err := a.qp.Modify(&Attr{State: Reset}, AttrState); err != nil {
		t.Fatal(err)
	}
	if q := a.qp.Query(); q.SQPSN != 0 || q.RQPSN != 0 {
		t.Fatalf("after RESET: sq_psn %#x rq_psn %#x", q.SQPSN, q.RQPSN)
	}
}
