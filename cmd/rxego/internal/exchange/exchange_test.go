package exchange

import (
	"io"
	"strings"
	"testing"
)

// TestWithDefaults: zero fields take the tools' defaults; every field is
// refused just outside its range and accepted at its edge, and the error
// names the tool and the size limit given.
func TestWithDefaults(t *testing.T) {
	p, err := Params{}.WithDefaults(Tool{"tool", 4096, "4096"})
	if err != nil || p != (Params{Connections: 1, Count: 10, Size: 100, Out: io.Discard}) {
		t.Fatalf("defaults: %+v %v", p, err)
	}
	for _, bad := range []Params{{Connections: -1}, {Connections: MaxConnections + 1}, {Count: -1}, {Count: MaxCount + 1},
		{Size: -1}, {Size: 4097}} {
		if _, err := bad.WithDefaults(Tool{"tool", 4096, "4 KiB"}); err == nil || !strings.HasPrefix(err.Error(), "tool: ") ||
			!strings.Contains(err.Error(), "(1..4 KiB)") {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	edge := Params{Connections: MaxConnections, Count: MaxCount, Size: 4096, Out: io.Discard}
	if p, err := edge.WithDefaults(Tool{"tool", 4096, "4096"}); err != nil || p != edge {
		t.Errorf("%+v: %+v %v", edge, p, err)
	}
}
