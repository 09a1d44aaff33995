package setupcheck

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestFailedOutput runs scripts/failed-output.sh, which scripts/test.sh
// calls when the conformance suite fails, on a `go test -v` log of
// parallel subtests (testdata/failedoutput/parallel.log: TestA/6.1/caseb
// fails while TestA/6.12's cases interleave with it) and checks that it
// prints the failing leaf's lines and only those, and cuts a long one to
// its head and tail.
func TestFailedOutput(t *testing.T) {
	script := filepath.Join("..", "..", "..", "scripts", "failed-output.sh")
	log := filepath.Join("testdata", "failedoutput", "parallel.log")
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("bash", append([]string{script, log}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("failed-output.sh %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	want := "\n--- what TestA/6.1/caseb said:\n" +
		"    x_test.go:9: log 6.1 1\n" +
		"    x_test.go:11: boom 6.1\n" +
		"    x_test.go:12: after 1\n"
	if got := run(); got != want {
		t.Errorf("whole output:\n%q\nwant\n%q", got, want)
	}

	cut := "\n--- what TestA/6.1/caseb said:\n" +
		"    x_test.go:9: log 6.1 1\n" +
		"    ... 1 lines left out ...\n" +
		"    x_test.go:12: after 1\n"
	if got := run("1", "1"); got != cut {
		t.Errorf("HEAD 1, TAIL 1:\n%q\nwant\n%q", got, cut)
	}
	if got := run("1", "1"); strings.Contains(got, "6.12") || strings.Contains(got, "FAIL") {
		t.Errorf("lines of passing tests or summaries in the output:\n%s", got)
	}
}
