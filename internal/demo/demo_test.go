package demo

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rxego/rxego/internal/testaddr"
)

// TestTour runs every scenario over real loopback sockets; each scenario
// checks its own outcome (bytes landed, completions, RNR seen) and fails
// otherwise.
func TestTour(t *testing.T) {
	var out bytes.Buffer
	var cands []string
	for i := 0; i < 8; i++ {
		cands = append(cands, testaddr.Loopback().String())
	}
	tour, err := OpenOn(&out, cands...)
	if err != nil {
		t.Fatal(err)
	}
	defer tour.Close()
	if err := tour.Run(); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"Receiver-Not-Ready", "consumes exactly one", "counter now holds 7", "CPU saw nothing"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("tour output lacks %q:\n%s", want, out.String())
		}
	}
}
