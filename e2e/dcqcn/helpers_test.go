package dcqcn

import (
	"os"
	"testing"

	"github.com/rxego/rxego"
)

// needRoot skips the test when the set-up cannot run here, except under
// CI=true, where that is a failure.
func needRoot(t *testing.T) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// newTestbed builds a testbed closed at the end of the test.
func newTestbed(t *testing.T, opts *rxego.Options) *Testbed {
	t.Helper()
	needRoot(t)
	tb, err := NewTestbed(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tb.Close(); err != nil {
			t.Error(err)
		}
	})
	return tb
}
