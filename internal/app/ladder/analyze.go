package ladder

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/reth"
)

// maxLookback bounds how far back a retransmission or response looks for
// its message.
const maxLookback = 1024

// outPkt is a request packet not yet acknowledged.
type outPkt struct {
	psn     bth.PSN
	at      time.Time
	ev      int // its latest transmission's event
	msg     *Message
	retx    bool // sent more than once: no RTT sample (Karn)
	sampled bool // its RTT sample was taken
	ackReq  bool
}

// recovery is why a requester is resending: a NAK, an RNR NAK or a
// timeout, from which PSN on, and whether the reason was already told.
type recovery struct {
	kind  Kind // KindNAK, KindRNR, KindRequest (timeout); KindBad when none
	from  bth.PSN
	at    time.Time
	timer uint8 // RNR timer field
	told  bool
}

// reqState follows one side's requests.
type reqState struct {
	started bool
	next    bth.PSN // the first PSN not yet used by a request
	open    *Message
	out     []outPkt
	msgs    []*Message
	lastAck bth.PSN
	acked   bool
	rec     recovery
	respHi  map[*Message]bth.PSN // highest READ response PSN seen per READ
}

// analyzer holds the state of one conversation's analysis.
type analyzer struct {
	c   *Conversation
	mtu int
	st  [2]reqState
}

// analyze fills in c's messages, marks, labels and statistics. mtu is the
// path MTU guessed from the trace, for the PSNs a READ uses.
func analyze(c *Conversation, mtu int) {
	a := &analyzer{c: c, mtu: mtu}
	for i := range a.st {
		a.st[i].respHi = map[*Message]bth.PSN{}
		a.st[i].rec.kind = KindBad
	}
	for i := range c.Events {
		a.event(i)
	}
}

// side returns 0 for A and 1 for B.
func side(fromA bool) int {
	if fromA {
		return 0
	}
	return 1
}

func (a *analyzer) event(i int) {
	ev := &a.c.Events[i]
	p := ev.Pkt
	in := p.Opcode.Info()
	if p.Err != "" || in == nil {
		ev.Kind, ev.Marks = KindBad, MarkMalformed
		ev.Label = "malformed"
		ev.Notes = append(ev.Notes, p.Err)
		return
	}
	s := side(ev.FromA)
	if p.ECN == 3 {
		ev.Marks |= MarkCE
	}
	if !p.ICRCOK {
		ev.Marks |= MarkBadICRC
		ev.Notes = append(ev.Notes, "ICRC does not check: the receiver drops this packet")
	}
	switch {
	case in.Op == bth.OpCNP:
		ev.Kind, ev.Marks = KindCNP, ev.Marks|MarkCNP
		ev.Label = "CNP"
		if p.ICRCOK {
			a.c.Stats[1-s].CNPs++
			ev.Notes = append(ev.Notes, "congestion notification: the data sender must slow down")
		}
	case in.Flags&bth.Request != 0:
		ev.Kind = KindRequest
		if p.ICRCOK {
			a.request(i, s, in)
			if p.CM != nil {
				ev.Notes = append(ev.Notes, p.CM.String())
			}
		} else {
			ev.Label = shortName(in) + " psn " + strconv.Itoa(int(p.PSN))
		}
	default:
		a.response(i, 1-s, in)
	}
	if ev.Marks&MarkCE != 0 && ev.Kind == KindRequest {
		a.c.Stats[s].CEMarks++
	}
}

// request handles a request packet from side s.
func (a *analyzer) request(i, s int, in *bth.Info) {
	ev := &a.c.Events[i]
	p := ev.Pkt
	st := &a.st[s]
	stats := &a.c.Stats[s]
	stats.Packets++
	if !st.started {
		st.started, st.next = true, p.PSN
	}
	if p.PSN.Before(st.next) {
		a.retransmit(i, s, in)
		ev.Label = requestLabel(p, in, ev.Msg)
		return
	}
	if gap := p.PSN.Diff(st.next); gap > 0 {
		ev.Marks |= MarkGap
		ev.Notes = append(ev.Notes, fmt.Sprintf("PSN jumped from %d to %d: %d packets missing from the capture", st.next, p.PSN, gap))
	}
	// A new packet: find or start its message.
	st.rec = recovery{kind: KindBad}
	var m *Message
	if in.Flags&bth.First != 0 || st.open == nil {
		m = &Message{N: len(a.c.Messages) + 1, FromA: s == 0, Op: opName(in), FirstPSN: p.PSN, Start: p.Time,
			answered: in.Op != bth.OpSend && in.Op != bth.OpWrite}
		if in.Flags&bth.First == 0 {
			m.Status = "started before the capture"
		}
		a.c.Messages = append(a.c.Messages, m)
		st.msgs = append(st.msgs, m)
		stats.Messages++
		st.open = m
	} else {
		m = st.open
	}
	if in.Flags&(bth.Imm|bth.Inv) != 0 {
		m.Op = opName(in)
	}
	if p.CM != nil {
		m.Op = "CM " + p.CM.Msg
	}
	m.LastPSN = p.PSN
	m.Packets++
	span := 1
	switch in.Op {
	case bth.OpFetchAdd, bth.OpCompareSwap:
		m.Bytes = 8 // the operand
		stats.Bytes += 8
	case bth.OpReadRequest:
		m.Bytes = int(p.DMALen)
		span = max(1, (int(p.DMALen)+a.mtu-1)/a.mtu)
		m.LastPSN = p.PSN.Add(span - 1)
		stats.Bytes += int64(p.DMALen)
	default:
		m.Bytes += p.Len
		stats.Bytes += int64(p.Len)
	}
	if in.Flags&bth.Last != 0 {
		st.open = nil
		if a.c.Class == bth.UC || a.c.Class == bth.UD {
			m.Done, m.End = true, p.Time // no response will come
		}
	}
	st.next = p.PSN.Add(span)
	ev.Msg = m
	ev.Label = requestLabel(p, in, m)
	if a.c.Class == bth.RC {
		st.out = append(st.out, outPkt{psn: p.PSN, at: p.Time, ev: i, msg: m, ackReq: p.AckReq || span > 1 || in.Op != bth.OpSend && in.Op != bth.OpWrite})
	}
}

// retransmit handles a request packet from side s whose PSN was used
// before, and says why it was sent again.
func (a *analyzer) retransmit(i, s int, in *bth.Info) {
	ev := &a.c.Events[i]
	p := ev.Pkt
	st := &a.st[s]
	stats := &a.c.Stats[s]
	ev.Marks |= MarkRetransmit
	stats.Retransmits++
	ev.Msg = st.message(p.PSN)
	if ev.Msg != nil {
		ev.Msg.Retx++
	}
	o := st.outstanding(p.PSN)
	r := &st.rec
	switch {
	case r.kind != KindBad && !p.PSN.Before(r.from) && r.told:
		// the rest of a resent run: its reason was told on its first packet
	case r.kind == KindRNR && !p.PSN.Before(r.from):
		ev.Notes = append(ev.Notes, fmt.Sprintf("retry after an RNR wait of %s (the responder asked for at least %s)",
			ms(p.Time.Sub(r.at)), ms(time.Duration(qp.RNRTimerMicros(r.timer))*time.Microsecond)))
		r.told = true
	case r.kind == KindNAK && !p.PSN.Before(r.from):
		ev.Notes = append(ev.Notes, fmt.Sprintf("go-back-N: resending from psn %d after the NAK", r.from))
		r.told = true
	case o != nil:
		ev.Notes = append(ev.Notes, fmt.Sprintf("timeout: no response for %s", ms(p.Time.Sub(o.at))))
		prev := &a.c.Events[o.ev]
		if prev.Marks&MarkLost == 0 {
			prev.Marks |= MarkLost
			prev.Notes = append(prev.Notes, "no response: sent again after a timeout")
			stats.Lost++
		}
		*r = recovery{kind: KindRequest, from: p.PSN, at: p.Time, told: true}
	default:
		ev.Notes = append(ev.Notes, "already acknowledged")
	}
	if o != nil {
		o.retx, o.at, o.ev = true, p.Time, i
	}
}

// message finds the message of side s's requests that used psn.
func (st *reqState) message(psn bth.PSN) *Message {
	for j := len(st.msgs) - 1; j >= 0 && j >= len(st.msgs)-maxLookback; j-- {
		m := st.msgs[j]
		if !psn.Before(m.FirstPSN) && !psn.After(m.LastPSN) {
			return m
		}
	}
	return nil
}

// outstanding returns the unacknowledged request with psn, or nil.
func (st *reqState) outstanding(psn bth.PSN) *outPkt {
	for j := len(st.out) - 1; j >= 0; j-- {
		if st.out[j].psn == psn {
			return &st.out[j]
		}
	}
	return nil
}

// ackThrough acknowledges side s's requests up to and including psn (or
// up to psn-1 when inclusive is false) at time t: messages complete, RTT
// samples are taken. It returns the requests covered that asked for an
// ACK and the messages completed.
func (a *analyzer) ackThrough(s int, psn bth.PSN, inclusive bool, t time.Time) (asked int, done []*Message) {
	st := &a.st[s]
	n := 0
	for ; n < len(st.out); n++ {
		o := &st.out[n]
		if o.psn.After(psn) || !inclusive && o.psn == psn {
			break
		}
		if o.ackReq {
			asked++
		}
		if o.psn == psn {
			a.sample(s, o, t)
		}
		m := o.msg
		if !m.Done && !m.answered && !m.LastPSN.After(o.psn) && st.open != m {
			m.Done, m.End = true, t
			done = append(done, m)
		}
	}
	st.out = st.out[n:]
	return asked, done
}

// sample takes o's RTT sample, once, when it was sent only once (Karn's
// rule: a response to a retransmitted request is ambiguous).
func (a *analyzer) sample(s int, o *outPkt, t time.Time) {
	if !o.retx && !o.sampled {
		o.sampled = true
		a.c.Stats[s].RTT = append(a.c.Stats[s].RTT, t.Sub(o.at))
	}
}

// response handles a response packet to side s's requests (ACK, NAK,
// READ response, atomic ACK).
func (a *analyzer) response(i, s int, in *bth.Info) {
	ev := &a.c.Events[i]
	p := ev.Pkt
	st := &a.st[s]
	stats := &a.c.Stats[s]
	stats.ResponseSeen++
	if !p.ICRCOK {
		ev.Kind = KindAck
		ev.Label = shortName(in) + " psn " + strconv.Itoa(int(p.PSN))
		return
	}
	syn := reth.Syndrome(p.Syndrome)
	switch in.Op {
	case bth.OpAck:
		switch syn.Kind() {
		case reth.KindRNR:
			ev.Kind, ev.Marks = KindRNR, ev.Marks|MarkRNR
			stats.RNRNAKs++
			ev.Label = fmt.Sprintf("RNR NAK psn %d", p.PSN)
			wait := time.Duration(qp.RNRTimerMicros(syn.Value())) * time.Microsecond
			ev.Notes = append(ev.Notes, fmt.Sprintf("receiver not ready: no receive posted for psn %d; retry after %s", p.PSN, ms(wait)))
			st.rec = recovery{kind: KindRNR, from: p.PSN, at: p.Time, timer: syn.Value()}
			a.ackThrough(s, p.PSN, false, p.Time)
		case reth.KindNAK:
			ev.Kind, ev.Marks = KindNAK, ev.Marks|MarkNAK
			stats.NAKs++
			a.nak(i, s, syn)
		default:
			ev.Kind = KindAck
			stats.Acks++
			ev.Label = fmt.Sprintf("ACK psn %d", p.PSN)
			if st.acked && !p.PSN.After(st.lastAck) {
				ev.Marks |= MarkDupACK
				stats.DupACKs++
				ev.Notes = append(ev.Notes, fmt.Sprintf("duplicate ACK: psn %d was already acknowledged (the responder saw a request twice)", p.PSN))
				return
			}
			st.lastAck, st.acked = p.PSN, true
			asked, done := a.ackThrough(s, p.PSN, true, p.Time)
			if asked > 1 {
				ev.Marks |= MarkCoalesced
				stats.Coalesced++
				ev.Notes = append(ev.Notes, fmt.Sprintf("one ACK for %d requests", asked))
			}
			if len(done) > 0 {
				ev.Notes = append(ev.Notes, "completes "+msgList(done))
			}
		}
	case bth.OpReadResponse:
		ev.Kind = KindReadResp
		m := st.message(p.PSN)
		ev.Msg = m
		ev.Label = fmt.Sprintf("%s%s psn %d %dB", shortName(in), msgRef(m), p.PSN, p.Len)
		if m == nil {
			ev.Notes = append(ev.Notes, "READ response to a request not in the capture")
			return
		}
		if hi, ok := st.respHi[m]; ok && !p.PSN.After(hi) || m.Done {
			ev.Marks |= MarkDuplicate
			ev.Notes = append(ev.Notes, "READ response sent again")
			return
		}
		st.respHi[m] = p.PSN
		if o := st.outstanding(m.FirstPSN); o != nil && p.PSN == m.FirstPSN {
			a.sample(s, o, p.Time)
		}
		_, done := a.ackThrough(s, m.FirstPSN, false, p.Time)
		m.Packets++
		if in.Flags&bth.Last != 0 {
			m.Done, m.End, m.LastPSN = true, p.Time, p.PSN
			delete(st.respHi, m)
			a.ackThrough(s, m.FirstPSN, true, p.Time)
			done = append(done, m)
		}
		if len(done) > 0 {
			ev.Notes = append(ev.Notes, "completes "+msgList(done))
		}
	case bth.OpAtomicAck:
		ev.Kind = KindAtomicAck
		m := st.message(p.PSN)
		ev.Msg = m
		ev.Label = fmt.Sprintf("ATOMIC_ACK%s psn %d", msgRef(m), p.PSN)
		if p.Atomic != nil {
			ev.Label += fmt.Sprintf(" orig %d", p.Atomic.Orig)
		}
		if m == nil {
			return
		}
		if m.Done {
			ev.Marks |= MarkDuplicate
			ev.Notes = append(ev.Notes, "atomic result sent again (from the responder's cache, not executed twice)")
			return
		}
		m.Packets++
		_, done := a.ackThrough(s, p.PSN, false, p.Time)
		a.ackThrough(s, p.PSN, true, p.Time)
		m.Done, m.End = true, p.Time
		ev.Notes = append(ev.Notes, "completes "+msgList(append(done, m)))
	default:
		ev.Kind = KindAck
		ev.Label = fmt.Sprintf("%s psn %d", shortName(in), p.PSN)
	}
}

// nak handles a NAK to side s's requests.
func (a *analyzer) nak(i, s int, syn reth.Syndrome) {
	ev := &a.c.Events[i]
	p := ev.Pkt
	st := &a.st[s]
	if syn.Value() == reth.NAKPSNSeqError {
		ev.Label = fmt.Sprintf("NAK seq-err psn %d", p.PSN)
		ev.Notes = append(ev.Notes, fmt.Sprintf("PSN sequence error: the responder expected psn %d and got a later one", p.PSN))
		if o := st.outstanding(p.PSN); o != nil {
			lost := &a.c.Events[o.ev]
			if lost.Marks&MarkLost == 0 {
				lost.Marks |= MarkLost
				lost.Notes = append(lost.Notes, fmt.Sprintf("never arrived: the peer NAKed psn %d", p.PSN))
				a.c.Stats[s].Lost++
			}
		}
		st.rec = recovery{kind: KindNAK, from: p.PSN, at: p.Time}
		_, done := a.ackThrough(s, p.PSN, false, p.Time)
		if len(done) > 0 {
			ev.Notes = append(ev.Notes, "completes "+msgList(done))
		}
		return
	}
	what := strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(syn.String(), "NAK("), ")"))
	ev.Label = fmt.Sprintf("NAK %s psn %d", strings.ReplaceAll(what, "_", "-"), p.PSN)
	ev.Notes = append(ev.Notes, "fatal: the request fails with an error completion and the requester's QP goes to the error state")
	if m := st.message(p.PSN); m != nil {
		ev.Msg = m
		m.Done, m.End, m.Status = true, p.Time, strings.ReplaceAll(what, "_", " ")
	}
	a.ackThrough(s, p.PSN, false, p.Time)
}

// requestLabel is the arrow text of request packet p of message m.
func requestLabel(p *Packet, in *bth.Info, m *Message) string {
	if p.CM != nil {
		return cmLabel(p.CM, m)
	}
	b := strings.Builder{}
	b.WriteString(shortName(in))
	b.WriteString(msgRef(m))
	b.WriteString(" psn ")
	b.WriteString(strconv.Itoa(int(p.PSN)))
	switch in.Op {
	case bth.OpReadRequest:
		fmt.Fprintf(&b, " len %d", p.DMALen)
	case bth.OpFetchAdd:
		if p.Atomic != nil {
			fmt.Fprintf(&b, " add %d", p.Atomic.SwapAdd)
		}
	case bth.OpCompareSwap:
		if p.Atomic != nil {
			fmt.Fprintf(&b, " cmp %d swap %d", p.Atomic.Compare, p.Atomic.SwapAdd)
		}
	default:
		fmt.Fprintf(&b, " %dB", p.Len)
	}
	if p.HasImm && in.Flags&bth.Imm != 0 {
		fmt.Fprintf(&b, " imm %#x", p.Imm)
	}
	return b.String()
}

// shortName is an opcode's name without its class prefix and with the
// long words shortened: RC_RDMA_WRITE_FIRST is WRITE_FIRST.
func shortName(in *bth.Info) string {
	n := in.Name
	if i := strings.IndexByte(n, '_'); i >= 0 && in.Class != bth.CNP {
		n = n[i+1:]
	}
	return nameReplacer.Replace(n)
}

var nameReplacer = strings.NewReplacer("RDMA_", "", "_WITH_IMMEDIATE", "_IMM", "_WITH_INVALIDATE", "_INV",
	"READ_RESPONSE", "READ_RESP", "READ_REQUEST", "READ_REQ", "ATOMIC_ACKNOWLEDGE", "ATOMIC_ACK", "ACKNOWLEDGE", "ACK",
	"COMPARE_SWAP", "CMP_SWAP")

// opName names the operation of a message, short: SEND, WRITE+IMM, READ,
// FETCH_ADD, ...
func opName(in *bth.Info) string {
	var s string
	switch in.Op {
	case bth.OpSend:
		s = "SEND"
	case bth.OpWrite:
		s = "WRITE"
	case bth.OpReadRequest:
		return "READ"
	default:
		return shortName(in)
	}
	switch {
	case in.Flags&bth.Imm != 0:
		s += "+IMM"
	case in.Flags&bth.Inv != 0:
		s += "+INV"
	}
	return s
}

// msgRef is " #N" for a message, "" for none.
func msgRef(m *Message) string {
	if m == nil {
		return ""
	}
	return " #" + strconv.Itoa(m.N)
}

// msgList formats messages as "#3" or "#3-#5" or "#3, #5".
func msgList(ms []*Message) string {
	if len(ms) == 1 {
		return "#" + strconv.Itoa(ms[0].N)
	}
	contiguous := true
	for i := 1; i < len(ms); i++ {
		if ms[i].N != ms[i-1].N+1 {
			contiguous = false
		}
	}
	if contiguous {
		return fmt.Sprintf("#%d-#%d", ms[0].N, ms[len(ms)-1].N)
	}
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = "#" + strconv.Itoa(m.N)
	}
	return strings.Join(parts, ", ")
}

// ms formats a duration in milliseconds with microsecond precision.
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64) + " ms"
}

// cmLabel is the arrow text of a CM message: the message, the sender's
// communication ID, and the QPN and starting PSN it announces (the rest
// is in the row's notes).
func cmLabel(c *trace.CM, m *Message) string {
	s := "CM " + c.Msg + msgRef(m)
	if c.Error != "" {
		return s
	}
	s += fmt.Sprintf(" id %#08x", c.LocalCommID)
	if c.LocalQPN != nil {
		s += " qpn " + qpn(*c.LocalQPN)
	}
	if c.StartingPSN != nil {
		s += fmt.Sprintf(" psn %d", *c.StartingPSN)
	}
	if c.RemoteQPN != nil {
		s += " qpn " + qpn(*c.RemoteQPN)
	}
	return s
}
