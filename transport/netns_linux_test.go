package transport

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Capabilities the privileged tests need (linux/capability.h).
const (
	capNetAdmin = 12
	capNetRaw   = 13
	capSysAdmin = 21
)

// hasCap reports whether the process has capability c in its effective
// set (root without it, e.g. under setpriv, does not count).
func hasCap(c uint) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			var eff uint64
			fmt.Sscanf(strings.TrimSpace(v), "%x", &eff)
			return eff&(1<<c) != 0
		}
	}
	return false
}

func needCaps(t testing.TB, caps ...uint) {
	t.Helper()
	for _, c := range caps {
		if !hasCap(c) {
			t.Skipf("needs capability %d (run as root)", c)
		}
	}
}

// testNet is two network namespaces made for one test, joined by a veth
// pair: nsA holds vethA with 198.18.0.1/24 and 2001:2::1/64, nsB holds
// vethB with 198.18.0.2/24 and 2001:2::2/64. Nothing touches the host's
// own namespace, so tests running at once cannot collide.
type testNet struct {
	nsA, nsB     string
	vethA, vethB string
}

var netSeq atomic.Int32

// The veth ends' MAC addresses (locally administered).
const (
	macA = "02:00:c6:12:00:01"
	macB = "02:00:c6:12:00:02"
)

func newTestNet(t testing.TB) *testNet {
	t.Helper()
	needCaps(t, capSysAdmin, capNetAdmin, capNetRaw)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2")
	}
	id := fmt.Sprintf("%d%d", os.Getpid()%100000, netSeq.Add(1))
	n := &testNet{nsA: "rxtA" + id, nsB: "rxtB" + id, vethA: "rxta" + id, vethB: "rxtb" + id}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", n.nsA).Run()
		exec.Command("ip", "netns", "del", n.nsB).Run()
	})
	for _, args := range [][]string{
		{"netns", "add", n.nsA},
		{"netns", "add", n.nsB},
		{"-n", n.nsA, "link", "add", n.vethA, "address", macA, "type", "veth", "peer", "name", n.vethB, "address", macB, "netns", n.nsB},
		// Static neighbours: no ARP or neighbour discovery delays (IPv6's
		// would wait about a second for the link-local address).
		{"-n", n.nsA, "neigh", "add", "198.18.0.2", "lladdr", macB, "dev", n.vethA, "nud", "permanent"},
		{"-n", n.nsB, "neigh", "add", "198.18.0.1", "lladdr", macA, "dev", n.vethB, "nud", "permanent"},
		{"-n", n.nsA, "neigh", "add", "2001:2::2", "lladdr", macB, "dev", n.vethA, "nud", "permanent"},
		{"-n", n.nsB, "neigh", "add", "2001:2::1", "lladdr", macA, "dev", n.vethB, "nud", "permanent"},
		{"-n", n.nsA, "addr", "add", "198.18.0.1/24", "dev", n.vethA},
		{"-n", n.nsB, "addr", "add", "198.18.0.2/24", "dev", n.vethB},
		{"-n", n.nsA, "addr", "add", "2001:2::1/64", "dev", n.vethA, "nodad"},
		{"-n", n.nsB, "addr", "add", "2001:2::2/64", "dev", n.vethB, "nodad"},
		{"-n", n.nsA, "link", "set", n.vethA, "up"},
		{"-n", n.nsB, "link", "set", n.vethB, "up"},
		{"-n", n.nsA, "link", "set", "lo", "up"},
		{"-n", n.nsB, "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	return n
}

// ethtool sets device features in namespace ns (skips without ethtool).
func (n *testNet) ethtool(t testing.TB, ns, dev string, features ...string) {
	t.Helper()
	if _, err := exec.LookPath("ethtool"); err != nil {
		t.Skip("needs ethtool")
	}
	args := append([]string{"netns", "exec", ns, "ethtool", "-K", dev}, features...)
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ethtool %v: %v\n%s", features, err, out)
	}
}

// in runs fn on a thread switched into namespace ns. Sockets fn opens
// belong to ns for good, wherever they are used later.
func in(t testing.TB, ns string, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer unix.Close(orig)
	target, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer func() {
		// If the thread cannot go back it stays locked and dies with the goroutine.
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	fn()
}

// capture is an AF_PACKET socket on one device: what goes on the wire.
type capture struct {
	fd   int
	port uint16 // keep UDP datagrams to this port only
}

// capFrame is one captured UDP datagram.
type capFrame struct {
	ip, udp, payload []byte
	outgoing         bool
}

// openCapture opens a capture on dev in the current namespace (call it in in()).
func openCapture(t testing.TB, dev string, port uint16) *capture {
	t.Helper()
	proto := int(htons(unix.ETH_P_ALL))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	ifi, err := netInterface(dev)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifi}); err != nil {
		t.Fatal(err)
	}
	return &capture{fd: fd, port: port}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func netInterface(name string) (int, error) {
	b, err := os.ReadFile("/sys/class/net/" + name + "/ifindex")
	if err != nil {
		// /sys shows the host's namespace; ask the kernel instead.
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return 0, err
		}
		defer unix.Close(fd)
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return 0, err
		}
		if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err != nil {
			return 0, err
		}
		return int(ifr.Uint32()), nil
	}
	var idx int
	_, err = fmt.Sscanf(string(b), "%d", &idx)
	return idx, err
}

// read returns the UDP datagrams to c.port captured until want of them
// arrived or timeout passed.
func (c *capture) read(want int, timeout time.Duration) []capFrame {
	var out []capFrame
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1<<17)
	for len(out) < want {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		pfd := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(pfd, int(left/time.Millisecond)+1); n <= 0 {
			continue
		}
		n, from, err := unix.Recvfrom(c.fd, buf, unix.MSG_DONTWAIT)
		if err != nil || n < 14 {
			continue
		}
		ll, _ := from.(*unix.SockaddrLinklayer)
		if f, ok := c.parse(buf[14:n]); ok {
			f.outgoing = ll != nil && ll.Pkttype == unix.PACKET_OUTGOING
			out = append(out, f)
		}
	}
	return out
}

func (c *capture) parse(b []byte) (capFrame, bool) {
	var ip []byte
	switch {
	case len(b) >= 20 && b[0]>>4 == 4 && b[9] == unix.IPPROTO_UDP:
		ip = b[:int(b[0]&0xf)*4]
	case len(b) >= 40 && b[0]>>4 == 6 && b[6] == unix.IPPROTO_UDP:
		ip = b[:40]
	default:
		return capFrame{}, false
	}
	rest := b[len(ip):]
	if len(rest) < 8 || binary.BigEndian.Uint16(rest[2:]) != c.port {
		return capFrame{}, false
	}
	ulen := int(binary.BigEndian.Uint16(rest[4:]))
	if ulen < 8 || ulen > len(rest) {
		return capFrame{}, false
	}
	f := capFrame{ip: append([]byte(nil), ip...), udp: append([]byte(nil), rest[:8]...), payload: append([]byte(nil), rest[8:ulen]...)}
	return f, true
}
