package lab

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestBridgeMACStaysPut checks that the bridge keeps BridgeMAC while taps
// come and go, as they do when a guest is rebooted: a bridge left to pick
// its own MAC takes the lowest of its ports', and a changed MAC cut IPv6
// guests off the host for seconds. It needs root and ip, not QEMU.
func TestBridgeMACStaysPut(t *testing.T) {
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	l, err := New(Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mac := func() string {
		t.Helper()
		out, err := exec.Command("ip", "-n", l.Name(), "-br", "link", "show", "dev", bridgeName).Output()
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(out))
		if len(f) < 3 {
			t.Fatalf("ip link show %s: %q", bridgeName, out)
		}
		return f[2]
	}
	if got := mac(); got != BridgeMAC {
		t.Fatalf("new bridge has MAC %s, want %s", got, BridgeMAC)
	}
	// Each tap gets a MAC below the bridge's, which a bridge that picks
	// its own would take.
	taps := []string{"taptest1", "taptest2", "taptest3"}
	for i, tap := range taps {
		if err := l.addTap(tap, 1500); err != nil {
			t.Fatal(err)
		}
		if err := ipCmd("-n", l.Name(), "link", "set", tap, "address", fmt.Sprintf("02:00:00:00:00:%02x", 3-i)); err != nil {
			t.Fatal(err)
		}
		if got := mac(); got != BridgeMAC {
			t.Fatalf("after adding %s the bridge has MAC %s, want %s", tap, got, BridgeMAC)
		}
	}
	for _, tap := range taps {
		if err := ipCmd("-n", l.Name(), "link", "del", tap); err != nil {
			t.Fatal(err)
		}
		if got := mac(); got != BridgeMAC {
			t.Fatalf("after removing %s the bridge has MAC %s, want %s", tap, got, BridgeMAC)
		}
	}
}
