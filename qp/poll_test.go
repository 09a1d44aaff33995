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
// the poller; the poller's reply carries the ACK out in the same Emit;
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

	// The reply takes the ACK along: one Emit, two packets.
	round()
	p.b.post(t, send)
	if emits != 1 || len(p.wb.in) != 2 || acks() != 1 {
		t.Fatalf("after the reply: %d Emit calls, %d packets, %d ACKs; want 1, 2, 1", emits, len(p.wb.in), acks())
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
