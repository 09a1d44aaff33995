package demo

import (
	"bytes"
	"strings"
	"testing"
)

// TestTour runs every scenario over real loopback sockets; each scenario
// checks its own outcome (bytes landed, completions, RNR seen) and fails
// otherwise.
func TestTour(t *testing.T) {
	var out bytes.Buffer
	tour, err := Open(&out)
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
