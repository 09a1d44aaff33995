package lab_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

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

// TestGuestDeath crashes a guest's kernel on purpose (sysrq "c") and checks
// what the lab makes of a death: a call in flight to that guest ends with
// ErrGuestExited instead of waiting for TCP to give up, and rerunOnDeath
// records the panic and runs the attempt again on a fresh guest.
func TestGuestDeath(t *testing.T) {
	report := lab.NewReport("guest death")
	var calls int
	var firstErr error
	rerunOnDeath(t, report, func(l *lab.Lab) ([]lab.Row, error) {
		calls++
		g, err := l.Boot("6.12", "198.18.0.11", lab.BootOptions{})
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		if calls > 1 {
			if _, err := g.Run(ctx, "true"); err != nil {
				return nil, err
			}
			return []lab.Row{{Case: "survived", Kernel: g.Kernel().Release, Role: g.IP(), Result: "pass"}}, nil
		}
		// The crash is started in the background; the call in flight is
		// the sleep, which only QEMU's exit can end early.
		if _, err := g.Start("sh", "-c", "sleep 1; echo c > /proc/sysrq-trigger"); err != nil {
			return nil, err
		}
		_, firstErr = g.Run(ctx, "sleep", "200")
		return nil, firstErr
	})
	if calls != 2 {
		t.Fatalf("the attempt ran %d times, want 2", calls)
	}
	if !errors.Is(firstErr, lab.ErrGuestExited) {
		t.Errorf("the call in flight during the crash ended with %v, want ErrGuestExited", firstErr)
	}
	rows := report.Rows()
	if len(rows) != 2 || rows[0].Case != "guest died" || rows[1].Case != "survived" {
		t.Fatalf("report rows %+v, want a death and then the rerun's row", rows)
	}
	if !strings.Contains(rows[0].Note, "sysrq") {
		t.Errorf("the death's row notes %q, want the panic line naming sysrq", rows[0].Note)
	}
}
