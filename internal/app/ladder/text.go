package ladder

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// TextOptions control WriteText.
type TextOptions struct {
	RowOptions
	// Width is the number of columns between the two sides' bars; 0 means
	// DefaultWidth.
	Width int
	// Color marks problems in red and yellow and congestion in cyan with
	// ANSI escapes, for terminals.
	Color bool
	// SummaryOnly leaves the ladders out.
	SummaryOnly bool
	// CapturedOn, when known, holds the addresses of the device the
	// capture was taken on: a requester not among them had its RTT taken
	// at the responder, which the statistics then call a turnaround.
	CapturedOn []netip.Addr
}

// DefaultWidth is the default distance between the bars of a ladder.
const DefaultWidth = 64

// timeCol is the width of the time column, with its gap.
const timeCol = 12

// ANSI colors.
const (
	red    = "\x1b[31m"
	yellow = "\x1b[33m"
	cyan   = "\x1b[36m"
	dim    = "\x1b[2m"
	bold   = "\x1b[1m"
	reset  = "\x1b[0m"
)

// WriteText draws every conversation of t as a ladder followed by its
// statistics.
func WriteText(w io.Writer, t *Trace, o TextOptions) error {
	if o.Width <= 0 {
		o.Width = DefaultWidth
	}
	o.Width = max(o.Width, 30)
	bw := bufio.NewWriter(w)
	p := &textPrinter{w: bw, o: o, start: t.Start}
	fmt.Fprintf(bw, "%s in %s over %s\n", count(t.Packets, "RoCEv2 packet"), count(len(t.Conversations), "conversation"), ms(t.End.Sub(t.Start)))
	for _, c := range t.Conversations {
		p.conversation(c)
	}
	return bw.Flush()
}

// textPrinter draws ladders on a terminal.
type textPrinter struct {
	w     *bufio.Writer
	o     TextOptions
	start time.Time
}

func (p *textPrinter) color(code, s string) string {
	if !p.o.Color || code == "" {
		return s
	}
	return code + s + reset
}

func (p *textPrinter) conversation(c *Conversation) {
	w := p.w
	fmt.Fprintf(w, "\n%s\n", p.color(bold, c.Title()))
	fmt.Fprintf(w, "  A = %s\n  B = %s\n", c.A, c.B)
	if !p.o.SummaryOnly {
		fmt.Fprintln(w)
		a, b := "A "+c.A.String(), "B "+c.B.String()
		gap := max(1, p.o.Width+2-len(a)-len(b))
		fmt.Fprintf(w, "%*s  %s%s%s\n", timeCol-2, "time ms", a, strings.Repeat(" ", gap), b)
		for _, r := range c.Rows(p.o.RowOptions) {
			p.row(&r)
		}
	}
	fmt.Fprintln(w)
	writeStats(w, c, p.o.CapturedOn)
}

// row draws one ladder row.
func (p *textPrinter) row(r *Row) {
	W := p.o.Width
	ts := ""
	if r.Kind == RowPacket || r.Kind == RowNote {
		ts = relMS(r.Time.Sub(p.start))
	}
	var inner, left, right, spill string
	left, right = "|", "|"
	code := ""
	switch r.Kind {
	case RowMessage:
		text := clip(r.Label, W-4)
		if r.FromA {
			inner = "  " + pad(text, W-2)
		} else {
			inner = leftPad(text, W-2) + "  "
		}
		code = dim
	case RowNote:
		inner = center("~~ "+clip(r.Label, W-8)+" ~~", W)
		code = cyan
	case RowElided:
		// A label too long for the ladder's width keeps its words whole:
		// what does not fit goes after the bar, as a row's notes do.
		left, right = ":", ":"
		inner, spill = fitWords(r.Label, W-8)
		inner = center("... "+inner+" ...", W)
		code = dim
	default:
		inner = arrow(r, W)
		code = severity(r.Marks)
	}
	line := fmt.Sprintf("%*s  %s%s%s", timeCol-2, ts, left, p.color(code, inner), right)
	if notes := noteText(r); notes != "" {
		line += "  " + p.color(code, notes)
	}
	if spill != "" {
		line += "  " + p.color(code, spill)
	}
	fmt.Fprintln(p.w, strings.TrimRight(line, " "))
}

// arrow draws a packet's arrow between the bars, W columns wide: dashes
// for a packet, '=' for a retransmission, and an X short of the far bar
// for a packet that never arrived.
func arrow(r *Row, W int) string {
	fill := "-"
	if r.Marks&MarkRetransmit != 0 {
		fill = "="
	}
	label := clip(r.Label, W-8)
	n := W - len(label) - 5 // "-- " + label + " " + fill... + ">"
	if r.FromA {
		s := fill + fill + " " + label + " " + strings.Repeat(fill, n) + ">"
		if r.Marks&MarkLost != 0 {
			s = s[:W-4] + "X   "
		}
		return s
	}
	s := "<" + strings.Repeat(fill, n) + " " + label + " " + fill + fill
	if r.Marks&MarkLost != 0 {
		s = "   X" + s[4:]
	}
	return s
}

// severity picks the color of a row's marks.
func severity(m Mark) string {
	switch {
	case m&(MarkLost|MarkNAK|MarkBadICRC|MarkMalformed|MarkGap) != 0:
		return red
	case m&(MarkRetransmit|MarkRNR|MarkDupACK|MarkDuplicate) != 0:
		return yellow
	case m&(MarkCE|MarkCNP) != 0:
		return cyan
	}
	return ""
}

// noteText is what follows a row: its tags, then its notes.
func noteText(r *Row) string {
	if r.Kind != RowPacket {
		return ""
	}
	tags := (r.Marks &^ MarkNote).Tags()
	s := strings.Join(tags, " ")
	if len(r.Notes) > 0 {
		if s != "" {
			s += ": "
		}
		s += strings.Join(r.Notes, "; ")
	}
	return s
}

// relMS formats a time since the start of the trace in milliseconds.
func relMS(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

// fitWords splits s into a head of at most n bytes, cut between clauses
// ("; ") where it can and between words otherwise, and the rest ("" when
// s fits).
func fitWords(s string, n int) (head, rest string) {
	if len(s) <= n {
		return s, ""
	}
	if cut := strings.LastIndex(s[:n+1], "; "); cut > 0 {
		return s[:cut], s[cut+2:]
	}
	cut := strings.LastIndexByte(s[:n+1], ' ')
	if cut <= 0 {
		return "", s
	}
	return s[:cut], strings.TrimLeft(s[cut:], " ")
}

// clip shortens s to n bytes, ending it with ".." when cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 2 {
		return s[:max(n, 0)]
	}
	return s[:n-2] + ".."
}

func pad(s string, n int) string     { return s + strings.Repeat(" ", max(0, n-len(s))) }
func leftPad(s string, n int) string { return strings.Repeat(" ", max(0, n-len(s))) + s }

func center(s string, n int) string {
	l := max(0, (n-len(s))/2)
	return pad(strings.Repeat(" ", l)+s, n)
}

// writeStats prints a conversation's statistics, a row per requester:
// the requests it sent (pkts: request packets, resends included) and what
// came back to it (NAKs, RNR NAKs, CNPs, ACKs). ACKs and CNPs the other
// side sent are counted in the requester's row, not in the sender's.
func writeStats(w io.Writer, c *Conversation, capturedOn []netip.Addr) {
	fmt.Fprintf(w, "  %-11s %5s %10s %6s %5s %5s %5s %5s %5s %5s %7s %9s  %s\n",
		"requests by", "msgs", "bytes", "pkts", "retx", "lost", "NAKs", "RNR", "CNPs", "CE", "dupACK", "coalesced", "RTT ms min/avg/max (samples)")
	for i, who := range []string{"A", "B"} {
		s := &c.Stats[i]
		fmt.Fprintf(w, "  %-11s %5d %10d %6d %5d %5d %5d %5d %5d %5d %7d %9d  %s\n", who, s.Messages, s.Bytes, s.Packets,
			s.Retransmits, s.Lost, s.NAKs, s.RNRNAKs, s.CNPs, s.CEMarks, s.DupACKs, s.Coalesced,
			rttText(s, c.requester(i), capturedOn, "/"))
	}
}

// rttText formats a row's RTT samples, sep between min, mean and max. A
// capture taken at the responder (capturedOn holds the other side's
// address, not the requester's) sees a request arrive and its answer
// leave: what it measures is the responder's turnaround, and it says so.
func rttText(s *DirStats, requester netip.Addr, capturedOn []netip.Addr, sep string) string {
	n, lo, mean, hi := s.RTTStats()
	if n == 0 {
		return "-"
	}
	out := fmt.Sprintf("%s%s%s%s%s (%d)", relMS(lo), sep, relMS(mean), sep, relMS(hi), n)
	if len(capturedOn) > 0 && !slices.Contains(capturedOn, requester) {
		out += " measured at the responder: its turnaround, not a round trip"
	}
	return out
}

// requester returns the address of the side whose requests Stats[i]
// counts: A for 0, B for 1.
func (c *Conversation) requester(i int) netip.Addr {
	if i == 0 {
		return c.A.Addr
	}
	return c.B.Addr
}
