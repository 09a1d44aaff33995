package probe

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"strings"
	"time"

	"github.com/rxego/rxego/internal/app/ladder"
	"github.com/rxego/rxego/internal/app/trace"
)

// Verdict is what a scenario found.
type Verdict string

// Verdicts.
const (
	Conforms      Verdict = "conforms"
	Deviates      Verdict = "deviates"
	NotApplicable Verdict = "not applicable"
	Inconclusive  Verdict = "inconclusive"
)

// Result is one scenario's outcome.
type Result struct {
	Name     string  `json:"name"`
	Rule     string  `json:"rule"`
	Requires string  `json:"requires"`
	Verdict  Verdict `json:"verdict"`
	// Detail says why, when the verdict is not "conforms": the step whose
	// expectation failed and what came instead.
	Detail string `json:"detail,omitempty"`
	// Observed summarises the peer's packets on the scenario's QP, PSNs
	// relative to StartPSN.
	Observed []string `json:"observed"`
	MyQPN    uint32   `json:"probe_qpn,omitempty"`
	PeerQPN  uint32   `json:"peer_qpn,omitempty"`
	StartPSN uint32   `json:"start_psn,omitempty"`
	// Ladder is the exchange drawn as text (internal/app/ladder).
	Ladder string `json:"ladder,omitempty"`

	records []trace.Record
}

// Report is a whole run's findings.
type Report struct {
	Mode        string    `json:"mode"` // responder or requester: which side of the peer was probed
	Peer        string    `json:"peer"`
	Tool        string    `json:"tool"` // the C tool the peer ran
	PeerVersion string    `json:"peer_version,omitempty"`
	MTU         int       `json:"mtu"`
	Started     time.Time `json:"started"`
	Results     []Result  `json:"results"`
	Sent        int       `json:"packets_sent"`
	Notes       []string  `json:"notes,omitempty"`
	Summary     string    `json:"summary"`

	all []trace.Record
}

// order puts the results in the order of the scenarios given.
func (r *Report) order(scen []*Scenario) {
	byName := map[string]Result{}
	for _, res := range r.Results {
		byName[res.Name] = res
	}
	out := r.Results[:0:0]
	for _, s := range scen {
		if res, ok := byName[s.Name]; ok {
			out = append(out, res)
			delete(byName, s.Name)
		}
	}
	r.Results = out
}

// finish attaches each scenario's packets and ladder and writes the
// summary line.
func (r *Report) finish(w *wire) {
	r.all = w.records()
	r.Sent = w.sentCount()
	for i := range r.Results {
		res := &r.Results[i]
		if res.MyQPN == 0 {
			continue
		}
		b := ladder.NewBuilder()
		for _, rec := range r.all {
			if rec.RoCE != nil && (rec.DestQP == res.MyQPN || rec.DestQP == res.PeerQPN) {
				res.records = append(res.records, rec)
				b.Add(rec)
			}
		}
		var sb strings.Builder
		if b.Len() > 0 && ladder.WriteText(&sb, b.Finish(), ladder.TextOptions{Width: 48}) == nil {
			res.Ladder = sb.String()
		}
	}
	r.Summary = r.summary()
}

// Counts returns how many results have each verdict.
func (r *Report) Counts() map[Verdict]int {
	m := map[Verdict]int{}
	for _, res := range r.Results {
		m[res.Verdict]++
	}
	return m
}

// summary is the one-line summary of the run.
func (r *Report) summary() string {
	c := r.Counts()
	return fmt.Sprintf("%s mode vs %s (%s): %d scenarios: %d conform, %d deviate, %d not applicable, %d inconclusive; %d packets sent",
		r.Mode, r.Peer, r.Tool, len(r.Results), c[Conforms], c[Deviates], c[NotApplicable], c[Inconclusive], r.Sent)
}

// Result returns the named scenario's result, or false.
func (r *Report) Result(name string) (Result, bool) {
	for _, res := range r.Results {
		if res.Name == name {
			return res, true
		}
	}
	return Result{}, false
}

// WriteText writes the report for a terminal: per scenario the rule, the
// verdict, what the peer did and the ladder; ladders can be left out.
func (r *Report) WriteText(w io.Writer, ladders bool) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "rxego probe: %s mode, peer %s running %s", r.Mode, r.Peer, r.Tool)
	if r.PeerVersion != "" {
		fmt.Fprintf(&b, " (perftest %s)", r.PeerVersion)
	}
	fmt.Fprintf(&b, ", path MTU %d\n", r.MTU)
	for _, res := range r.Results {
		fmt.Fprintf(&b, "\n== %s: %s\n", res.Name, strings.ToUpper(string(res.Verdict)))
		fmt.Fprintf(&b, "   rule:     %s\n   requires: %s\n", res.Rule, res.Requires)
		if res.Detail != "" {
			fmt.Fprintf(&b, "   why:      %s\n", res.Detail)
		}
		if res.MyQPN != 0 {
			obs := "nothing"
			if len(res.Observed) > 0 {
				obs = strings.Join(res.Observed, "; ")
			}
			fmt.Fprintf(&b, "   peer QP %#x sent: %s\n", res.PeerQPN, obs)
		}
		if ladders && res.Ladder != "" {
			for line := range strings.Lines(res.Ladder) {
				b.WriteString("   | " + line)
			}
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "\nnote: %s\n", n)
	}
	fmt.Fprintf(&b, "\n%s\n", r.Summary)
	_, err := w.Write(b.Bytes())
	return err
}

// WriteJSON writes the report as one JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(r)
}

// WriteHTML writes a self-contained page: the verdict table, then the
// ladder page of the whole run (internal/app/ladder's HTML, one QP pair per
// scenario) embedded.
func (r *Report) WriteHTML(w io.Writer) error {
	b := ladder.NewBuilder()
	for _, rec := range r.all {
		if rec.RoCE != nil {
			b.Add(rec)
		}
	}
	var lad bytes.Buffer
	if err := ladder.WriteHTML(&lad, b.Finish(), ladder.HTMLOptions{Title: "rxego probe: " + r.Peer}); err != nil {
		return err
	}
	var p bytes.Buffer
	p.WriteString("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>rxego probe</title>\n")
	p.WriteString("<style>body{font-family:sans-serif;margin:1em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top;font-size:13px}" +
		".conforms{background:#e8f5e9}.deviates{background:#ffebee}.inconclusive{background:#fff8e1}.na{background:#eceff1}iframe{width:100%;height:1400px;border:1px solid #ccc}</style></head><body>\n")
	fmt.Fprintf(&p, "<h1>rxego probe: %s mode</h1>\n<p>peer %s running %s, path MTU %d</p>\n<p><b>%s</b></p>\n",
		html.EscapeString(r.Mode), html.EscapeString(r.Peer), html.EscapeString(r.Tool), r.MTU, html.EscapeString(r.Summary))
	p.WriteString("<table><tr><th>scenario</th><th>rule</th><th>requires</th><th>verdict</th><th>peer sent</th><th>QPs (probe / peer)</th></tr>\n")
	for _, res := range r.Results {
		cls := strings.ReplaceAll(string(res.Verdict), "not applicable", "na")
		v := string(res.Verdict)
		if res.Detail != "" {
			v += ": " + res.Detail
		}
		fmt.Fprintf(&p, "<tr class=\"%s\"><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%#x / %#x</td></tr>\n", cls,
			html.EscapeString(res.Name), html.EscapeString(res.Rule), html.EscapeString(res.Requires), html.EscapeString(v),
			html.EscapeString(strings.Join(res.Observed, "; ")), res.MyQPN, res.PeerQPN)
	}
	p.WriteString("</table>\n<h2>Ladders</h2>\n<p>Each scenario ran on its own QP pair: find it below by its QP numbers.</p>\n")
	fmt.Fprintf(&p, "<iframe srcdoc=\"%s\"></iframe>\n</body></html>\n", html.EscapeString(lad.String()))
	_, err := w.Write(p.Bytes())
	return err
}
