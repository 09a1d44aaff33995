package perftest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/netns"
)

// TestMTUClampedToActive: "-m 4096" on a port whose link carries 1500
// bytes runs at the active MTU, 1024, with perftest's notice, instead of
// failing at the QP's modify.
func TestMTUClampedToActive(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (a network namespace whose loopback has MTU 1500)")
	}
	ns := fmt.Sprintf("rxperfmtu%d", os.Getpid()%100000)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	for _, args := range [][]string{{"netns", "add", ns}, {"-n", ns, "link", "set", "lo", "mtu", "1500", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var dev *rxego.Device
	if err := netns.Do(f, func() (err error) { dev, err = rxego.Open("127.0.0.1", nil); return err }); err != nil {
		t.Fatal(err)
	}
	defer dev.Close()

	var out bytes.Buffer
	s := &session{cfg: normalised{Config: Config{Out: &out, Device: dev}, mtu: rxego.MTU4096}}
	if err := s.openDevice(dev.Addr().Addr()); err != nil {
		t.Fatal(err)
	}
	if s.cfg.mtu != rxego.MTU1024 {
		t.Fatalf("MTU after the clamp: %d bytes, want 1024", s.cfg.mtu.Bytes())
	}
	if !strings.Contains(out.String(), "Changing to active mtu - 1024") {
		t.Fatalf("no notice of the change: %q", out.String())
	}
	out.Reset()
	s.cfg.mtu = rxego.MTU512
	if s.openDevice(dev.Addr().Addr()); s.cfg.mtu != rxego.MTU512 || out.Len() != 0 {
		t.Fatalf("an MTU below the active one changed: %d bytes, %q", s.cfg.mtu.Bytes(), out.String())
	}
}
