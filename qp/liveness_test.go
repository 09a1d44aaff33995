package qp

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
)

// The liveness checker (issue 16): on the virtual-time fabric, each seed
// draws a random mix of operations, posted in random lists at random
// times, and a random mix of loss, duplication, reordering, jitter, CE
// marks (so CNPs and rate cuts), receivers that run dry (RNR) and PSNs
// that wrap, and checks that every work request completes in bounded
// virtual time, with success or an error verbs defines, and that data
// and atomics take effect exactly once. docs/reliability.md describes it.

var (
	livenessLong  = flag.Bool("long", false, "liveness checker: run many more seeds")
	livenessSeeds = flag.Int("liveness.seeds", 0, "liveness checker: seeds per transport (0: the default)")
	livenessSeed  = flag.Uint64("liveness.seed", 0, "liveness checker: run only this seed")
	livenessTrace = flag.Bool("liveness.trace", false, "liveness checker: print every packet (with -liveness.seed)")
)

// livenessSeedCount is the seeds each transport runs: a bounded number in
// CI (the RC run dominates; measured in docs/reliability.md), many more
// with -long.
func livenessSeedCount(typ Type) uint64 {
	n := map[Type]uint64{RC: 800, UC: 300, UD: 300}[typ]
	if testing.Short() {
		n /= 10
	}
	if *livenessLong {
		n *= 40
	}
	if *livenessSeeds > 0 {
		n = uint64(*livenessSeeds)
	}
	return n
}

// TestLiveness runs the checker for RC, UC and UD. A failing seed is
// reported with the command that replays it alone.
func TestLiveness(t *testing.T) {
	for _, typ := range []Type{RC, UC, UD} {
		t.Run(typ.String(), func(t *testing.T) {
			if *livenessSeed != 0 {
				if msg := runLiveness(t, typ, *livenessSeed, &lvSum{}); msg != "" {
					t.Fatal(msg)
				}
				return
			}
			n := livenessSeedCount(typ)
			base := uint64(typ) << 40
			var sum lvSum
			for s := base + 1; s <= base+n; s++ {
				if msg := runLiveness(t, typ, s, &sum); msg != "" {
					t.Fatalf("seed %d: %s\nreproduce: go test ./qp/ -run 'TestLiveness/%v$' -liveness.seed=%d -v", s, msg, typ, s)
				}
			}
			t.Logf("%d seeds: %+v", n, sum)
		})
	}
}

// lvSum totals what the seeds did, to show that they did it.
type lvSum struct {
	WRs, Errors, Received, Retransmits, RNRNAKs, SeqNAKs, CNPs, Dropped, Packets uint64
	VirtualTime                                                                  time.Duration
}

// lvOverride, if set, adjusts each seed's impairments (for experiments).
var lvOverride func(*lvImpair)

// lvImpair is one seed's network.
type lvImpair struct {
	loss, dup, hold, ce   float64
	burstEnter, burstExit float64 // burst loss (0: none)
	delay, jitter         time.Duration
}

func (m lvImpair) String() string {
	return fmt.Sprintf("loss %.3f burst %.3f/%.2f dup %.3f hold %.3f ce %.3f delay %v jitter %v",
		m.loss, m.burstEnter, m.burstExit, m.dup, m.hold, m.ce, m.delay, m.jitter)
}

// drawImpair picks which impairments a seed combines, and how strong.
func drawImpair(rng *rand.Rand) lvImpair {
	var m lvImpair
	pick := func(p, hi float64) float64 {
		if rng.Float64() < p {
			return rng.Float64() * hi
		}
		return 0
	}
	m.loss = pick(0.5, 0.05)
	m.dup = pick(0.4, 0.05)
	m.hold = pick(0.4, 0.1)
	m.ce = pick(0.3, 0.2)
	m.delay = time.Duration(1+rng.IntN(20)) * time.Microsecond
	if rng.Float64() < 0.5 {
		m.jitter = time.Duration(rng.IntN(200)) * time.Microsecond
	}
	return m
}

// lvWR is a planned work request and what became of it.
type lvWR struct {
	wr    SendWR
	size  int
	recv  bool   // consumes a receive at the responder
	orig  uint64 // RC atomics: the value the counter held before it
	value uint64 // RC atomics: the counter after it
	done  bool
	st    WCStatus
}

// lvFlow is one direction's workload: requester rq sending to responder
// rs, with its own memory on both sides.
type lvFlow struct {
	f      *fabric
	rng    *rand.Rand
	typ    Type
	rq, rs *endpoint
	mtu    int
	slot   int // bytes per WR slot
	lm, rm *mr.MR
	lb, rb []byte // requester and responder memory
	recvAt int    // offset of the receive buffers in rb
	nRecv  int    // receive buffers
	ctrAt  int    // offset of the atomic counter in rb
	ctr    uint64 // the counter's initial value
	wrs    []lvWR
	posted int // WRs posted
	seen   int // send completions seen
	// receives
	recvOrder []int // RC: WR indexes that consume a receive, in post order
	recvd     int   // receive completions seen
	got       []int // UC/UD: deliveries of each WR
	copies    []int // UD: copies of each WR the network delivered
	free      []int // receive buffers not posted
	repost    time.Duration
	errSeen   bool
	fail      string
	// alwaysRecv keeps every receive posted (no RNR), for runs that
	// measure something else.
	alwaysRecv bool
}

// lvDepth is each QP's send and receive queue depth; lvLong*MTU+5 bytes
// is the longest message (at MTUs up to 1024).
const (
	lvDepth = 32
	lvLong  = 20
)

func newFlow(f *fabric, rng *rand.Rand, typ Type, rq, rs *endpoint, mtu, n int, t *testing.T) *lvFlow {
	fl := &lvFlow{f: f, rng: rng, typ: typ, rq: rq, rs: rs, mtu: mtu}
	maxSize := 2*mtu + 3
	if mtu <= 1024 {
		maxSize = lvLong*mtu + 5
	}
	if typ == UD {
		maxSize = mtu
	}
	fl.slot = (maxSize + 7) &^ 7
	fl.nRecv = lvDepth
	fl.lm, fl.lb = rq.n.reg(t, n*fl.slot, allAccess)
	fl.recvAt = n * fl.slot
	fl.ctrAt = fl.recvAt + fl.nRecv*(fl.slot+GRHLen)
	fl.rm, fl.rb = rs.n.reg(t, fl.ctrAt+16, allAccess)
	fl.ctrAt = aligned8(fl.rm, fl.ctrAt)
	fastFill(fl.lb, rng.Uint64())
	fastFill(fl.rb, rng.Uint64())
	fl.ctr = binary.NativeEndian.Uint64(fl.rb[fl.ctrAt:])
	fl.plan(n)
	return fl
}

// plan draws n work requests.
func (fl *lvFlow) plan(n int) {
	rng, mtu := fl.rng, fl.mtu
	ops := []WROpcode{WRSend, WRSendImm, WRWrite, WRWriteImm, WRRead, WRFetchAdd, WRCompareSwap, WRAtomicWrite, WRFlush}
	switch fl.typ {
	case UC:
		ops = ops[:4]
	case UD:
		ops = ops[:2]
	}
	sizes := []int{0, 1, mtu - 1, mtu, mtu + 1, 2*mtu + 3, 8 + rng.IntN(mtu)}
	if fl.typ != UD && mtu <= 1024 {
		sizes = append(sizes, lvLong*mtu+5) // a long READ response, ACK requests inside messages
	}
	ctr := fl.ctr
	for i := range n {
		op := ops[rng.IntN(len(ops))]
		size := sizes[rng.IntN(len(sizes))]
		if fl.typ == UD {
			size = min(size, mtu)
		}
		if fl.typ != RC {
			size = max(size, 4) // room for the WR's index
		}
		off := i * fl.slot
		w := lvWR{size: size}
		w.wr = SendWR{ID: uint64(i), Opcode: op, Flags: SendSignaled,
			SGL:        []SGE{{Addr: fl.lm.IOVA() + uint64(off), Length: uint32(size), LKey: fl.lm.LKey()}},
			RemoteAddr: fl.rm.IOVA() + uint64(off), RKey: fl.rm.RKey(), Imm: uint32(i)}
		if fl.typ != RC {
			binary.LittleEndian.PutUint32(fl.lb[off:], uint32(i))
		}
		if rng.IntN(5) == 0 && i != n-1 {
			w.wr.Flags &^= SendSignaled
		}
		if fl.typ == RC && rng.IntN(10) == 0 {
			w.wr.Flags |= SendFence
		}
		if (op == WRSend || op == WRSendImm || op == WRWrite || op == WRWriteImm) && size <= 256 && rng.IntN(3) == 0 {
			w.wr.Flags |= SendInline
			w.wr.Inline, w.wr.SGL = fl.lb[off:off+size], nil
		}
		switch op {
		case WRSend, WRSendImm, WRWriteImm:
			w.recv = true
			fl.recvOrder = append(fl.recvOrder, i)
		case WRFetchAdd, WRCompareSwap, WRAtomicWrite:
			w.wr.SGL[0].Length = 8
			w.size = 8
			w.wr.RemoteAddr = fl.rm.IOVA() + uint64(fl.ctrAt)
			w.orig = ctr
			switch op {
			case WRFetchAdd:
				w.wr.CompareAdd = rng.Uint64()
				ctr += w.wr.CompareAdd
			case WRCompareSwap:
				w.wr.CompareAdd, w.wr.Swap = rng.Uint64(), rng.Uint64()
				if rng.IntN(2) == 0 {
					w.wr.CompareAdd = ctr
				}
				if w.wr.CompareAdd == ctr {
					ctr = w.wr.Swap
				}
			case WRAtomicWrite:
				binary.NativeEndian.PutUint64(w.wr.AtomicValue[:], rng.Uint64())
				ctr = binary.NativeEndian.Uint64(w.wr.AtomicValue[:])
			}
			w.value = ctr
		case WRFlush:
			w.wr.SGL = nil
			w.wr.FlushType, w.wr.FlushLength = 1, uint32(size)
		}
		if fl.typ == UD {
			w.wr.AH = &AH{Dest: fl.rs.n.addr}
			w.wr.RemoteQPN, w.wr.RemoteQKey = fl.rs.qp.Num(), 0x2222
		}
		fl.wrs = append(fl.wrs, w)
	}
	fl.got = make([]int, n)
	fl.copies = make([]int, n)
}

// start posts the first receives and schedules the first post.
func (fl *lvFlow) start() {
	for i := fl.nRecv - 1; i >= 0; i-- {
		fl.free = append(fl.free, i)
	}
	if !fl.alwaysRecv && fl.rng.IntN(3) > 0 {
		fl.repost = time.Duration(fl.rng.IntN(300)) * time.Microsecond // the receiver runs dry
	}
	for range 1 + fl.rng.IntN(3) {
		fl.postRecv()
	}
	if fl.repost == 0 {
		for len(fl.free) > 0 {
			fl.postRecv()
		}
	}
	fl.f.after(0, fl.postSome)
}

func (fl *lvFlow) recvBuf(k int) (off, n int) {
	return fl.recvAt + k*(fl.slot+GRHLen), fl.slot + GRHLen
}

func (fl *lvFlow) postRecv() {
	if len(fl.free) == 0 || fl.rs.qp.State() == Err {
		return
	}
	k := fl.free[len(fl.free)-1]
	fl.free = fl.free[:len(fl.free)-1]
	off, n := fl.recvBuf(k)
	if err := fl.rs.qp.PostRecv(RecvWR{ID: uint64(k), SGL: []SGE{{Addr: fl.rm.IOVA() + uint64(off), Length: uint32(n), LKey: fl.rm.LKey()}}}); err != nil {
		fl.failf("PostRecv: %v", err)
	}
}

// postSome posts a list of 1 to 4 WRs, room permitting, and schedules
// the next list.
func (fl *lvFlow) postSome() {
	if fl.posted == len(fl.wrs) {
		return
	}
	n := min(1+fl.rng.IntN(4), len(fl.wrs)-fl.posted, lvDepth-(fl.posted-fl.seen))
	if n > 0 {
		list := make([]SendWR, n)
		for i := range list {
			list[i] = fl.wrs[fl.posted+i].wr
		}
		if err := fl.rq.qp.PostSend(list...); err != nil {
			fl.failf("PostSend: %v", err)
			return
		}
		fl.posted += n
	}
	fl.f.after(time.Duration(fl.rng.IntN(100))*time.Microsecond, fl.postSome)
}

func (fl *lvFlow) failf(format string, a ...any) {
	if fl.fail == "" {
		fl.fail = fmt.Sprintf(format, a...)
	}
}

// poll takes completions and checks each.
func (fl *lvFlow) poll() {
	for _, wc := range pollAll(fl.rq.scq) {
		fl.sendDone(wc)
	}
	for _, wc := range pollAll(fl.rs.rcq) {
		fl.recvDone(wc)
	}
}

// sendDone checks a send completion: in order, once, with success or a
// verbs error, and the data or atomic result right.
func (fl *lvFlow) sendDone(wc WC) {
	// Unsignaled WRs before this one completed silently, with success:
	// an error would have made a completion.
	for fl.seen < len(fl.wrs) && uint64(fl.seen) < wc.ID && fl.wrs[fl.seen].wr.Flags&SendSignaled == 0 {
		fl.wrs[fl.seen].done = true
		fl.seen++
	}
	if wc.ID != uint64(fl.seen) {
		fl.failf("send completion for WR %d, expected WR %d (%v)", wc.ID, fl.seen, wc.Status)
		return
	}
	w := &fl.wrs[fl.seen]
	fl.seen++
	w.done, w.st = true, wc.Status
	if wc.Opcode != wcOpcodeOf(w.wr.Opcode) {
		fl.failf("WR %d %v completed as %v", wc.ID, w.wr.Opcode, wc.Opcode)
	}
	if wc.Status != WCSuccess {
		switch {
		case fl.errSeen && wc.Status == WCWRFlushErr:
		case !fl.errSeen && fl.typ == RC && (wc.Status == WCRetryExcErr || wc.Status == WCRNRRetryExcErr) && fl.rq.qp.State() == Err:
			fl.errSeen = true
		default:
			fl.failf("WR %d %v completed %v (error seen before: %v)", wc.ID, w.wr.Opcode, wc.Status, fl.errSeen)
		}
		return
	}
	if fl.errSeen {
		fl.failf("WR %d succeeded after an error completion", wc.ID)
	}
	if fl.typ != RC {
		return
	}
	i := int(wc.ID)
	off := i * fl.slot
	fl.rs.n.e.Sync()
	switch w.wr.Opcode {
	case WRWrite, WRWriteImm:
		if !bytes.Equal(fl.rb[off:off+w.size], fl.lb[off:off+w.size]) {
			fl.failf("WR %d WRITE of %d bytes: responder memory differs", i, w.size)
		}
	case WRRead:
		if !bytes.Equal(fl.rb[off:off+w.size], fl.lb[off:off+w.size]) || wc.ByteLen != uint32(w.size) {
			fl.failf("WR %d READ of %d bytes: data differs (len %d)", i, w.size, wc.ByteLen)
		}
	case WRFetchAdd, WRCompareSwap:
		if got := binary.NativeEndian.Uint64(fl.lb[off:]); got != w.orig {
			fl.failf("WR %d %v returned %#x, want %#x (an atomic ran twice or not at all)", i, w.wr.Opcode, got, w.orig)
		}
	}
}

// recvDone checks a receive completion: for RC the next message in
// order, for UC and UD a message not delivered before; bytes exact.
func (fl *lvFlow) recvDone(wc WC) {
	if wc.Status == WCWRFlushErr && fl.rs.qp.State() == Err {
		return
	}
	if wc.Status != WCSuccess {
		fl.failf("receive completed %v", wc.Status)
		return
	}
	k := int(wc.ID)
	boff, _ := fl.recvBuf(k)
	if fl.typ == UD {
		boff += GRHLen
	}
	fl.rs.n.e.Sync()
	var i int
	if fl.typ == RC {
		if fl.recvd >= len(fl.recvOrder) {
			fl.failf("receive completion %d: more than the %d messages sent (a message delivered twice)", fl.recvd, len(fl.recvOrder))
			return
		}
		i = fl.recvOrder[fl.recvd]
	} else {
		i = int(wc.Imm)
		if wc.Flags&WCWithImm == 0 {
			i = int(binary.LittleEndian.Uint32(fl.rb[boff:]))
		}
		if i >= len(fl.wrs) || !fl.wrs[i].recv {
			fl.failf("receive completion names WR %d, which sent nothing to a receive", i)
			return
		}
		fl.got[i]++
		if fl.got[i] > 1 && (fl.typ == UC || fl.got[i] > fl.copies[i]) {
			// UD has no duplicate detection (IBTA, rxe, RNICs): a
			// datagram the network delivered twice arrives twice. The
			// engine itself must never deliver one more often.
			fl.failf("WR %d delivered %d times (the network delivered %d copies; counted for UD only)", i, fl.got[i], fl.copies[i])
			return
		}
	}
	fl.recvd++
	w := &fl.wrs[i]
	off := i * fl.slot
	withImm := w.wr.Opcode == WRSendImm || w.wr.Opcode == WRWriteImm
	if withImm != (wc.Flags&WCWithImm != 0) || withImm && wc.Imm != uint32(i) {
		fl.failf("WR %d %v: receive flags %v imm %d", i, w.wr.Opcode, wc.Flags, wc.Imm)
	}
	if w.wr.Opcode == WRWriteImm {
		if wc.Opcode != WCRecvRDMAImm || !bytes.Equal(fl.rb[off:off+w.size], fl.lb[off:off+w.size]) {
			fl.failf("WR %d WRITE_IMM: opcode %v or data differs", i, wc.Opcode)
		}
	} else {
		n := uint32(w.size)
		if fl.typ == UD {
			n += GRHLen
		}
		if wc.Opcode != WCRecv || wc.ByteLen != n || !bytes.Equal(fl.rb[boff:boff+w.size], fl.lb[off:off+w.size]) {
			fl.failf("WR %d %v of %d bytes: received %v len %d, bytes equal %v", i, w.wr.Opcode, w.size, wc.Opcode, wc.ByteLen,
				bytes.Equal(fl.rb[boff:boff+w.size], fl.lb[off:off+w.size]))
		}
	}
	fl.free = append(fl.free, k)
	if fl.repost == 0 {
		fl.postRecv()
	} else {
		fl.f.after(time.Duration(fl.rng.Int64N(int64(fl.repost)+1)), fl.postRecv)
	}
}

// finish checks what only the end shows: every WR completed, the RC
// counter holds the last atomic's value, and every message was received.
func (fl *lvFlow) finish() {
	if fl.seen != len(fl.wrs) {
		return
	}
	if fl.typ != RC || fl.errSeen {
		return
	}
	fl.rs.n.e.Sync()
	want := fl.ctr
	for _, w := range fl.wrs {
		switch w.wr.Opcode {
		case WRFetchAdd, WRCompareSwap, WRAtomicWrite:
			want = w.value
		}
	}
	if got := binary.NativeEndian.Uint64(fl.rb[fl.ctrAt:]); got != want {
		fl.failf("counter %#x at the end, want %#x", got, want)
	}
	if fl.recvd != len(fl.recvOrder) {
		fl.failf("%d receive completions, %d messages sent", fl.recvd, len(fl.recvOrder))
	}
}

// lvBound is the virtual time within which every WR must complete (the
// posting is over within a few milliseconds), and lvStall the longest a
// flow may go without a completion. With a timeout of at most 16 ms,
// infinite retries and at most 5% loss, a live QP finishes far inside
// both.
const (
	lvBound = 20 * time.Second
	lvStall = 5 * time.Second
)

// runLiveness runs one seed and returns what went wrong, or "".
func runLiveness(t *testing.T, typ Type, seed uint64, sum *lvSum) string {
	rng := rand.New(rand.NewPCG(seed, seed*0x9e3779b97f4a7c15))
	f := newFabric(t)
	f.rng = rand.New(rand.NewPCG(seed^1, seed))
	f.trace = *livenessTrace
	window, ackEvery := []int{0, 0, 8, 32}[rng.IntN(4)], []int{0, 0, 1, 3}[rng.IntN(4)]
	// READ splitting (readsplit.go), drawn from a stream of its own so
	// the other draws stay as they were: requests of one response to
	// several, a budget for one chunk or a few.
	rs := rand.New(rand.NewPCG(seed, 79))
	readChunk, readBudget := []int{0, 0, 256, 1000, 3000, 8192}[rs.IntN(6)], []int{0, 0, 4096, 20000}[rs.IntN(4)]
	f.engineCfg = func(c *Config) {
		c.Window, c.AckEvery = window, ackEvery
		c.ReadChunk, c.ReadBudget = readChunk, readBudget
	}
	mtus := []MTU{MTU256, MTU1024, MTU4096}
	o := defaultConn()
	o.mtu = mtus[rng.IntN(len(mtus))]
	o.apsn = 0xFFFFFF - uint32(rng.IntN(200)) // the PSNs wrap
	o.bpsn = rng.Uint32N(1 << 24)
	o.timeout = uint8(8 + rng.IntN(5)) // 1 to 16 ms
	o.minRN = uint8(1 + rng.IntN(6))
	o.rdAtomic = uint8(1 + rng.IntN(8))
	finite := typ == RC && rng.IntN(5) == 0
	if finite {
		o.retry, o.rnr = uint8(rng.IntN(7)), uint8(rng.IntN(7))
	}
	var a, b *endpoint
	if typ == UD {
		a = f.node("198.18.0.1").newQP(t, UD, lvDepth)
		b = f.node("198.18.0.2").newQP(t, UD, lvDepth)
		bringUD(t, a, o.apsn, 0x2222)
		bringUD(t, b, o.bpsn, 0x2222)
	} else {
		a = f.node("198.18.0.1").newQP(t, typ, lvDepth)
		b = f.node("198.18.0.2").newQP(t, typ, lvDepth)
		connect(t, a, b, o)
	}
	mtu := o.mtu.Bytes()
	if typ == UD {
		mtu = 1024
	}
	m := drawImpair(rng)
	if b := rand.New(rand.NewPCG(seed, 77)); b.IntN(5) == 0 {
		// drawn from a stream of its own, so the other draws stay as they were
		m.burstEnter, m.burstExit = 0.002+b.Float64()*0.01, 0.2+b.Float64()*0.5
	}
	if lvOverride != nil {
		lvOverride(&m)
	}
	var flows []*lvFlow
	bad := false // Gilbert-Elliott: every packet in the bad state is lost
	f.drop = func(wirePkt) bool {
		if m.burstEnter > 0 {
			if bad {
				bad = f.rng.Float64() >= m.burstExit
			} else {
				bad = f.rng.Float64() < m.burstEnter
			}
			if bad {
				return true
			}
		}
		return m.loss > 0 && f.rng.Float64() < m.loss
	}
	f.dup = m.dup
	if typ == UD {
		f.tap = func(p wirePkt, pkt bth.Packet) {
			for _, fl := range flows {
				if p.dst == fl.rs.n.addr && len(pkt.Payload()) >= 4 {
					if i := int(binary.LittleEndian.Uint32(pkt.Payload())); i < len(fl.copies) {
						fl.copies[i]++
					}
				}
			}
		}
	}
	f.mark = func(wirePkt) bool { return m.ce > 0 && f.rng.Float64() < m.ce }
	f.delay = func(wirePkt) time.Duration {
		d := m.delay
		if m.jitter > 0 {
			d += time.Duration(f.rng.Int64N(int64(m.jitter)))
		}
		if m.hold > 0 && f.rng.Float64() < m.hold {
			d += time.Duration(5+f.rng.IntN(100)) * time.Microsecond
		}
		return d
	}
	flows = []*lvFlow{newFlow(f, rng, typ, a, b, mtu, 20+rng.IntN(40), t)}
	if rng.IntN(2) == 0 {
		flows = append(flows, newFlow(f, rng, typ, b, a, mtu, 10+rng.IntN(30), t))
	}
	for _, fl := range flows {
		fl.start()
	}
	describe := func(why string) string {
		var s strings.Builder
		fmt.Fprintf(&s, "%s at %v\n  %v mtu %d apsn %#x timeout %d retry %d rnr %d minRNR %d rdAtomic %d window %d ackEvery %d readChunk %d readBudget %d; %v", why, f.clock.now,
			typ, mtu, o.apsn, o.timeout, o.retry, o.rnr, o.minRN, o.rdAtomic, window, ackEvery, readChunk, readBudget, m)
		for i, fl := range flows {
			fmt.Fprintf(&s, "\n  flow %d: %d WRs, %d posted, %d completed, %d received", i, len(fl.wrs), fl.posted, fl.seen, fl.recvd)
		}
		fmt.Fprintf(&s, "\n  A %s\n  B %s", dumpQP(a.qp), dumpQP(b.qp))
		return s.String()
	}
	lastDone, lastSeen := f.clock.now, 0
	for {
		all, seen := true, 0
		for _, fl := range flows {
			fl.poll()
			if fl.fail != "" {
				return describe(fl.fail)
			}
			all = all && fl.seen == len(fl.wrs)
			seen += fl.seen
		}
		if all {
			break
		}
		if seen != lastSeen {
			lastDone, lastSeen = f.clock.now, seen
		}
		if f.clock.now-lastDone > lvStall {
			return describe(fmt.Sprintf("no completion for %v", lvStall))
		}
		if f.clock.now > lvBound {
			return describe(fmt.Sprintf("WRs outstanding after %v", lvBound))
		}
		if !f.step(f.clock.now + lvStall) {
			return describe("hang: work outstanding, no packet in flight, no timer armed")
		}
	}
	// Let stragglers (duplicates, late responses) land, then look again:
	// nothing may complete twice or be received twice.
	f.run(100 * time.Millisecond)
	for _, fl := range flows {
		fl.poll()
		fl.finish()
		if fl.fail != "" {
			return describe(fl.fail)
		}
	}
	for _, fl := range flows {
		sum.WRs += uint64(len(fl.wrs))
		sum.Received += uint64(fl.recvd)
		for _, w := range fl.wrs {
			if w.st != WCSuccess {
				sum.Errors++
			}
		}
	}
	for _, ep := range []*endpoint{a, b} {
		st := &ep.n.e.Stats
		sum.Retransmits += st.Retransmits.Load()
		sum.RNRNAKs += st.RcvdRNRErr.Load()
		sum.SeqNAKs += st.RcvdSeqErr.Load()
		sum.CNPs += st.CNPsReceived.Load()
	}
	sum.Dropped += uint64(f.dropped)
	sum.Packets += uint64(f.delivered)
	sum.VirtualTime += f.clock.now
	for _, ep := range []*endpoint{a, b} {
		if q := ep.qp; typ == RC && q.State() == RTS && q.req.compPSN != q.req.maxSent {
			return describe("RTS with PSNs unacknowledged after every WR completed")
		}
	}
	return ""
}
