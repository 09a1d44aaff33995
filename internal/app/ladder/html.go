package ladder

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"strings"
	"time"
)

// HTMLOptions control WriteHTML.
type HTMLOptions struct {
	RowOptions
	// Title heads the page, e.g. the capture's file name.
	Title string
	// MaxTicks bounds the packet ticks drawn on the timeline (messages are
	// always all drawn); 0 means DefaultMaxTicks.
	MaxTicks int
}

// DefaultMaxTicks is the default bound on timeline packet ticks.
const DefaultMaxTicks = 20000

// Geometry of the ladder SVG, in pixels.
const (
	svgWidth = 1500
	xTime    = 76  // right edge of the time column
	xA       = 110 // A's bar
	xB       = 650 // B's bar
	xNotes   = 668
	rowH     = 24
	topH     = 44
	// timeline
	tlLabel = 170
	tlRight = 40 // room for the last axis label
	tlLane  = 18
)

// Colors of the page, by severity.
const (
	colProblem = "#c62828"
	colWarn    = "#e65100"
	colCongest = "#00838f"
	colRequest = "#1565c0"
	colResp    = "#2e7d32"
	colDim     = "#757575"
)

// WriteHTML writes a self-contained page (no external resources): a
// timeline of every QP pair's messages and packets, then each QP pair's
// ladder as SVG (the same rows WriteText draws) and its statistics. A
// small script checks on load that every message rendered with a visible
// size and that every drawing fits the window's width, and reports it in
// a hidden <pre id="render-check"> element, which tests read back from a
// headless browser.
func WriteHTML(w io.Writer, t *Trace, o HTMLOptions) error {
	if o.MaxTicks <= 0 {
		o.MaxTicks = DefaultMaxTicks
	}
	bw := bufio.NewWriter(w)
	p := &htmlPrinter{w: bw, t: t, o: o}
	p.page()
	return bw.Flush()
}

type htmlPrinter struct {
	w *bufio.Writer
	t *Trace
	o HTMLOptions
}

func (p *htmlPrinter) f(format string, args ...any) { fmt.Fprintf(p.w, format, args...) }

// esc escapes text for HTML and SVG.
func esc(s string) string { return html.EscapeString(s) }

const pageStyle = `body{font-family:system-ui,sans-serif;margin:20px;color:#212121}
h1{font-size:20px}h2{font-size:16px;margin-top:32px}
table.stats{border-collapse:collapse;font-size:13px;margin:8px 0}
table.stats td,table.stats th{border:1px solid #ccc;padding:2px 8px;text-align:right}
table.stats th:first-child,table.stats td:first-child{text-align:left}
svg text{font-family:ui-monospace,monospace;font-size:11px}
svg .msg text{font-size:11px;fill:#424242}
.legend span{display:inline-block;margin-right:16px;font-size:13px}
.ep{font-size:13px;margin:2px 0}
#render-check{color:#9e9e9e;font-size:11px}`

const checkScript = `window.addEventListener('load', function () {
  function count(sel) {
    var els = document.querySelectorAll(sel), n = 0;
    els.forEach(function (e) {
      var r = e.getBoundingClientRect();
      if (r.width > 0 && r.height > 0) { n++; }
    });
    return n + '/' + els.length;
  }
  // How many drawings fit the window's width: none may need scrolling.
  var svgs = document.querySelectorAll('svg'), fit = 0;
  svgs.forEach(function (s) { if (s.getBoundingClientRect().right <= document.documentElement.clientWidth) { fit++; } });
  var out = document.createElement('pre');
  out.id = 'render-check';
  out.hidden = true; // for tests (they read the DOM), not for the reader
  out.textContent = 'ladder-messages ' + count('svg.ladder g.msg') + ' timeline-messages ' + count('svg.timeline rect.msgbar') +
    ' packets ' + count('svg.ladder g.pkt') + ' fit ' + fit + '/' + svgs.length;
  document.body.appendChild(out);
});`

func (p *htmlPrinter) page() {
	t := p.t
	title := "rxego trace"
	if p.o.Title != "" {
		title += ": " + p.o.Title
	}
	p.f("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>%s</title>\n<style>%s</style>\n</head><body>\n", esc(title), pageStyle)
	p.f("<h1>%s</h1>\n", esc(title))
	p.f("<p>%s in %s over %s", count(t.Packets, "RoCEv2 packet"), count(len(t.Conversations), "conversation"), esc(ms(t.End.Sub(t.Start))))
	if !t.Start.IsZero() {
		p.f(", starting %s", esc(t.Start.UTC().Format(time.RFC3339Nano)))
	}
	p.f(". Times below are milliseconds from the first packet.</p>\n")
	p.f(`<p class="legend"><span style="color:%s">&#9632; request</span><span style="color:%s">&#9632; response</span>`+
		`<span style="color:%s">&#9632; lost, NAK, bad packet</span><span style="color:%s">&#9632; retransmission, RNR, duplicate</span>`+
		`<span style="color:%s">&#9632; congestion (CE, CNP, rate)</span></p>`+"\n", colRequest, colResp, colProblem, colWarn, colCongest)
	p.timeline()
	for _, c := range t.Conversations {
		p.conversation(c)
	}
	p.f("<script>%s</script>\n</body></html>\n", checkScript)
}

// svgOpen starts an SVG of the page's width and height h. It scales down
// to the window (width 100%, at most svgWidth pixels, the height from the
// viewBox's proportions), so that a window narrower than svgWidth shows
// all of it, the timeline's axis to its last packet included.
func (p *htmlPrinter) svgOpen(class string, h int) {
	p.f("<svg class=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" width=\"100%%\" viewBox=\"0 0 %d %d\" style=\"max-width:%dpx\">\n",
		class, svgWidth, h, svgWidth)
}

// x maps a time onto the timeline.
func (p *htmlPrinter) x(at time.Time) float64 {
	span := p.t.End.Sub(p.t.Start)
	if span <= 0 {
		return tlLabel
	}
	return tlLabel + float64(at.Sub(p.t.Start))/float64(span)*float64(svgWidth-tlLabel-tlRight)
}

// timeline draws every conversation's messages (bars from first packet to
// completion) and packets (ticks) on one time axis, two lanes per QP pair.
func (p *htmlPrinter) timeline() {
	t := p.t
	lanes := 2 * len(t.Conversations)
	h := lanes*tlLane + 40
	p.f("<h2>Timeline</h2>\n")
	p.svgOpen("timeline", h)
	// Axis with ten ticks.
	axisY := lanes*tlLane + 10
	p.f("<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#9e9e9e\"/>\n", tlLabel, axisY, svgWidth-tlRight, axisY)
	span := t.End.Sub(t.Start)
	for i := 0; i <= 10; i++ {
		at := t.Start.Add(span * time.Duration(i) / 10)
		x := p.x(at)
		p.f("<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#9e9e9e\"/><text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"%s\">%s</text>\n",
			x, axisY, x, axisY+4, x, axisY+16, colDim, relMS(at.Sub(t.Start)))
	}
	total := 0
	for _, c := range t.Conversations {
		total += len(c.Events)
	}
	every := max(1, (total+p.o.MaxTicks-1)/p.o.MaxTicks)
	n := 0
	for ci, c := range t.Conversations {
		for d := 0; d < 2; d++ {
			y := (2*ci + d) * tlLane
			name := fmt.Sprintf("QP pair %d A -> B", c.N)
			if d == 1 {
				name = fmt.Sprintf("QP pair %d B -> A", c.N)
			}
			p.f("<text x=\"4\" y=\"%d\">%s</text>\n", y+13, esc(name))
		}
		for _, m := range c.Messages {
			y := ci*2*tlLane + side(m.FromA)*tlLane
			end := m.End
			if !m.Done || end.Before(m.Start) {
				end = t.End
			}
			x0, x1 := p.x(m.Start), p.x(end)
			col := colRequest
			switch {
			case m.Status != "" || !m.Done:
				col = colProblem
			case m.Retx > 0:
				col = colWarn
			}
			p.f("<rect class=\"msgbar\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" fill-opacity=\"0.35\" stroke=\"%s\"><title>%s</title></rect>\n",
				x0, y+3, max(x1-x0, 2), tlLane-6, col, col, esc(m.Summary()))
		}
		for i := range c.Events {
			e := &c.Events[i]
			if e.Pkt == nil {
				x := p.x(e.Time)
				p.f("<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\" stroke-dasharray=\"3 2\"><title>%s</title></line>\n",
					x, ci*2*tlLane, x, (ci+1)*2*tlLane, colCongest, esc(e.Label))
				continue
			}
			n++
			if n%every != 0 && !e.Marks.Problem() {
				continue
			}
			y := ci*2*tlLane + side(e.FromA)*tlLane
			x := p.x(e.Time)
			p.f("<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\"/>\n", x, y+1, x, y+tlLane-1, eventColor(e.Kind, e.Marks))
		}
	}
	p.f("</svg>\n")
	if every > 1 {
		p.f("<p>(one packet tick in %d drawn, and every marked packet)</p>\n", every)
	}
}

// eventColor picks a packet's color.
func eventColor(k Kind, m Mark) string {
	switch {
	case m&(MarkLost|MarkNAK|MarkBadICRC|MarkMalformed|MarkGap) != 0:
		return colProblem
	case m&(MarkRetransmit|MarkRNR|MarkDupACK|MarkDuplicate) != 0:
		return colWarn
	case m&(MarkCE|MarkCNP|MarkNote) != 0:
		return colCongest
	case k == KindRequest:
		return colRequest
	}
	return colResp
}

// conversation writes one QP pair's heading, statistics and ladder.
func (p *htmlPrinter) conversation(c *Conversation) {
	p.f("<section class=\"conv\" id=\"qp%d\">\n<h2>%s</h2>\n", c.N, esc(c.Title()))
	p.f("<p class=\"ep\">A = %s</p><p class=\"ep\">B = %s</p>\n", esc(c.A.String()), esc(c.B.String()))
	p.stats(c)
	rows := c.Rows(p.o.RowOptions)
	h := topH + len(rows)*rowH + 16
	p.svgOpen("ladder", h)
	p.f("<defs><marker id=\"ah%d\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">"+
		"<path d=\"M0,0 L10,5 L0,10 z\" fill=\"context-stroke\"/></marker></defs>\n", c.N)
	p.f("<text x=\"%d\" y=\"16\" text-anchor=\"end\" fill=\"%s\">time ms</text>", xTime, colDim)
	p.f("<text x=\"%d\" y=\"16\" font-weight=\"bold\">A %s</text>", xA-4, esc(c.A.String()))
	p.f("<text x=\"%d\" y=\"16\" text-anchor=\"end\" font-weight=\"bold\">B %s</text>\n", xB+4, esc(c.B.String()))
	for _, x := range []int{xA, xB} {
		p.f("<line x1=\"%d\" y1=\"24\" x2=\"%d\" y2=\"%d\" stroke=\"#424242\" stroke-width=\"2\"/>\n", x, x, h-8)
	}
	for i := range rows {
		p.row(c, &rows[i], topH+i*rowH)
	}
	p.f("</svg>\n</section>\n")
}

// row draws one ladder row with its top at y.
func (p *htmlPrinter) row(c *Conversation, r *Row, y int) {
	mid := y + rowH/2
	ts := relMS(r.Time.Sub(p.t.Start))
	switch r.Kind {
	case RowMessage:
		p.f("<g class=\"msg\" data-msg=\"%d\"><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#eeeeee\"/>"+
			"<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text></g>\n",
			r.Msg.N, xA+2, y+3, xB-xA-4, rowH-6, (xA+xB)/2, mid+4, esc(r.Label))
	case RowNote:
		p.f("<g class=\"note\"><text x=\"%d\" y=\"%d\" text-anchor=\"end\" fill=\"%s\">%s</text>"+
			"<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-dasharray=\"4 3\"/>"+
			"<text x=\"%d\" y=\"%d\" fill=\"%s\">%s</text></g>\n",
			xTime, mid+4, colDim, ts, xA, mid, xB, mid, colCongest, xNotes, mid+4, colCongest, esc(r.Label))
	case RowElided:
		p.f("<g class=\"elided\"><text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"%s\" font-style=\"italic\">... %s ...</text></g>\n",
			(xA+xB)/2, mid+4, colDim, esc(r.Label))
	default:
		p.packet(c, r, y, ts)
	}
}

// packet draws a packet row: a slanted arrow from sender to receiver, its
// label, and its marks and notes to the right.
func (p *htmlPrinter) packet(c *Conversation, r *Row, y int, ts string) {
	x1, x2 := xA, xB
	if !r.FromA {
		x1, x2 = xB, xA
	}
	y1, y2 := y+8, y+rowH-4
	col := eventColor(kindOf(r), r.Marks)
	dash := ""
	if r.Marks&MarkRetransmit != 0 {
		dash = ` stroke-dasharray="6 3"`
	}
	msg := 0
	if r.Msg != nil {
		msg = r.Msg.N
	}
	title := ts + " ms: " + r.Label
	if len(r.Notes) > 0 {
		title += " | " + strings.Join(r.Notes, "; ")
	}
	p.f("<g class=\"pkt\" data-msg=\"%d\"><title>%s</title>", msg, esc(title))
	p.f("<text x=\"%d\" y=\"%d\" text-anchor=\"end\" fill=\"%s\">%s</text>", xTime, y2, colDim, ts)
	if r.Marks&MarkLost != 0 {
		// The arrow stops three quarters of the way, with a cross.
		xe := x1 + (x2-x1)*3/4
		ye := y1 + (y2-y1)*3/4
		p.f("<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"1.5\"%s/>", x1, y1, xe, ye, col, dash)
		p.f("<path d=\"M%d,%d L%d,%d M%d,%d L%d,%d\" stroke=\"%s\" stroke-width=\"2\"/>", xe-5, ye-5, xe+5, ye+5, xe-5, ye+5, xe+5, ye-5, colProblem)
	} else {
		p.f("<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"1.5\"%s marker-end=\"url(#ah%d)\"/>", x1, y1, x2, y2, col, dash, c.N)
	}
	p.f("<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"%s\">%s</text>", (xA+xB)/2, y1-1, col, esc(r.Label))
	if notes := noteText(r); notes != "" {
		p.f("<text x=\"%d\" y=\"%d\" fill=\"%s\">%s</text>", xNotes, y2, col, esc(notes))
	}
	p.f("</g>\n")
}

// kindOf guesses a row's packet kind for its color.
func kindOf(r *Row) Kind {
	if r.Msg != nil && r.Msg.FromA == r.FromA {
		return KindRequest
	}
	return KindAck
}

// stats writes a conversation's statistics table.
func (p *htmlPrinter) stats(c *Conversation) {
	p.f("<table class=\"stats\"><tr><th>requests by</th><th>messages</th><th>bytes</th><th>packets</th><th>retransmitted</th>" +
		"<th>lost</th><th>NAKs</th><th>RNR NAKs</th><th>CNPs</th><th>CE marks</th><th>dup ACKs</th><th>coalesced ACKs</th><th>RTT ms min / avg / max (samples)</th></tr>\n")
	for i, dir := range []string{"A", "B"} {
		s := &c.Stats[i]
		rtt := esc(rttText(s, c.requester(i), nil, " / "))
		p.f("<tr><td>%s</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%s</td></tr>\n",
			dir, s.Messages, s.Bytes, s.Packets, s.Retransmits, s.Lost, s.NAKs, s.RNRNAKs, s.CNPs, s.CEMarks, s.DupACKs, s.Coalesced, rtt)
	}
	p.f("</table>\n")
}
