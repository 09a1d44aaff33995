package demo

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// TestTourProbe runs the probe stop: the probe rides Bob's ib_write_bw
// server, and the stop itself fails unless rxego's verdicts are the ones
// it explains; the output carries the report and the three findings.
func TestTourProbe(t *testing.T) {
	var out bytes.Buffer
	var cands []string
	for range 4 {
		cands = append(cands, testaddr.Loopback().String())
	}
	tour, err := OpenOn(&out, cands...)
	if err != nil {
		t.Fatal(err)
	}
	defer tour.Close()
	if err := tour.Run("probe"); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"== psn-gap-nak: CONFORMS", "== reserved-opcode: DEVIATES", "Three findings",
		"RC_ACKNOWLEDGE psn=+0 NAK(PSN_SEQ_ERR)", "5 scenarios: 4 conform, 1 deviate"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the probe stop's output lacks %q:\n%s", want, out.String())
		}
	}
}
