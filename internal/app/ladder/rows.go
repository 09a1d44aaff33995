package ladder

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/rxego/rxego/bth"
)

// RowKind says what a ladder row shows.
type RowKind uint8

// Row kinds.
const (
	RowPacket  RowKind = iota // one packet, or a run of alike packets (Count > 1)
	RowMessage                // the start of a message
	RowNote                   // an annotation
	RowElided                 // rows left out to keep the ladder short
)

// Row is one line of a ladder, as both renderers draw it.
type Row struct {
	Kind  RowKind
	Time  time.Time
	FromA bool
	Marks Mark
	Label string
	Notes []string
	Count int      // packets the row stands for
	Msg   *Message // the message of a packet row or the started message
}

// RowOptions control how a conversation becomes rows.
type RowOptions struct {
	// MaxRows bounds the rows of one conversation; 0 means no bound. When
	// there are more, the first rows are kept, then every row with a
	// problem, CNP or note with a row of context either side, and the rest
	// is replaced by RowElided rows saying what was left out.
	MaxRows int
	// Expand draws every packet on its own row. By default runs of three
	// or more alike packets (the middle packets of a long message) share
	// one row.
	Expand bool
}

// minRun is the shortest run of alike packets drawn as one row.
const minRun = 3

// Rows lays the conversation out as ladder rows.
func (c *Conversation) Rows(o RowOptions) []Row {
	var rows []Row
	for i := 0; i < len(c.Events); {
		ev := &c.Events[i]
		if ev.Pkt == nil {
			rows = append(rows, Row{Kind: RowNote, Time: ev.Time, FromA: ev.FromA, Marks: ev.Marks, Label: ev.Label})
			i++
			continue
		}
		if m := ev.Msg; m != nil && ev.Kind == KindRequest && ev.Marks&MarkRetransmit == 0 && ev.Pkt.PSN == m.FirstPSN {
			rows = append(rows, Row{Kind: RowMessage, Time: ev.Time, FromA: ev.FromA, Label: m.Summary(), Msg: m})
		}
		n := 1
		if !o.Expand {
			n = c.run(i)
		}
		r := Row{Kind: RowPacket, Time: ev.Time, FromA: ev.FromA, Marks: ev.Marks, Label: ev.Label, Notes: ev.Notes, Count: n, Msg: ev.Msg}
		if n > 1 {
			last := c.Events[i+n-1].Pkt
			bytes := 0
			for _, e := range c.Events[i : i+n] {
				bytes += e.Pkt.Len
			}
			r.Label = fmt.Sprintf("%s%s psn %d-%d x%d %dB", shortName(ev.Pkt.Opcode.Info()), msgRef(ev.Msg), ev.Pkt.PSN, last.PSN, n, bytes)
		}
		rows = append(rows, r)
		i += n
	}
	if o.MaxRows > 0 && len(rows) > o.MaxRows {
		rows = fold(rows, o.MaxRows)
	}
	return rows
}

// run returns how many events from i are alike enough to share a row: the
// same direction, kind, message, opcode and marks, consecutive PSNs, and
// no notes after the first.
func (c *Conversation) run(i int) int {
	first := &c.Events[i]
	if first.Msg == nil || first.Kind != KindRequest && first.Kind != KindReadResp {
		return 1
	}
	n := 1
	for j := i + 1; j < len(c.Events); j++ {
		e, prev := &c.Events[j], c.Events[j-1].Pkt
		if e.Pkt == nil || e.FromA != first.FromA || e.Kind != first.Kind || e.Msg != first.Msg || e.Marks != first.Marks ||
			e.Pkt.Opcode != first.Pkt.Opcode || e.Pkt.PSN != prev.PSN.Next() || len(e.Notes) > 0 {
			break
		}
		n++
	}
	if n < minRun {
		return 1
	}
	return n
}

// notable reports whether a row must survive folding.
func notable(r *Row) bool {
	return r.Kind == RowNote || r.Marks.Problem() || r.Marks&MarkCNP != 0
}

// fold keeps at most max rows: the first ones, then notable rows with a row
// of context either side, replacing the others by RowElided rows.
func fold(rows []Row, max int) []Row {
	keep := make([]bool, len(rows))
	head := max / 2
	for i := range rows {
		if i < head {
			keep[i] = true
		}
		if notable(&rows[i]) {
			for j := i - 1; j <= i+1; j++ {
				if j >= 0 && j < len(rows) {
					keep[j] = true
				}
			}
		}
	}
	var out []Row
	kept := 0
	for i := 0; i < len(rows); {
		if keep[i] && kept < max {
			out = append(out, rows[i])
			kept++
			i++
			continue
		}
		j := i
		for j < len(rows) && (!keep[j] || kept >= max) {
			j++
		}
		out = append(out, elided(rows[i:j], kept >= max))
		i = j
	}
	return out
}

// elided summarises rows left out.
func elided(rows []Row, budget bool) Row {
	pkts, msgs, marked := 0, 0, 0
	for i := range rows {
		switch rows[i].Kind {
		case RowPacket:
			pkts += rows[i].Count
		case RowMessage:
			msgs++
		}
		if notable(&rows[i]) {
			marked++
		}
	}
	var b strings.Builder
	b.WriteString(count(pkts, "packet"))
	if msgs > 0 {
		fmt.Fprintf(&b, " (%s)", count(msgs, "message"))
	}
	if marked > 0 {
		fmt.Fprintf(&b, " not shown, %d marked", marked)
	} else {
		b.WriteString(" without anything unusual")
	}
	if budget {
		b.WriteString("; show all with --all")
	}
	return Row{Kind: RowElided, Time: rows[0].Time, Label: b.String(), Count: pkts}
}

// Summary describes a message in one line: "#3 WRITE 3000 B psn
// 100-102 in 0.040 ms".
func (m *Message) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %s %d B", m.N, m.Op, m.Bytes)
	if m.FirstPSN == m.LastPSN {
		fmt.Fprintf(&b, " psn %d", m.FirstPSN)
	} else {
		fmt.Fprintf(&b, " psn %d-%d", m.FirstPSN, m.LastPSN)
	}
	switch {
	case m.Status != "":
		fmt.Fprintf(&b, ": %s", m.Status)
	case m.Done && m.End.After(m.Start):
		fmt.Fprintf(&b, " in %s", ms(m.End.Sub(m.Start)))
	case m.Done:
	default:
		b.WriteString(" (not completed in the capture)")
	}
	if m.Retx > 0 {
		fmt.Fprintf(&b, ", %d resent", m.Retx)
	}
	return b.String()
}

// Title names the conversation: "QP pair 1 (RC): 127.0.0.1 QP 0x000011
// <-> 127.0.0.2 QP 0x000012".
func (c *Conversation) Title() string {
	class := c.Class.String()
	if c.Class == bth.CNP {
		class = "CNP only"
	}
	if c.B.QPN == badQP {
		return fmt.Sprintf("malformed packets (%d): %s -> %s", len(c.Events), c.A.Addr, c.B.Addr)
	}
	return fmt.Sprintf("QP pair %d (%s): %s <-> %s, %s, %s", c.N, class, c.A, c.B, count(c.packets(), "packet"), count(len(c.Messages), "message"))
}

// packets counts the conversation's packet events.
func (c *Conversation) packets() int {
	n := 0
	for i := range c.Events {
		if c.Events[i].Pkt != nil {
			n++
		}
	}
	return n
}

// Count formats "1 packet", "2 packets": the plural in English text.
func Count(n int, what string) string { return count(n, what) }

// count formats "1 packet", "2 packets".
func count(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}
