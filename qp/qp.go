package qp

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
)

// Caps are a QP's queue sizes (ibv_qp_cap).
type Caps struct {
	MaxSendWR     int
	MaxRecvWR     int
	MaxSendSGE    int
	MaxRecvSGE    int
	MaxInlineData int
}

// Limits of the device, as ibv_query_device reports them.
const (
	MaxWR         = 1 << 16
	MaxSGE        = 32
	MaxInlineData = 512
	QKeyGSI       = 0x80010000 // the GSI QP's well-known Q_Key
)

// InitAttr describes a QP to create (ibv_qp_init_attr).
type InitAttr struct {
	Type   Type
	PD     *mr.PD
	SendCQ *CQ
	RecvCQ *CQ
	SRQ    *SRQ
	Caps   Caps
	// SigAll makes every send WR generate a completion (sq_sig_all).
	SigAll bool
	// QPN asks for a specific QP number (for QP1, the GSI QP); 0 picks one.
	QPN uint32
}

// QP is a queue pair. Its methods are safe for concurrent use.
//
// The fields are in the order the paths use them: from e to timer, what
// a request's post, its packets, its ACK and its completion touch (attr
// and the retransmission timer last; the responder reads attr too); then
// the responder's; then the rest. With thousands of QPs each QP is cold
// in the CPU's caches by its next message, and each cache line a message
// touches is a miss: spread over the struct, a 4 KiB WRITE's requester
// touched eleven of its sixteen lines; in this order, seven.
type QP struct {
	// e, num, typ, pd, sendCQ, recvCQ, srq, caps and sigAll are set at
	// Create; everything else but errored and mcastNoRecv is guarded by
	// the engine lock.
	e         *Engine
	num       uint32
	typ       Type
	state     State
	destroyed bool
	sigAll    bool
	// turnQueued: q is on the engine's list of QPs waiting for a turn to
	// send (turns.go).
	turnQueued bool
	// ccQuiet: cc's reaction point is at line rate with nothing pending
	// (no timer event, no pacing), as it stays until a CNP or a timeout
	// (ccRate sets it when it finds that so). A packet then needs nothing
	// of it, and ccAdmit and ccSent leave cc alone: with thousands of QPs,
	// cc and its controller are cold cache lines for every packet.
	ccQuiet  bool
	flushing bool
	// sendFailed: the Output could not send the packet with PSN
	// sendFailPSN and never will (see SendFailed).
	sendFailed  bool
	sendFailPSN bth.PSN
	// readWaiting: q is on the engine's list of QPs waiting for room in
	// the READ budget.
	readWaiting bool
	mtu         int
	pd          *mr.PD
	sendCQ      *CQ
	caps        Caps
	sq          []sendWQE
	sqHead      uint64 // oldest WQE not completed
	sqSend      uint64 // WQE the requester works on
	sqTail      uint64 // next free slot
	req         requester
	cc          *qpCC
	attr        Attr // read by both directions: last of the requester's but timer, first of the responder's
	timer       [numTimers]qpTimer

	recvCQ *CQ
	srq    *SRQ
	rq     recvQueue
	resp   responder

	// errored mirrors state == ERR for PostRecv, which reads it without
	// the engine lock.
	errored atomic.Bool
	// mcastNoRecv counts multicast datagrams dropped for want of a
	// receive (DropMcastNoRecvWQE).
	mcastNoRecv atomic.Uint64
	// id names this QP, until it is reset or destroyed, to the type 2
	// memory windows it binds (see mr.QPID).
	id     mr.QPID
	groups int // multicast groups attached (AttachGroup); Destroy refuses while > 0
	// sqLive and rqLive are set once the requester (RTR->RTS) and the
	// responder (INIT->RTR) are seeded from sq_psn and rq_psn, for Query.
	sqLive, rqLive bool
}

// ErrQPNTaken is returned by Create for a QP number in use or out of range.
var ErrQPNTaken = errors.New("qp: QP number unavailable")

// Create makes a QP in the RESET state.
func (e *Engine) Create(a InitAttr) (*QP, error) {
	switch a.Type {
	case RC, UC, UD:
	default:
		return nil, fmt.Errorf("qp: unsupported QP type %v", a.Type)
	}
	if a.PD == nil || a.SendCQ == nil || a.RecvCQ == nil {
		return nil, errors.New("qp: a QP needs a PD, a send CQ and a receive CQ")
	}
	c := a.Caps
	if err := c.check(a.SRQ != nil); err != nil {
		return nil, err
	}
	if c.MaxSendSGE == 0 {
		c.MaxSendSGE = 1
	}
	if c.MaxRecvSGE == 0 {
		c.MaxRecvSGE = 1
	}
	// The send and receive rings grow on use up to the caps, so an idle
	// QP costs little whatever its caps (10,000 QPs in one engine).
	q := &QP{
		e: e, typ: a.Type, pd: a.PD, sendCQ: a.SendCQ, recvCQ: a.RecvCQ, srq: a.SRQ, caps: c,
		sigAll: a.SigAll,
	}
	if a.SRQ == nil {
		q.rq.max = c.MaxRecvWR
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	now := e.cfg.Clock.Now()
	if a.QPN != 0 {
		if a.QPN > bth.PSNMask || e.qps.get(a.QPN) != nil {
			return nil, fmt.Errorf("%w: %d", ErrQPNTaken, a.QPN)
		}
		if a.QPN >= 2 && e.recentlyClosed(a.QPN, now) {
			return nil, fmt.Errorf("%w: %d was destroyed less than %v ago, and its peer may still send to it", ErrQPNTaken, a.QPN, closedQPHold)
		}
		q.num = a.QPN
	} else {
		for {
			n := e.nextQPN
			e.nextQPN++
			if e.nextQPN > 0xffffff {
				e.nextQPN = 17
			}
			if e.qps.get(n) == nil && !e.recentlyClosed(n, now) {
				q.num = n
				break
			}
		}
	}
	if err := a.SRQ.acquire(); err != nil {
		return nil, err
	}
	if err := a.SendCQ.acquire(); err != nil {
		a.SRQ.release()
		return nil, err
	}
	if a.RecvCQ != a.SendCQ { // a CQ counts QPs, not uses (see CQ.Close)
		if err := a.RecvCQ.acquire(); err != nil {
			a.SendCQ.release()
			a.SRQ.release()
			return nil, err
		}
	}
	q.cc = e.newCC()
	q.ccQuiet = q.cc != nil // at line rate, nothing pending
	q.id = newQPID()
	e.qps.set(q.num, q)
	return q, nil
}

// Num returns the QP number.
func (q *QP) Num() uint32 { return q.num }

// Type returns the QP type.
func (q *QP) Type() Type { return q.typ }

// PD returns the QP's protection domain.
func (q *QP) PD() *mr.PD { return q.pd }

// Caps returns the QP's queue sizes.
func (q *QP) Caps() Caps { return q.caps }

// State returns the QP's current state.
func (q *QP) State() State {
	q.e.mu.Lock()
	defer q.e.mu.Unlock()
	return q.state
}

// Query returns the QP's attributes, with its current PSNs (see below).
func (q *QP) Query() Attr {
	q.e.mu.Lock()
	defer q.e.mu.Unlock()
	a := q.attr
	a.State = q.state
	a.CurState = q.state
	// As rxe (rxe_qp_to_attr), the PSNs are the current ones once the
	// requester and responder run: sq_psn the next PSN the requester
	// sends (rewound by a retry), rq_psn the next PSN the responder
	// expects; before, the configured ones.
	if q.sqLive {
		a.SQPSN = uint32(q.req.psn)
	}
	if q.rqLive {
		a.RQPSN = uint32(q.resp.ePSN)
	}
	return a
}

// Modify changes the QP's state and attributes under ibv_modify_qp's
// rules; on error nothing changes.
func (q *QP) Modify(a *Attr, mask AttrMask) error {
	e := q.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if q.destroyed {
		return ErrClosed
	}
	if err := checkModify(q.typ, q.state, a, mask); err != nil {
		return err
	}
	if mask&AttrPathMTU != 0 && a.PathMTU > e.cfg.MaxMTU {
		// As verbs users expect from the port's active_mtu: a larger
		// path MTU would send packets the link cannot carry.
		return fmt.Errorf("%w: path MTU %d bytes exceeds the port's active MTU %d bytes (the interface's MTU)",
			ErrInvalidModify, a.PathMTU.Bytes(), e.cfg.MaxMTU.Bytes())
	}
	// ACKs held back for the application's answer (see Input) go out
	// before the state changes: a QP moving to ERR must still acknowledge
	// what it received, or the peer retries work that was done.
	e.releaseAcks()
	next := q.state
	if mask&AttrState != 0 {
		next = a.State
	}
	set := func(m AttrMask, f func()) {
		if mask&m != 0 {
			f()
		}
	}
	set(AttrAccessFlags, func() { q.attr.AccessFlags = a.AccessFlags })
	set(AttrPKeyIndex, func() { q.attr.PKeyIndex = a.PKeyIndex })
	set(AttrPort, func() { q.attr.Port = a.Port })
	set(AttrQKey, func() { q.attr.QKey = a.QKey })
	// An IPv4 peer named by its IPv4-mapped GID sends from the IPv4
	// address: keep that form, which received packets are matched with.
	dest := netip.AddrPortFrom(a.Dest.Addr().Unmap(), a.Dest.Port())
	set(AttrAV, func() { q.attr.Dest, q.attr.TrafficClass, q.attr.HopLimit = dest, a.TrafficClass, a.HopLimit })
	set(AttrPathMTU, func() { q.attr.PathMTU = a.PathMTU; q.mtu = a.PathMTU.Bytes() })
	set(AttrTimeout, func() { q.attr.Timeout = a.Timeout })
	set(AttrRetryCnt, func() { q.attr.RetryCnt = a.RetryCnt })
	set(AttrRNRRetry, func() { q.attr.RNRRetry = a.RNRRetry })
	set(AttrRQPSN, func() { q.attr.RQPSN = a.RQPSN })
	set(AttrSQPSN, func() { q.attr.SQPSN = a.SQPSN })
	set(AttrMinRNRTimer, func() { q.attr.MinRNRTimer = a.MinRNRTimer })
	set(AttrMaxQPRdAtomic, func() { q.attr.MaxRdAtomic = a.MaxRdAtomic })
	set(AttrMaxDestRdAtomic, func() { q.attr.MaxDestRdAtomic = a.MaxDestRdAtomic })
	set(AttrDestQPN, func() { q.attr.DestQPN = a.DestQPN })
	if q.typ == UD && q.mtu == 0 {
		q.mtu = e.cfg.MaxMTU.Bytes() // UD messages are bounded by the port's MTU only
	}
	prev := q.state
	q.state = next
	switch {
	case next == Reset:
		q.releaseWindows()
		q.reset()
	case next == Err && prev != Err:
		q.enterError()
	case next == RTR && prev == Init:
		q.resp.init(q)
		q.rqLive = true
	case next == RTS && prev == RTR:
		q.req.init(q)
		q.sqLive = true
		e.kick(q)
	case next == RTS && (prev == SQD || prev == SQE):
		// The requester resumes where it stopped: sq_psn only seeds a QP
		// leaving RTR.
		e.kick(q)
	}
	e.flush()
	return nil
}

// qpIDs issues the QPs' identities for type 2 memory windows.
var qpIDs atomic.Uint64

// newQPID returns a QP identity never issued before (and never 0).
func newQPID() mr.QPID { return mr.QPID(qpIDs.Add(1)) }

// releaseWindows unbinds the type 2 memory windows the QP bound and gives
// it a new identity, for a reset or a destroy: a window serves only the
// QP incarnation that bound it, never a QP created later under the same
// number nor the same QP after RESET (see docs/rnic.md). The engine lock
// is held.
func (q *QP) releaseWindows() {
	q.e.cfg.MRs.ReleaseQP(q.id)
	q.id = newQPID()
}

// reset returns the QP to its freshly created condition; posted work is
// discarded without completions, as verbs does on a move to RESET.
func (q *QP) reset() {
	q.e.releaseAll(q)
	for i := range q.sq {
		q.sq[i] = sendWQE{}
	}
	q.sqHead, q.sqSend, q.sqTail = 0, 0, 0
	q.req = requester{}
	q.resp = responder{}
	for k := range q.timer {
		q.timer[k].deadline = 0 // disarmed; the heap's entries are skimmed as orphans
	}
	q.rq.drain()
	q.attr = Attr{}
	q.mtu = 0
	q.flushing = false
	q.sqLive, q.rqLive = false, false
	q.sendFailed = false
	q.errored.Store(false)
}

// Destroy removes the QP from its engine and lets go of its CQs (see
// CQ.Close). Outstanding work is dropped without completions; move the QP
// to ERR first to have it complete with WR_FLUSH_ERR. While the QP is
// attached to multicast groups (AttachGroup) Destroy fails with ErrBusy
// and changes nothing, as ibv_destroy_qp does: detach it first. (Closing
// the engine destroys it all the same.)
func (q *QP) Destroy() error {
	e := q.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if q.destroyed {
		return ErrClosed
	}
	if q.groups > 0 {
		return fmt.Errorf("%w: QP %d is attached to %d multicast group(s); detach it first", ErrBusy, q.num, q.groups)
	}
	// ACKs held back for the application's answer (see InputPolled) go
	// out first, as in Modify: the peer must learn that what it sent
	// arrived, or it retries, then fails, work that was done.
	e.flushAll()
	q.destroy()
	return nil
}

// McastNoRecvDrops returns how many multicast datagrams the QP dropped
// because no receive was posted (DropMcastNoRecvWQE).
func (q *QP) McastNoRecvDrops() uint64 { return q.mcastNoRecv.Load() }

// Destroyed reports whether the QP was destroyed (Destroy, or its
// engine's Close).
func (q *QP) Destroyed() bool {
	q.e.mu.Lock()
	defer q.e.mu.Unlock()
	return q.destroyed
}

// AttachGroup counts one more multicast group the QP is attached to; the
// engine does not deliver multicast itself (the caller hands it each
// group's datagrams), but Destroy must refuse while any is attached. It
// fails with ErrClosed on a destroyed QP.
func (q *QP) AttachGroup() error {
	q.e.mu.Lock()
	defer q.e.mu.Unlock()
	if q.destroyed {
		return ErrClosed
	}
	q.groups++
	return nil
}

// DetachGroup undoes one AttachGroup.
func (q *QP) DetachGroup() {
	q.e.mu.Lock()
	defer q.e.mu.Unlock()
	if q.groups > 0 {
		q.groups--
	}
}

// destroy takes the QP out of the engine and lets go of its CQs. The
// engine lock is held.
func (q *QP) destroy() {
	q.releaseWindows()
	q.e.releaseAll(q)
	q.destroyed = true
	q.e.qps.del(q.num)
	q.e.quarantine(q.num)
	q.sendCQ.release()
	if q.recvCQ != q.sendCQ {
		q.recvCQ.release()
	}
	q.srq.release()
	if f := q.e.cfg.Destroyed; f != nil {
		f(q)
	}
}

// PostSend posts send work requests. Each is checked before any is
// queued: on error nothing was posted (unlike verbs, which reports the
// first bad WR and keeps the ones before it, rxego rejects the batch).
func (q *QP) PostSend(wrs ...SendWR) error {
	e := q.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if q.destroyed {
		return ErrClosed
	}
	if q.state == Reset || q.state == Init || q.state == RTR {
		return fmt.Errorf("%w: PostSend in state %v: the send queue needs RTS", ErrInvalidWR, q.state)
	}
	need := int(q.sqTail-q.sqHead) + len(wrs)
	if need > q.caps.MaxSendWR {
		return ErrQueueFull
	}
	for i := range wrs {
		if err := q.checkSendWR(&wrs[i]); err != nil {
			return fmt.Errorf("%w (work request %d, wr_id %d)", err, i, wrs[i].ID)
		}
	}
	q.growSQ(need)
	for i := range wrs {
		q.enqueueSend(&wrs[i])
	}
	if e.batching.Load() == 0 {
		// ACKs the receive loop left for this moment (see Input) go in
		// the same system call, those of other QPs ahead of the new
		// requests: they acknowledge what came before, and a peer must
		// see them first (a DREQ overtaking the last ACK would flush
		// completed work). This QP's own ACK follows its requests, since
		// its two directions are independent: shorter than a request,
		// it then ends the request's GSO run, and a ping-pong's reply
		// and ACK reach the peer as one datagram, in one wake-up, where
		// an ACK sent first often wakes the peer alone.
		e.flushAcksBut(q)
	}
	if q.state == Err {
		q.flushSQ()
	} else {
		e.kickPosted(q)
	}
	if !e.leaveToBatch() {
		e.flushAll()
	}
	return nil
}

// ErrInvalidWR is wrapped by PostSend and PostRecv errors about a request
// the QP cannot take: a malformed one, or any in a state that allows no
// posting (send before RTS, receive in RESET).
var ErrInvalidWR = errors.New("qp: invalid work request")

func (q *QP) checkSendWR(wr *SendWR) error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrInvalidWR}, a...)...) }
	op := wr.Opcode
	switch q.typ {
	case UD:
		if op != WRSend && op != WRSendImm {
			return bad("%v not supported on UD", op)
		}
		if wr.AH == nil || !wr.AH.Dest.Addr().IsValid() {
			return bad("UD send needs an address handle")
		}
		if wr.RemoteQPN > 0xffffff {
			return bad("remote QPN exceeds 24 bits")
		}
	case UC:
		switch op {
		case WRSend, WRSendImm, WRWrite, WRWriteImm, WRLocalInv, WRBindMW:
		default:
			return bad("%v not supported on UC", op)
		}
	case RC:
		if !op.known() {
			return bad("unknown opcode %d", op)
		}
	}
	if len(wr.SGL) > q.caps.MaxSendSGE {
		return bad("%d SGEs, QP allows %d", len(wr.SGL), q.caps.MaxSendSGE)
	}
	if wr.Flags&SendInline != 0 {
		if len(wr.Inline) > q.caps.MaxInlineData {
			return bad("%d inline bytes, QP allows %d", len(wr.Inline), q.caps.MaxInlineData)
		}
		if op == WRRead || op == WRCompareSwap || op == WRFetchAdd {
			return bad("%v cannot be inline", op)
		}
	}
	var total uint64
	for _, s := range wr.SGL {
		total += uint64(s.Length)
	}
	if wr.Flags&SendInline != 0 {
		total = uint64(len(wr.Inline))
	}
	if total > maxMessage {
		return bad("message of %d bytes exceeds 2^31", total)
	}
	switch op {
	case WRCompareSwap, WRFetchAdd:
		if total != 8 || len(wr.SGL) != 1 {
			return bad("%v needs one 8-byte SGE", op)
		}
		if wr.RemoteAddr%8 != 0 {
			return bad("%v remote address %#x not 8-byte aligned", op, wr.RemoteAddr)
		}
	case WRAtomicWrite:
		if wr.RemoteAddr%8 != 0 {
			return bad("ATOMIC_WRITE remote address %#x not 8-byte aligned", wr.RemoteAddr)
		}
	}
	if q.typ == UD && total > uint64(q.mtuOrMax()) {
		return bad("UD message of %d bytes exceeds the MTU %d", total, q.mtuOrMax())
	}
	return nil
}

func (q *QP) mtuOrMax() int {
	if q.mtu > 0 {
		return q.mtu
	}
	return q.e.cfg.MaxMTU.Bytes()
}

// growSQ makes the send ring hold at least n WQEs (n <= MaxSendWR),
// doubling it and keeping the WQEs in flight at their sequence numbers.
// The first post makes it only as long as that post needs, so a QP with
// one request in flight at a time reuses one WQE: with thousands of QPs
// posted to in turn, every WQE is cold by its QP's next post, and a ring
// of four (the old minimum) spread those posts over four times the memory.
func (q *QP) growSQ(n int) {
	if n <= len(q.sq) {
		return
	}
	size := min(max(n, 2*len(q.sq)), q.caps.MaxSendWR)
	sq := make([]sendWQE, size)
	for i := q.sqHead; i != q.sqTail; i++ {
		w, old := &sq[i%uint64(size)], &q.sq[i%uint64(len(q.sq))]
		*w = *old
		if len(w.sgl) == 1 && &w.sgl[0] == &old.sge1[0] {
			w.sgl = w.sge1[:] // its own, not the old ring's
			w.wr.SGL = w.sgl
		}
	}
	q.sq = sq
}

func (q *QP) enqueueSend(wr *SendWR) {
	w := &q.sq[q.sqTail%uint64(len(q.sq))]
	var sgl []SGE
	switch len(wr.SGL) {
	case 0:
	case 1:
		w.sge1[0] = wr.SGL[0]
		sgl = w.sge1[:]
	default:
		sgl = append(w.sgls[:0], wr.SGL...)
		w.sgls = sgl
	}
	var inline []byte
	var length uint32
	if wr.Flags&SendInline != 0 {
		inline = append(w.inline[:0], wr.Inline...)
		w.inline = inline
		length = uint32(len(inline))
	} else {
		for _, s := range sgl {
			length += s.Length
		}
	}
	switch wr.Opcode {
	case WRCompareSwap, WRFetchAdd, WRAtomicWrite:
		length = 8
	case WRFlush, WRLocalInv, WRBindMW:
		length = 0
	}
	// Field by field, not a composite literal: that zeroes the whole WQE
	// and then copies it in.
	w.wr = *wr
	w.wr.SGL, w.wr.Inline = sgl, inline
	w.sgl = sgl
	w.length = length
	w.signaled = q.sigAll || wr.Flags&SendSignaled != 0
	w.wqeProgress = wqeProgress{}
	q.sqTail++
}

// PostRecv posts receive work requests.
func (q *QP) PostRecv(wrs ...RecvWR) error {
	if q.srq != nil {
		return fmt.Errorf("%w: QP uses an SRQ; post to the SRQ", ErrInvalidWR)
	}
	q.e.mu.Lock()
	st, destroyed := q.state, q.destroyed
	q.e.mu.Unlock()
	if destroyed {
		return ErrClosed
	}
	if st == Reset {
		return fmt.Errorf("%w: PostRecv in state RESET", ErrInvalidWR)
	}
	for i := range wrs {
		if err := checkRecvWR(&wrs[i], q.caps.MaxRecvSGE); err != nil {
			return err
		}
	}
	if testHookBeforeRecvPut != nil {
		testHookBeforeRecvPut(q)
	}
	if !q.rq.putAll(wrs) {
		return ErrQueueFull // nothing was posted
	}
	// A move to ERR between the state check and the put has already
	// drained the queue: flush what was just posted too.
	if st == Err || q.errored.Load() {
		q.e.mu.Lock()
		q.flushRQ()
		q.e.mu.Unlock()
	}
	return nil
}

// testHookBeforeRecvPut lets a test act between PostRecv's state check
// and its put.
var testHookBeforeRecvPut func(*QP)

func checkRecvWR(wr *RecvWR, maxSGE int) error {
	if len(wr.SGL) > maxSGE {
		return fmt.Errorf("%w: %d SGEs, queue allows %d", ErrInvalidWR, len(wr.SGL), maxSGE)
	}
	return nil
}

// makeRecvWQE copies wr into a receive WQE. A single SGE (the common case)
// is kept inside the WQE, so posting a receive allocates nothing.
func makeRecvWQE(wr *RecvWR) recvWQE {
	w := recvWQE{id: wr.ID, nsge: len(wr.SGL)}
	if len(wr.SGL) == 1 {
		w.one[0] = wr.SGL[0]
	} else if len(wr.SGL) > 1 {
		w.more = append([]SGE(nil), wr.SGL...)
	}
	for _, s := range wr.SGL {
		w.length += s.Length
	}
	return w
}

// takeRecv takes the next receive WQE from the QP's RQ or SRQ.
func (q *QP) takeRecv() (recvWQE, bool) {
	if q.srq != nil {
		return q.srq.take()
	}
	return q.rq.take()
}

// NewSRQ makes a shared receive queue of the given depth.
func (e *Engine) NewSRQ(pd *mr.PD, depth, maxSGE int) (*SRQ, error) {
	if depth <= 0 || depth > MaxWR || maxSGE < 0 || maxSGE > MaxSGE {
		return nil, fmt.Errorf("qp: SRQ size out of range (depth 1..%d, SGEs 0..%d)", MaxWR, MaxSGE)
	}
	if maxSGE == 0 {
		maxSGE = 1
	}
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	return &SRQ{pd: pd, ring: make([]recvWQE, depth), eng: e, maxSGE: maxSGE}, nil
}

// PostRecv posts receive work requests to the SRQ.
func (s *SRQ) PostRecv(wrs ...RecvWR) error {
	for i := range wrs {
		if err := checkRecvWR(&wrs[i], s.maxSGE); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return ErrClosed
	}
	if s.n+len(wrs) > len(s.ring) {
		return ErrQueueFull
	}
	for i := range wrs {
		s.ring[(s.head+s.n)%len(s.ring)] = makeRecvWQE(&wrs[i])
		s.n++
	}
	return nil
}
