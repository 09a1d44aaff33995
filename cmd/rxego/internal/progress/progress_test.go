package progress

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer safe for the reporter's goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestReporter checks that an enabled reporter redraws its line and
// erases it on Stop, and that a disabled one writes nothing.
func TestReporter(t *testing.T) {
	var off lockedBuffer
	r := Start(&off, false, func() string { return "never" })
	r.Stop() // a nil Reporter stops fine
	var on lockedBuffer
	n := 0
	r = Start(&on, true, func() string { n++; return "working" })
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(on.String(), "\rworking") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	r.Stop()
	r.Stop()
	s := on.String()
	if off.String() != "" || !strings.HasPrefix(s, "\rworking") || !strings.HasSuffix(s, "\r       \r") {
		t.Errorf("disabled wrote %q; enabled wrote %q", off.String(), s)
	}
	if !Wanted(os.Stderr, true) {
		t.Error("forced progress not wanted")
	}
	f, err := os.CreateTemp(t.TempDir(), "x")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(f) || Wanted(f, false) {
		t.Error("a file is a terminal")
	}
}
