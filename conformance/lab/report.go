package lab

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Row is one line of a Report.
type Row struct {
	Case     string        // e.g. "rc_pingpong"
	Kernel   string        // kernel series or release
	Role     string        // e.g. "server", "client", "rxego->rxe"
	Result   string        // e.g. "pass", "FAIL: exit 1"
	Duration time.Duration // how long the case took
	// Counters is the rxe hw_counters delta over the case (see
	// CounterDelta); zero entries are left out of the table.
	Counters map[string]uint64
	// Resent is how much of the case's traffic was sent again, from
	// rxego's counters (the conformance suite's resentRatio), or "".
	Resent string
	Note   string
}

// Report collects rows from (possibly parallel) tests and writes them as a
// markdown table.
type Report struct {
	title string
	run   string
	mu    sync.Mutex
	rows  []Row
}

// SetRun names the run the report comes from (commit, CI or not, host),
// printed under the title, so that a report copied into the docs says
// which run it is.
func (r *Report) SetRun(run string) {
	r.mu.Lock()
	r.run = run
	r.mu.Unlock()
}

// NewReport returns an empty report with a title.
func NewReport(title string) *Report { return &Report{title: title} }

// Add appends a row.
func (r *Report) Add(row Row) {
	r.mu.Lock()
	r.rows = append(r.rows, row)
	r.mu.Unlock()
}

// Rows returns a copy of the rows so far.
func (r *Report) Rows() []Row {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rows)
}

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", r.title)
	fmt.Fprintf(&b, "Generated %s.\n\n", time.Now().UTC().Format(time.RFC3339))
	r.mu.Lock()
	run := r.run
	r.mu.Unlock()
	if run != "" {
		fmt.Fprintf(&b, "Run: %s.\n\n", run)
	}
	b.WriteString("| case | kernel | role | result | duration | resent | rxe counters (delta) | note |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows() {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n",
			cell(row.Case), cell(row.Kernel), cell(row.Role), cell(row.Result),
			row.Duration.Round(time.Millisecond), cell(row.Resent), cell(formatCounters(row.Counters)), cell(row.Note))
	}
	return b.String()
}

// WriteFile writes the markdown to path, creating its directory.
func (r *Report) WriteFile(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(r.Markdown()), 0o644)
}

// ReportPath returns $RXEGO_REPORT when set, else def: tests pass a path
// under t.TempDir() or the lab's run directory so that a plain `go test`
// leaves the tree clean.
func ReportPath(def string) string {
	if p := os.Getenv("RXEGO_REPORT"); p != "" {
		return p
	}
	return def
}

// cell makes s safe inside a markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

// formatCounters renders the non-zero counters as "name=value" sorted by
// name.
func formatCounters(c map[string]uint64) string {
	var parts []string
	for k, v := range c {
		if v != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", k, v))
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}
