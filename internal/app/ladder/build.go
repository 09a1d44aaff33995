package ladder

import (
	"cmp"
	"net/netip"
	"slices"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/app/trace"
)

// badQP is the flow key QP of malformed packets: no real QPN has 32 bits.
const badQP = ^uint32(0)

// maxPSNSample bounds the PSNs a flow remembers for pairing flows.
const maxPSNSample = 4096

// flowKey identifies a one-way flow: packets from src to dst for QP dqp
// (and, for UD, from source QP srcQP).
type flowKey struct {
	src, dst netip.Addr
	dqp      uint32
	srcQP    uint32
	ud       bool
}

// flow is the packets of one flowKey.
type flow struct {
	key       flowKey
	pkts      []int // sequence numbers of its packets
	firstRank int   // time rank of its earliest packet
	class     bth.Class
	classOK   bool
	req       map[bth.PSN]struct{} // request PSNs (a sample)
	resp      map[bth.PSN]struct{} // response PSNs (a sample)
	peer      *flow
}

// Builder collects packets for a Trace. The zero value is not usable; use
// NewBuilder.
type Builder struct {
	pkts       []Packet
	rank       []int // position of each packet in time order
	flows      map[flowKey]*flow
	order      []*flow
	maxPayload int
}

// NewBuilder returns an empty Builder.
func NewBuilder() *Builder { return &Builder{flows: map[flowKey]*flow{}} }

// Add adds one record; it has the signature trace.ReadFile wants.
func (b *Builder) Add(r trace.Record) error {
	b.AddPacket(FromRecord(&r))
	return nil
}

// Len returns how many packets were added.
func (b *Builder) Len() int { return len(b.pkts) }

// FromRecord keeps the fields of r the ladder needs.
func FromRecord(r *trace.Record) Packet {
	p := Packet{Frame: r.Frame, Time: r.Time, Src: r.Src, Dst: r.Dst, ECN: r.ECN, Err: r.Error}
	t := r.RoCE
	if t == nil {
		if p.Err == "" {
			p.Err = "no RoCE header"
		}
		return p
	}
	p.Opcode, p.DestQP, p.PSN, p.AckReq, p.FECN, p.BECN = t.Opcode, t.DestQP, t.PSN, t.AckReq, t.FECN, t.BECN
	p.Len, p.ICRCOK = t.PayloadLen, t.ICRCOK
	if a := t.AETH; a != nil {
		p.HasAETH, p.Syndrome, p.MSN = true, a.Syndrome, a.MSN
	}
	if e := t.RETH; e != nil {
		p.HasRETH, p.DMALen = true, e.DMALen
	}
	if d := t.DETH; d != nil {
		p.HasDETH, p.SrcQP = true, d.SrcQP
	}
	if t.Imm != nil {
		p.HasImm, p.Imm = true, *t.Imm
	}
	if a := t.Atomic; a != nil {
		p.Atomic = &AtomicFields{SwapAdd: a.SwapAdd, Compare: a.Compare}
	}
	if a := t.AtomicAck; a != nil {
		p.Atomic = &AtomicFields{Orig: a.Orig}
	}
	p.CM = t.CM
	return p
}

// AddPacket adds one packet.
func (b *Builder) AddPacket(p Packet) {
	seq := len(b.pkts)
	b.pkts = append(b.pkts, p)
	k := flowKey{src: p.Src, dst: p.Dst, dqp: p.DestQP}
	in := p.Opcode.Info()
	if p.Err != "" || in == nil {
		k.dqp = badQP
	} else if p.HasDETH {
		k.ud, k.srcQP = true, p.SrcQP
	}
	f := b.flows[k]
	if f == nil {
		f = &flow{key: k, req: map[bth.PSN]struct{}{}, resp: map[bth.PSN]struct{}{}}
		b.flows[k] = f
		b.order = append(b.order, f)
	}
	f.pkts = append(f.pkts, seq)
	if in == nil || p.Err != "" {
		return
	}
	if !f.classOK && in.Class != bth.CNP {
		f.class, f.classOK = in.Class, true
	}
	switch {
	case in.Flags&bth.Request != 0 && len(f.req) < maxPSNSample:
		f.req[p.PSN] = struct{}{}
	case in.Flags&bth.Response != 0 && len(f.resp) < maxPSNSample:
		f.resp[p.PSN] = struct{}{}
	}
	if in.Op == bth.OpSend || in.Op == bth.OpWrite || in.Op == bth.OpReadResponse {
		b.maxPayload = max(b.maxPayload, p.Len)
	}
}

// Finish pairs the flows into conversations and analyses them. The
// Builder must not be used afterwards.
func (b *Builder) Finish() *Trace {
	t := &Trace{Packets: len(b.pkts)}
	if len(b.pkts) == 0 {
		return t
	}
	t.Start, t.End = b.pkts[0].Time, b.pkts[0].Time
	for i := range b.pkts {
		t.Start = minTime(t.Start, b.pkts[i].Time)
		t.End = maxTime(t.End, b.pkts[i].Time)
	}
	// Events go in time order: a capture point may write a packet after a
	// reply to it that another goroutine received meanwhile.
	rank := make([]int, len(b.pkts))
	order := make([]int, len(b.pkts))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int { return b.pkts[x].Time.Compare(b.pkts[y].Time) })
	for r, seq := range order {
		rank[seq] = r
	}
	b.rank = rank
	for _, f := range b.order {
		f.firstRank = len(rank)
		for _, seq := range f.pkts {
			f.firstRank = min(f.firstRank, rank[seq])
		}
	}
	slices.SortStableFunc(b.order, func(x, y *flow) int { return x.firstRank - y.firstRank })
	b.pair()
	mtu := 256
	for mtu < b.maxPayload && mtu < 4096 {
		mtu *= 2
	}
	for _, f := range b.order {
		if f.peer != nil && f.peer.firstRank < f.firstRank {
			continue // the conversation starts with its peer
		}
		c := &Conversation{N: len(t.Conversations) + 1}
		b.fill(c, f)
		analyze(c, mtu)
		t.Conversations = append(t.Conversations, c)
	}
	return t
}

// pair matches each flow with the flow of the other direction of the same
// QP pair. UD flows name both QPs; RC and UC flows name only the
// destination, so they are matched by PSNs: one side's requests are the
// PSNs the other side's responses carry. Flows left without evidence are
// paired when they are the only ones between two addresses.
func (b *Builder) pair() {
	type cand struct {
		f, r  *flow
		score int
	}
	type pairKey struct{ src, dst netip.Addr }
	byAddr := map[pairKey][]*flow{} // RC and UC flows between two addresses
	for _, f := range b.order {
		if !f.key.ud && f.key.dqp != badQP {
			pk := pairKey{f.key.src, f.key.dst}
			byAddr[pk] = append(byAddr[pk], f)
		}
	}
	var cands []cand
	for _, f := range b.order {
		k := f.key
		if k.dqp == badQP {
			continue
		}
		if k.ud {
			r := b.flows[flowKey{src: k.dst, dst: k.src, dqp: k.srcQP, srcQP: k.dqp, ud: true}]
			if r != nil && r != f {
				f.peer = r
			}
			continue
		}
		for _, r := range byAddr[pairKey{k.dst, k.src}] {
			if r != f && r.firstRank > f.firstRank {
				cands = append(cands, cand{f, r, overlap(f.req, r.resp) + overlap(r.req, f.resp)})
			}
		}
	}
	slices.SortStableFunc(cands, func(x, y cand) int { return cmp.Compare(y.score, x.score) })
	for _, c := range cands {
		if c.score > 0 && c.f.peer == nil && c.r.peer == nil {
			c.f.peer, c.r.peer = c.r, c.f
		}
	}
	// No evidence (UC, or one-way traffic): pair the only unpaired flows
	// between two addresses.
	alone := func(pk pairKey) []*flow {
		var out []*flow
		for _, f := range byAddr[pk] {
			if f.peer == nil {
				out = append(out, f)
			}
		}
		return out
	}
	for _, f := range b.order {
		if f.peer != nil || f.key.ud || f.key.dqp == badQP {
			continue
		}
		fw, bw := alone(pairKey{f.key.src, f.key.dst}), alone(pairKey{f.key.dst, f.key.src})
		if len(fw) == 1 && len(bw) == 1 && bw[0] != f {
			f.peer, bw[0].peer = bw[0], f
		}
	}
}

// overlap counts the PSNs in both sets.
func overlap(a, b map[bth.PSN]struct{}) int {
	if len(a) > len(b) {
		a, b = b, a
	}
	n := 0
	for p := range a {
		if _, ok := b[p]; ok {
			n++
		}
	}
	return n
}

// fill sets up conversation c from flow f (the A -> B direction) and its
// peer, merging their packets in capture order.
func (b *Builder) fill(c *Conversation, f *flow) {
	k := f.key
	c.A = Endpoint{Addr: k.src}
	c.B = Endpoint{Addr: k.dst, QPN: k.dqp, QPNKnown: k.dqp != badQP}
	if k.ud {
		c.A.QPN, c.A.QPNKnown = k.srcQP, true
	}
	if r := f.peer; r != nil {
		c.A.QPN, c.A.QPNKnown = r.key.dqp, true
	}
	c.Class = f.class
	if !f.classOK && f.peer != nil && f.peer.classOK {
		c.Class = f.peer.class
	}
	if !f.classOK && (f.peer == nil || !f.peer.classOK) {
		c.Class = bth.CNP
	}
	seqs := slices.Clone(f.pkts)
	if f.peer != nil {
		seqs = append(seqs, f.peer.pkts...)
	}
	slices.SortFunc(seqs, func(x, y int) int { return b.rank[x] - b.rank[y] })
	fromA := map[int]bool{}
	for _, s := range f.pkts {
		fromA[s] = true
	}
	c.Events = make([]Event, 0, len(seqs))
	for _, s := range seqs {
		p := &b.pkts[s]
		c.Events = append(c.Events, Event{Pkt: p, Time: p.Time, FromA: fromA[s]})
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Annotate adds a note at time at to the conversations that have ep as
// one of their endpoints (matching address and QPN), or to every
// conversation when ep is nil: the demo marks rate changes this way. A
// note before the first packet is shown at its time.
func (t *Trace) Annotate(at time.Time, ep *Endpoint, text string) {
	early := at.Before(t.Start)
	if early {
		at = t.Start
	}
	for _, c := range t.Conversations {
		if ep != nil && !c.has(*ep) {
			continue
		}
		i := 0
		if !early {
			i, _ = slices.BinarySearchFunc(c.Events, at, func(e Event, at time.Time) int {
				if e.Time.After(at) {
					return 1
				}
				return -1 // equal times: after the packets of that instant
			})
		}
		fromA := ep == nil || (c.A.Addr == ep.Addr && c.A.QPN == ep.QPN)
		c.Events = slices.Insert(c.Events, i, Event{Time: at, FromA: fromA, Marks: MarkNote, Label: text})
	}
}

// has reports whether ep is one of c's endpoints.
func (c *Conversation) has(ep Endpoint) bool {
	for _, e := range []Endpoint{c.A, c.B} {
		if e.Addr == ep.Addr && e.QPNKnown && e.QPN == ep.QPN {
			return true
		}
	}
	return false
}
