package ladder_test

import (
	"bytes"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/rxego/rxego/internal/app/ladder"
)

// TestFoldedRowKeepsWords: a folded ladder's summary row is never cut in
// the middle of a word, however narrow the ladder: what does not fit
// between the bars follows them, as a row's notes do.
func TestFoldedRowKeepsWords(t *testing.T) {
	tr := analyse(t, "testdata/rxego_cnp.pcapng")
	for _, width := range []int{30, 40, 64} {
		var out bytes.Buffer
		o := ladder.TextOptions{RowOptions: ladder.RowOptions{MaxRows: 20}, Width: width}
		if err := ladder.WriteText(&out, tr, o); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, line := range strings.Split(out.String(), "\n") {
			if !strings.Contains(line, ":") || !strings.Contains(line, " not shown") && !strings.Contains(line, "without anything") {
				continue
			}
			found = true
			if strings.Contains(line, "..") && !strings.Contains(line, "... ") {
				t.Errorf("width %d: a word cut: %q", width, line)
			}
			if strings.Contains(line, "not shown") && !regexp.MustCompile(`\d+ marked\b`).MatchString(line) {
				t.Errorf("width %d: the count of marked rows lost: %q", width, line)
			}
		}
		if !found {
			t.Errorf("width %d: no folded row:\n%s", width, out.String())
		}
	}
}

// TestStatsRowsAndTurnaround: the statistics have a row per requester
// ("requests by A", "B"), and an RTT taken on the responder's device is
// called its turnaround, while one taken on the requester's is not.
func TestStatsRowsAndTurnaround(t *testing.T) {
	tr := analyse(t, "../../../testdata/pcaps/verbs_read_6.12.pcapng") // rxe's READ: A requests, with RTT samples
	c := tr.Conversations[0]
	for _, at := range []struct {
		on         netip.Addr
		turnaround bool
	}{{c.A.Addr, false}, {c.B.Addr, true}} {
		var out bytes.Buffer
		if err := ladder.WriteText(&out, tr, ladder.TextOptions{SummaryOnly: true, CapturedOn: []netip.Addr{at.on}}); err != nil {
			t.Fatal(err)
		}
		s := out.String()
		if !strings.Contains(s, "  requests by  msgs") || !regexp.MustCompile(`(?m)^  A +\d+ +\d+ `).MatchString(s) ||
			!regexp.MustCompile(`(?m)^  B +\d+ +\d+ `).MatchString(s) {
			t.Errorf("captured on %v: no row per requester:\n%s", at.on, s)
		}
		if got := strings.Contains(s, "measured at the responder: its turnaround"); got != at.turnaround {
			t.Errorf("captured on %v: turnaround said %v, want %v:\n%s", at.on, got, at.turnaround, s)
		}
	}
}
