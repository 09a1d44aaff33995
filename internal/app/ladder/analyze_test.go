package ladder_test

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/app/ladder"
)

var (
	hostA = netip.MustParseAddr("198.18.0.1")
	hostB = netip.MustParseAddr("198.18.0.2")
	t0    = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
)

// pkt builds a packet at ms milliseconds from src to dst for QP dqp.
func pkt(ms float64, src, dst netip.Addr, op bth.Opcode, dqp uint32, psn bth.PSN, opts ...func(*ladder.Packet)) ladder.Packet {
	p := ladder.Packet{Time: t0.Add(time.Duration(ms * float64(time.Millisecond))), Src: src, Dst: dst, Opcode: op,
		DestQP: dqp, PSN: psn, ICRCOK: true}
	in := op.Info()
	if in.Flags&bth.Payload != 0 {
		p.Len = 1024
	}
	if in.Ext&bth.ExtAETH != 0 {
		p.HasAETH = true
	}
	for _, o := range opts {
		o(&p)
	}
	return p
}

func ackReq(p *ladder.Packet) { p.AckReq = true }
func ce(p *ladder.Packet)     { p.ECN = 3 }
func syn(s uint8) func(*ladder.Packet) {
	return func(p *ladder.Packet) { p.Syndrome = s }
}
func dma(n uint32) func(*ladder.Packet) {
	return func(p *ladder.Packet) { p.HasRETH, p.DMALen = true, n }
}
func plen(n int) func(*ladder.Packet) { return func(p *ladder.Packet) { p.Len = n } }

// build analyses packets into a Trace.
func build(pkts ...ladder.Packet) *ladder.Trace {
	b := ladder.NewBuilder()
	for _, p := range pkts {
		b.AddPacket(p)
	}
	return b.Finish()
}

// one returns the only conversation of t.
func one(t *testing.T, tr *ladder.Trace) *ladder.Conversation {
	t.Helper()
	if len(tr.Conversations) != 1 {
		t.Fatalf("%d conversations, want 1", len(tr.Conversations))
	}
	return tr.Conversations[0]
}

// hasNote reports whether any note of e contains s.
func hasNote(e *ladder.Event, s string) bool {
	for _, n := range e.Notes {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// TestGoBackN: a 4-packet WRITE loses its second packet; the responder
// NAKs it and the requester resends from there.
func TestGoBackN(t *testing.T) {
	const qa, qb = 0x11, 0x12
	c := one(t, build(
		pkt(0, hostA, hostB, bth.RCWriteFirst, qb, 10, dma(4000)),
		pkt(0.01, hostA, hostB, bth.RCWriteMiddle, qb, 11),
		pkt(0.02, hostA, hostB, bth.RCWriteMiddle, qb, 12),
		pkt(0.03, hostA, hostB, bth.RCWriteLast, qb, 13, ackReq, plen(928)),
		pkt(0.10, hostB, hostA, bth.RCAck, qa, 11, syn(0x60)),
		pkt(0.11, hostA, hostB, bth.RCWriteMiddle, qb, 11),
		pkt(0.12, hostA, hostB, bth.RCWriteMiddle, qb, 12),
		pkt(0.13, hostA, hostB, bth.RCWriteLast, qb, 13, ackReq, plen(928)),
		pkt(0.20, hostB, hostA, bth.RCAck, qa, 13),
	))
	if c.A.Addr != hostA || c.A.QPN != qa || c.B.QPN != qb || !c.A.QPNKnown || c.Class != bth.RC {
		t.Errorf("endpoints %v %v class %v", c.A, c.B, c.Class)
	}
	ev := c.Events
	wantMarks := []ladder.Mark{0, ladder.MarkLost, 0, 0, ladder.MarkNAK, ladder.MarkRetransmit, ladder.MarkRetransmit, ladder.MarkRetransmit, 0}
	for i, m := range wantMarks {
		if ev[i].Marks != m {
			t.Errorf("event %d (%s): marks %v, want %v", i, ev[i].Label, ev[i].Marks.Tags(), m.Tags())
		}
	}
	if !hasNote(&ev[1], "NAKed psn 11") || !hasNote(&ev[5], "go-back-N") || len(ev[6].Notes) != 0 || !hasNote(&ev[8], "completes #1") {
		t.Errorf("notes: %q %q %q %q", ev[1].Notes, ev[5].Notes, ev[6].Notes, ev[8].Notes)
	}
	if len(c.Messages) != 1 {
		t.Fatalf("%d messages", len(c.Messages))
	}
	m := c.Messages[0]
	if m.Op != "WRITE" || m.Bytes != 3*1024+928 || m.FirstPSN != 10 || m.LastPSN != 13 || !m.Done || m.Retx != 3 || m.Packets != 4 {
		t.Errorf("message %+v", m)
	}
	s := c.Stats[0]
	if s.Messages != 1 || s.Packets != 7 || s.Retransmits != 3 || s.Lost != 1 || s.NAKs != 1 || len(s.RTT) != 0 || s.Acks != 1 {
		t.Errorf("stats %+v", s)
	}
}

// TestTimeoutAndRNR: a SEND answered by nothing is resent after a timeout
// (the first copy is marked lost); another is refused with an RNR NAK
// and retried after the RNR wait.
func TestTimeoutAndRNR(t *testing.T) {
	c := one(t, build(
		pkt(0, hostA, hostB, bth.RCSendOnly, 2, 100, ackReq, plen(8)),
		pkt(68, hostA, hostB, bth.RCSendOnly, 2, 100, ackReq, plen(8)),
		pkt(69, hostB, hostA, bth.RCAck, 1, 100),
		pkt(70, hostA, hostB, bth.RCSendOnly, 2, 101, ackReq, plen(8)),
		pkt(70.1, hostB, hostA, bth.RCAck, 1, 101, syn(0x20|14)), // RNR timer 14: 1.28 ms
		pkt(71.5, hostA, hostB, bth.RCSendOnly, 2, 101, ackReq, plen(8)),
		pkt(71.6, hostB, hostA, bth.RCAck, 1, 101),
	))
	ev := c.Events
	if ev[0].Marks != ladder.MarkLost || !hasNote(&ev[0], "timeout") {
		t.Errorf("first copy: %v %q", ev[0].Marks.Tags(), ev[0].Notes)
	}
	if ev[1].Marks != ladder.MarkRetransmit || !hasNote(&ev[1], "timeout: no response for 68.000 ms") {
		t.Errorf("resend: %v %q", ev[1].Marks.Tags(), ev[1].Notes)
	}
	if ev[4].Kind != ladder.KindRNR || ev[4].Marks != ladder.MarkRNR || !hasNote(&ev[4], "retry after 1.280 ms") {
		t.Errorf("RNR: %v %v %q", ev[4].Kind, ev[4].Marks.Tags(), ev[4].Notes)
	}
	if ev[5].Marks != ladder.MarkRetransmit || !hasNote(&ev[5], "RNR wait of 1.400 ms") {
		t.Errorf("RNR retry: %v %q", ev[5].Marks.Tags(), ev[5].Notes)
	}
	s := c.Stats[0]
	if s.Lost != 1 || s.Retransmits != 2 || s.RNRNAKs != 1 || s.NAKs != 0 || len(s.RTT) != 0 || len(c.Messages) != 2 {
		t.Errorf("stats %+v, %d messages", s, len(c.Messages))
	}
}

// TestAcks: one ACK for two requests is coalesced; the same ACK again is
// a duplicate; RTT is measured to the ACK of a request sent once.
func TestAcks(t *testing.T) {
	c := one(t, build(
		pkt(0, hostA, hostB, bth.RCSendOnly, 2, 7, ackReq, plen(8)),
		pkt(1, hostA, hostB, bth.RCSendOnly, 2, 8, ackReq, plen(8)),
		pkt(3, hostB, hostA, bth.RCAck, 1, 8),
		pkt(4, hostB, hostA, bth.RCAck, 1, 8),
	))
	ev := c.Events
	if ev[2].Marks != ladder.MarkCoalesced || !hasNote(&ev[2], "one ACK for 2 requests") || !hasNote(&ev[2], "completes #1-#2") {
		t.Errorf("coalesced ACK: %v %q", ev[2].Marks.Tags(), ev[2].Notes)
	}
	if ev[3].Marks != ladder.MarkDupACK {
		t.Errorf("second ACK: %v", ev[3].Marks.Tags())
	}
	s := c.Stats[0]
	if n, lo, _, _ := s.RTTStats(); n != 1 || lo != 2*time.Millisecond || s.DupACKs != 1 || s.Coalesced != 1 {
		t.Errorf("RTT %d %v, stats %+v", n, lo, s)
	}
}

// TestReadAndAtomic: a READ's responses complete it (a replayed response
// is marked), the next request's PSN follows the READ's span without a
// gap, and an atomic's replayed result is marked.
func TestReadAndAtomic(t *testing.T) {
	c := one(t, build(
		pkt(0, hostA, hostB, bth.RCReadRequest, 2, 20, dma(2048), ackReq),
		pkt(1, hostB, hostA, bth.RCReadResponseFirst, 1, 20),
		pkt(1.1, hostB, hostA, bth.RCReadResponseLast, 1, 21),
		pkt(1.2, hostB, hostA, bth.RCReadResponseLast, 1, 21),
		pkt(2, hostA, hostB, bth.RCFetchAdd, 2, 22, ackReq),
		pkt(3, hostB, hostA, bth.RCAtomicAck, 1, 22),
		pkt(3.5, hostB, hostA, bth.RCAtomicAck, 1, 22),
	))
	ev := c.Events
	for i, m := range []ladder.Mark{0, 0, 0, ladder.MarkDuplicate, 0, 0, ladder.MarkDuplicate} {
		if ev[i].Marks != m {
			t.Errorf("event %d (%s): %v, want %v", i, ev[i].Label, ev[i].Marks.Tags(), m.Tags())
		}
	}
	if len(c.Messages) != 2 {
		t.Fatalf("%d messages", len(c.Messages))
	}
	r, a := c.Messages[0], c.Messages[1]
	if r.Op != "READ" || r.Bytes != 2048 || !r.Done || r.LastPSN != 21 || r.Packets != 3 || r.End != ev[2].Time {
		t.Errorf("READ %+v", r)
	}
	if a.Op != "FETCH_ADD" || !a.Done || a.Bytes != 8 {
		t.Errorf("atomic %+v", a)
	}
	if n, _, _, _ := c.Stats[0].RTTStats(); n != 2 {
		t.Errorf("%d RTT samples, want 2", n)
	}
}

// TestGapBadAndCE: a PSN jump, a bad ICRC, a malformed packet and CE
// marks and CNPs are all marked.
func TestGapBadAndCE(t *testing.T) {
	bad := pkt(5, hostA, hostB, bth.RCSendOnly, 2, 9, plen(8))
	bad.ICRCOK = false
	tr := build(
		pkt(0, hostA, hostB, bth.RCSendOnly, 2, 1, plen(8), ce),
		pkt(1, hostA, hostB, bth.RCSendOnly, 2, 5, plen(8)),
		pkt(2, hostB, hostA, bth.CNPOpcode, 1, 0),
		bad,
		ladder.Packet{Time: t0.Add(6 * time.Millisecond), Src: hostA, Dst: hostB, Err: "truncated"},
	)
	if len(tr.Conversations) != 2 {
		t.Fatalf("%d conversations, want the QP pair and the malformed packets", len(tr.Conversations))
	}
	c := tr.Conversations[0]
	ev := c.Events
	if ev[0].Marks != ladder.MarkCE || ev[1].Marks != ladder.MarkGap || !hasNote(&ev[1], "3 packets missing") ||
		ev[2].Marks != ladder.MarkCNP || ev[3].Marks != ladder.MarkBadICRC {
		for i := range ev {
			t.Errorf("event %d: %v %q", i, ev[i].Marks.Tags(), ev[i].Notes)
		}
	}
	if s := c.Stats[0]; s.CEMarks != 1 || s.CNPs != 1 {
		t.Errorf("stats %+v", s)
	}
	m := tr.Conversations[1]
	if len(m.Events) != 1 || m.Events[0].Marks != ladder.MarkMalformed || !strings.HasPrefix(m.Title(), "malformed packets") {
		t.Errorf("malformed conversation %q: %+v", m.Title(), m.Events)
	}
}

// TestPairing: two RC QP pairs between the same hosts are told apart by
// their PSNs; UC flows without ACKs pair as the only ones; a one-way flow
// leaves its source QP unknown; UD pairs by the DETH.
func TestPairing(t *testing.T) {
	ud := func(src uint32) func(*ladder.Packet) {
		return func(p *ladder.Packet) { p.HasDETH, p.SrcQP = true, src }
	}
	hostC := netip.MustParseAddr("198.18.0.3")
	tr := build(
		pkt(0, hostA, hostB, bth.RCSendOnly, 0x21, 500, ackReq),
		pkt(0.1, hostA, hostB, bth.RCSendOnly, 0x22, 900, ackReq),
		pkt(1, hostB, hostA, bth.RCAck, 0x12, 900), // QP 0x12 sent 900
		pkt(1.1, hostB, hostA, bth.RCAck, 0x11, 500),
		pkt(2, hostA, hostC, bth.UCSendOnly, 0x31, 1),
		pkt(2.1, hostC, hostA, bth.UCSendOnly, 0x13, 1),
		pkt(3, hostC, hostB, bth.RCSendOnly, 0x41, 1),
		pkt(4, hostB, hostC, bth.UDSendOnly, 1, 0, ud(1)),
		pkt(4.1, hostC, hostB, bth.UDSendOnly, 1, 0, ud(1)),
	)
	var got []string
	for _, c := range tr.Conversations {
		got = append(got, c.A.String()+" <-> "+c.B.String()+" "+c.Class.String())
	}
	want := []string{
		"198.18.0.1 QP 0x000011 <-> 198.18.0.2 QP 0x000021 RC",
		"198.18.0.1 QP 0x000012 <-> 198.18.0.2 QP 0x000022 RC",
		"198.18.0.1 QP 0x000013 <-> 198.18.0.3 QP 0x000031 UC",
		"198.18.0.3 QP ? <-> 198.18.0.2 QP 0x000041 RC",
		"198.18.0.2 QP 0x000001 <-> 198.18.0.3 QP 0x000001 UD",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("conversations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRowsAnnotateFold: a long message's middle packets share a row, a
// note lands in time order, and folding keeps the notable rows and says
// what it left out.
func TestRowsAnnotateFold(t *testing.T) {
	pkts := []ladder.Packet{pkt(0, hostA, hostB, bth.RCWriteFirst, 2, 0, dma(12*1024))}
	for i := 1; i <= 10; i++ {
		pkts = append(pkts, pkt(float64(i)*0.01, hostA, hostB, bth.RCWriteMiddle, 2, bth.PSN(i)))
	}
	pkts = append(pkts, pkt(0.2, hostA, hostB, bth.RCWriteLast, 2, 11, ackReq), pkt(0.3, hostB, hostA, bth.RCAck, 1, 11))
	for i := 0; i < 30; i++ {
		psn := bth.PSN(12 + i)
		pkts = append(pkts, pkt(1+float64(i), hostA, hostB, bth.RCSendOnly, 2, psn, ackReq, plen(4)),
			pkt(1.5+float64(i), hostB, hostA, bth.RCAck, 1, psn))
	}
	pkts = append(pkts, pkt(40, hostA, hostB, bth.RCSendOnly, 2, 20, plen(4))) // a stray resend
	tr := build(pkts...)
	tr.Annotate(t0.Add(250*time.Microsecond), &ladder.Endpoint{Addr: hostA, QPN: 1, QPNKnown: true}, "rate cut")
	tr.Annotate(t0.Add(-time.Second), nil, "before")
	c := one(t, tr)
	rows := c.Rows(ladder.RowOptions{})
	if rows[0].Kind != ladder.RowNote || rows[0].Label != "before" || !rows[0].Time.Equal(t0) {
		t.Errorf("first row %+v", rows[0])
	}
	if r := rows[3]; r.Kind != ladder.RowPacket || r.Count != 10 || r.Label != "WRITE_MIDDLE #1 psn 1-10 x10 10240B" {
		t.Errorf("run row %+v", r)
	}
	if r := rows[5]; r.Kind != ladder.RowNote || r.Label != "rate cut" {
		t.Errorf("note row %+v", r)
	}
	folded := c.Rows(ladder.RowOptions{MaxRows: 20})
	var elided, lastPkt *ladder.Row
	for i := range folded {
		if folded[i].Kind == ladder.RowElided && elided == nil {
			elided = &folded[i]
		}
		if folded[i].Kind == ladder.RowPacket {
			lastPkt = &folded[i]
		}
	}
	if len(folded) > 23 || elided == nil || !strings.Contains(elided.Label, "without anything unusual") ||
		lastPkt == nil || lastPkt.Marks != ladder.MarkRetransmit {
		t.Errorf("%d folded rows, elided %+v, last packet %+v", len(folded), elided, lastPkt)
	}
	var out bytes.Buffer
	if err := ladder.WriteText(&out, tr, ladder.TextOptions{RowOptions: ladder.RowOptions{MaxRows: 20}, Color: true}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "\x1b[33m") || !strings.Contains(out.String(), "~~ rate cut ~~") {
		t.Errorf("text output:\n%s", out.String())
	}
}
