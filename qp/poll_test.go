package qp

import (
	"testing"

	"github.com/rxego/rxego/bth"
)

// deliverPolled hands what w holds to e through InputPolled.
func (w *wire) deliverPolled(e *Engine) int {
	n := len(w.in)
	if n > 0 {
		e.InputPolled(w.in)
		clear(w.in)
		w.in = w.in[:0]
	}
	return n
}

// TestInputPolledHoldsAcks checks the busy-polling path: a SEND taken in
// by InputPolled leaves its ACK pending while the completion is there for
// the poller; the poller's reply carries the ACK out in the same Emit,
// after the reply;
// FlushAcks sends a held ACK when the poller does not reply; and the ACK
// timer sends it when nobody does anything.
func TestInputPolledHoldsAcks(t *testing.T) {
	p := newAllocPair(t, MTU1024)
	clock := p.a.n.e.cfg.Clock.(*vclock)
	emits := 0
	p.wb.onEmit = func() { emits++ }
	send := SendWR{Opcode: WRSend, Flags: SendInline, Inline: make([]byte, 64)}
	for i := range 3 {
		p.b.recv(t, uint64(i), p.bmr, 0, 64)
	}
	round := func() {
		t.Helper()
		p.a.post(t, send)
		p.wa.deliverPolled(p.b.n.e)
		if len(p.wb.in) != 0 {
			t.Fatalf("%d packets left b at once, want the ACK held", len(p.wb.in))
		}
		if wcs := pollAll(p.b.rcq); len(wcs) != 1 || wcs[0].Status != WCSuccess {
			t.Fatalf("b's receive completions %s", fmtWCs(wcs))
		}
	}
	acks := func() int {
		n := 0
		for _, in := range p.wb.in {
			if in.Pkt.Info.Opcode == bth.RCAck {
				n++
			}
		}
		return n
	}

	// The reply takes the ACK along: one Emit, two packets, the ACK
	// last (shorter than the reply, it can end the reply's GSO run).
	round()
	p.b.post(t, send)
	if emits != 1 || len(p.wb.in) != 2 || acks() != 1 {
		t.Fatalf("after the reply: %d Emit calls, %d packets, %d ACKs; want 1, 2, 1", emits, len(p.wb.in), acks())
	}
	if op := p.wb.in[1].Pkt.Info.Opcode; op != bth.RCAck {
		t.Fatalf("the reply's Emit ends with %v, want the ACK after the reply", op)
	}
	p.wb.deliver(p.a.n.e)
	p.wa.deliver(p.b.n.e) // a's ACK of the reply
	pollAll(p.a.rcq)

	// No reply: FlushAcks sends it.
	round()
	p.b.n.e.FlushAcks()
	if acks() != 1 {
		t.Fatalf("FlushAcks sent %d ACKs, want 1", acks())
	}
	p.wb.deliver(p.a.n.e)

	// Nobody at all: the ACK timer sends it.
	round()
	clock.now += ackHold
	p.b.n.e.Tick()
	if acks() != 1 {
		t.Fatalf("after %v, %d ACKs sent, want 1", ackHold, acks())
	}
	p.wb.deliver(p.a.n.e)
	if n := p.a.n.e.Stats.Retransmits.Load(); n != 0 {
		t.Errorf("%d retransmissions", n)
	}
	if got := p.a.qp.Query().State; got != RTS {
		t.Errorf("a in %v", got)
	}
}

// TestHeldAckOrder checks where a post puts the ACKs InputPolled held:
// another QP's ACK goes ahead of the new request (a peer must see what it
// acknowledges before anything that follows it, such as a DREQ), the
// posting QP's own after its request, where it can end the request's GSO
// run; both leave in the post's Emit.
func TestHeldAckOrder(t *testing.T) {
	p := newAllocPair(t, MTU1024)
	a2, b2 := p.a.n.newQP(t, RC, 64), p.b.n.newQP(t, RC, 64)
	connect(t, a2, b2, defaultConn())
	send := SendWR{Opcode: WRSend, Flags: SendInline, Inline: make([]byte, 64)}
	p.b.recv(t, 1, p.bmr, 0, 64)
	b2.recv(t, 2, p.bmr, 64, 64)
	// a sends on both QPs; b takes both SENDs in and holds both ACKs.
	p.a.post(t, send)
	a2.post(t, send)
	p.wa.deliverPolled(p.b.n.e)
	if len(p.wb.in) != 0 {
		t.Fatalf("%d packets left b at once, want the ACKs held", len(p.wb.in))
	}
	// b answers on its first QP.
	p.b.post(t, send)
	type pkt struct {
		op  bth.Opcode
		qpn uint32
	}
	var got []pkt
	for _, in := range p.wb.in {
		got = append(got, pkt{in.Pkt.Info.Opcode, in.Pkt.BTH().DestQP()})
	}
	want := []pkt{{bth.RCAck, a2.qp.Num()}, {bth.RCSendOnly, p.a.qp.Num()}, {bth.RCAck, p.a.qp.Num()}}
	if len(got) != len(want) {
		t.Fatalf("b sent %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("b sent %v, want %v", got, want)
		}
	}
}
