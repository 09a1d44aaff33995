package reliability_test

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/transport"
	"golang.org/x/sys/unix"
)

// vethPair is two network namespaces made for one test, joined by a veth
// pair: nsA holds 198.18.1.1/24, nsB 198.18.1.2/24, and neither has a
// route anywhere else. Packets between them cross the kernel's IP, UDP and
// netfilter paths for real.
type vethPair struct {
	nsA, nsB string
}

var nsSeq atomic.Int32

// Addresses of the two ends.
var (
	vethA = netip.MustParseAddrPort("198.18.1.1:4791")
	vethB = netip.MustParseAddrPort("198.18.1.2:4791")
)

// newVethPair makes the namespaces, or skips (fails under CI=true) when the
// test cannot: it needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and iproute2.
func newVethPair(t *testing.T) *vethPair {
	t.Helper()
	if os.Geteuid() != 0 {
		ciOrSkip(t, "needs root for network namespaces")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			ciOrSkip(t, "needs %s", tool)
		}
	}
	id := fmt.Sprintf("%d%d", os.Getpid()%100000, nsSeq.Add(1))
	v := &vethPair{nsA: "rxrelA" + id, nsB: "rxrelB" + id}
	la, lb := "rxra"+id, "rxrb"+id
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", v.nsA).Run()
		exec.Command("ip", "netns", "del", v.nsB).Run()
	})
	for _, args := range [][]string{
		{"netns", "add", v.nsA},
		{"netns", "add", v.nsB},
		{"-n", v.nsA, "link", "add", la, "address", "02:00:c6:12:01:01", "type", "veth", "peer", "name", lb, "address", "02:00:c6:12:01:02", "netns", v.nsB},
		{"-n", v.nsA, "neigh", "add", "198.18.1.2", "lladdr", "02:00:c6:12:01:02", "dev", la, "nud", "permanent"},
		{"-n", v.nsB, "neigh", "add", "198.18.1.1", "lladdr", "02:00:c6:12:01:01", "dev", lb, "nud", "permanent"},
		{"-n", v.nsA, "addr", "add", "198.18.1.1/24", "dev", la},
		{"-n", v.nsB, "addr", "add", "198.18.1.2/24", "dev", lb},
		{"-n", v.nsA, "link", "set", la, "up"},
		{"-n", v.nsB, "link", "set", lb, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			ciOrSkip(t, "ip %v: %v\n%s", args, err, out)
		}
	}
	return v
}

// nft runs an nft script inside namespace ns.
func nft(t *testing.T, ns, script string) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft in %s: %v\n%s\n%s", ns, err, out, script)
	}
}

// nftCounter reads the packet count of the rule commented name in ns.
func nftCounter(t *testing.T, ns, name string) uint64 {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "inet", "rxrel").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`counter packets (\d+) bytes \d+ .*comment "` + name + `"`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no counter %q in\n%s", name, out)
	}
	n, _ := strconv.ParseUint(string(m[1]), 10, 64)
	return n
}

// listenIn opens a transport Conn inside namespace ns: the socket belongs
// to ns for good, wherever the engine later uses it.
func listenIn(t *testing.T, ns string, addr netip.AddrPort) transport.Conn {
	t.Helper()
	var c transport.Conn
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		var fd int
		if fd, err = unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return
		}
		defer unix.Close(fd)
		if err = unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			return
		}
		c, err = transport.Listen(addr, transport.Options{})
	}()
	<-done
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestKernelPathLoss runs rxego between the two ends of a veth pair in
// private namespaces while nftables drops 5% of the RoCE packets entering
// each namespace at random and marks 10% of the rest CE on the way out of
// one of them: loss recovery and DCQCN through the kernel's own path, not
// the test shim. (With UDP GRO on the veth, nftables sees a coalesced
// batch as one packet: one drop may take several RoCE packets.)
func TestKernelPathLoss(t *testing.T) {
	v := newVethPair(t)
	const table = `table inet rxrel {
	chain in {
		type filter hook input priority 0;
		udp dport 4791 numgen random mod 100 < 5 counter drop comment "loss"
	}
	chain out {
		type filter hook output priority 0;
		udp dport 4791 numgen random mod 100 < %d counter ip ecn set ce comment "ce"
	}
}
`
	nft(t, v.nsA, fmt.Sprintf(table, 0))
	nft(t, v.nsB, fmt.Sprintf(table, 10))
	n := 2000
	if testing.Short() {
		n = 500
	}
	for _, op := range []rxego.WROpcode{rxego.WRSend, rxego.WRWrite, rxego.WRRead, rxego.WRFetchAdd} {
		t.Run(op.String(), func(t *testing.T) {
			r := opRun{op: op, n: n, size: 600, inFlight: 32, timeout: 60 * time.Second}
			ec := endConfig{size: r.bufSize(), depth: r.inFlight + 16, window: 128, rdepth: r.n + 16}
			ec.conn = listenIn(t, v.nsA, vethA)
			a := openEnd(t, ec)
			ec.conn = listenIn(t, v.nsB, vethB)
			b := openEnd(t, ec)
			connect(t, a, b, rxego.ConnectOptions{MTU: rxego.MTU256, Timeout: 8, RetryCnt: 7, MaxRdAtomic: 16})
			lossA, lossB := nftCounter(t, v.nsA, "loss"), nftCounter(t, v.nsB, "loss")
			took := runOp(t, a, b, r)
			lostA, lostB := nftCounter(t, v.nsA, "loss")-lossA, nftCounter(t, v.nsB, "loss")-lossB
			t.Logf("%d %v (600 bytes but atomics) in %v; nftables dropped %d into A, %d into B; CE marks seen by A %d (CNPs sent %d), by B %d; a: %s; b: %s",
				n, op, took.Round(time.Millisecond), lostA, lostB, a.dev.Stats().ECNMarkedPktsReceived, a.dev.Stats().CNPsSent,
				b.dev.Stats().ECNMarkedPktsReceived, a.stats(), b.stats())
			if lostA+lostB == 0 {
				t.Fatal("nftables dropped nothing: the loss rule is not in the path")
			}
			if a.dev.Stats().ECNMarkedPktsReceived == 0 {
				t.Fatal("no CE-marked packet reached A: the marking rule is not in the path")
			}
		})
	}
}
