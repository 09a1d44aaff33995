package lab_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/rxego/rxego/conformance/lab"
)

// TestNewRemovesStaleLabs checks that a namespace and run directory left by
// a process that no longer exists (a killed test run) are cleaned up by the
// next New.
func TestNewRemovesStaleLabs(t *testing.T) {
	requireLab(t)
	// A PID that certainly ended: our own finished child's.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	stale := "rxegolab" + strconv.Itoa(cmd.Process.Pid)
	if out, err := exec.Command("ip", "netns", "add", stale).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", stale).Run() })
	staleRun := filepath.Join(lab.Dir(), "run", stale)
	if err := os.MkdirAll(staleRun, 0o755); err != nil {
		t.Fatal(err)
	}
	l := newLab(t)
	if _, err := os.Stat(filepath.Join("/run/netns", stale)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale namespace %s survived New: %v", stale, err)
	}
	if _, err := os.Stat(staleRun); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale run dir survived New: %v", err)
	}
	// The new lab's own namespace is there and not mistaken for stale.
	if _, err := os.Stat(filepath.Join("/run/netns", l.Name())); err != nil {
		t.Errorf("new lab namespace: %v", err)
	}
}
