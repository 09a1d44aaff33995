// Package lab boots real Linux kernels with the in-tree Soft-RoCE driver
// (rdma_rxe) under QEMU so that tests can run rdma-core tools against each
// other and against rxego.
//
// A Lab is a private network namespace with a bridge (198.18.0.1/24 and
// 2001:2::1/64); each Guest is a QEMU VM (TCG) on that bridge whose root
// filesystem is the host's, read-only over 9p, with rxe0 on eth0 and an
// agent on TCP port 7700 that runs commands for the host. Host programs
// join the namespace through Lab.Command and Lab.InNetns. Nothing routes
// out of the namespace.
//
// Typical use:
//
//	if err := lab.Available(); err != nil { t.Skip(err) }
//	l, err := lab.New(lab.Options{Logf: t.Logf})
//	t.Cleanup(func() { l.Close() })
//	g, err := l.Boot("6.12", "198.18.0.11", lab.BootOptions{})
//	res, err := g.Run(ctx, "ibv_devinfo")
//
// The one-time set-up (packages, kernels, initramfs) is conformance/setup.sh.
package lab

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Kernels lists the kernel series setup.sh prepares, oldest first.
var Kernels = []string{"6.1", "6.12"}

// Addresses of the lab network. Guests take 198.18.0.2 to .254; the host
// end (the bridge) is HostIP.
const (
	HostIP     = "198.18.0.1"
	HostIP6    = "2001:2::1"
	prefixLen  = 24
	prefixLen6 = 64
	bridgeName = "br0"
	// BridgeMAC is the bridge's fixed MAC address (locally administered).
	// A Linux bridge left to choose takes the lowest MAC among its ports,
	// so it changed whenever a guest's tap came or went (a guest rebooted
	// after its kernel died): IPv4 guests heard the kernel's gratuitous
	// ARP, but an IPv6 guest kept the old MAC in its neighbour cache until
	// its unicast probes failed, about 8 s in which every packet to the
	// host was lost (TestPerftestIPv6 in CI, twice).
	BridgeMAC = "02:00:c6:12:00:01"
	// netnsPrefix starts the name of every lab namespace; New removes
	// namespaces with it whose creating process is gone.
	netnsPrefix = "rxegolab"
)

// SetupCommand is what a person runs to make Available succeed.
const SetupCommand = "sudo conformance/setup.sh"

// requiredTools are the host programs the lab runs.
var requiredTools = []string{"qemu-system-x86_64", "ip", "tcpdump", "nft",
	"ibv_rc_pingpong", "ib_write_bw", "rping", "rdma"}

// Dir returns the lab's cache directory: $RXEGO_LAB_DIR, or conformance/.lab
// in the source tree this package was built from.
func Dir() string {
	if d := os.Getenv("RXEGO_LAB_DIR"); d != "" {
		return d
	}
	return filepath.Join(sourceRoot(), "conformance", ".lab")
}

// sourceRoot returns the module root: from this file's compile-time path
// when it is absolute (not -trimpath), else from `go env GOMOD`.
func sourceRoot() string {
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		// file is <root>/conformance/lab/lab.go
		return filepath.Dir(filepath.Dir(filepath.Dir(file)))
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err == nil && len(strings.TrimSpace(string(out))) > 0 {
		return filepath.Dir(strings.TrimSpace(string(out)))
	}
	return "."
}

// NotAvailableError says why the lab cannot run here and how to fix it.
type NotAvailableError struct {
	Reasons []string
}

func (e *NotAvailableError) Error() string {
	return fmt.Sprintf("rxe lab not available (%s); set it up with: %s",
		strings.Join(e.Reasons, "; "), SetupCommand)
}

// Available returns nil when this process can run a lab: root, the host
// tools, /dev/net/tun and both kernels with their initramfs in Dir().
// Otherwise it returns a *NotAvailableError naming the set-up command.
func Available() error {
	var reasons []string
	if os.Geteuid() != 0 {
		reasons = append(reasons, "not root")
	}
	for _, t := range requiredTools {
		if _, err := exec.LookPath(t); err != nil {
			reasons = append(reasons, "missing "+t)
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		reasons = append(reasons, "no /dev/net/tun")
	}
	if os.Getenv("RXEGO_AGENT") == "" {
		if _, err := exec.LookPath("go"); err != nil {
			reasons = append(reasons, "no go toolchain to build the agent (or set RXEGO_AGENT)")
		}
	}
	dir := Dir()
	for _, k := range Kernels {
		for _, f := range []string{"vmlinuz", "initramfs.cpio", "stamp"} {
			if _, err := os.Stat(filepath.Join(dir, "kernels", k, f)); err != nil {
				reasons = append(reasons, fmt.Sprintf("kernel %s not prepared in %s", k, dir))
				break
			}
		}
	}
	if len(reasons) > 0 {
		return &NotAvailableError{Reasons: reasons}
	}
	return nil
}

// KernelInfo describes one prepared kernel.
type KernelInfo struct {
	Series  string // "6.1" or "6.12"
	Release string // uname -r, e.g. "6.12.117+deb12-amd64"
	Package string // Debian package and version it came from
}

// Kernel returns what setup.sh recorded about kernel series.
func Kernel(series string) (KernelInfo, error) {
	d := filepath.Join(Dir(), "kernels", series)
	rel, err := os.ReadFile(filepath.Join(d, "release"))
	if err != nil {
		return KernelInfo{}, fmt.Errorf("kernel %q: %w", series, err)
	}
	pkg, _ := os.ReadFile(filepath.Join(d, "package"))
	return KernelInfo{Series: series, Release: strings.TrimSpace(string(rel)),
		Package: strings.TrimSpace(string(pkg))}, nil
}

// Options configure a Lab. The zero value is usable.
type Options struct {
	// Dir is the cache directory from setup.sh; default Dir().
	Dir string
	// Keep leaves the run directory (console logs, captures) in place after
	// Close; otherwise Close removes it.
	Keep bool
	// Logf receives progress messages (boot times, clean-up); e.g. t.Logf.
	Logf func(format string, args ...any)
}

// Lab is one network namespace with its bridge, guests, captures and loss
// rules. Its methods are safe for concurrent use.
type Lab struct {
	opts   Options
	dir    string // cache directory
	name   string // namespace name
	runDir string // per-lab files: share/, console logs, captures
	ns     *os.File

	mu       sync.Mutex
	closed   bool
	guests   map[netip.Addr]*Guest
	captures []*Capture
	loss     map[lossKey]int
}

var labSeq struct {
	sync.Mutex
	n int
}

// New creates a lab: a network namespace named rxegolab<pid>[x<n>] with a
// bridge carrying HostIP/24 and HostIP6/64, and a run directory under the
// cache directory. Namespaces left behind by dead processes are removed
// first. Call Close when done.
func New(opts Options) (*Lab, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if opts.Dir == "" {
		opts.Dir = Dir()
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	removeStale(opts.Dir, opts.Logf)

	labSeq.Lock()
	labSeq.n++
	name := fmt.Sprintf("%s%d", netnsPrefix, os.Getpid())
	if labSeq.n > 1 {
		name = fmt.Sprintf("%sx%d", name, labSeq.n)
	}
	labSeq.Unlock()

	l := &Lab{opts: opts, dir: opts.Dir, name: name,
		runDir: filepath.Join(opts.Dir, "run", name),
		guests: make(map[netip.Addr]*Guest), loss: make(map[lossKey]int)}
	if err := l.create(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func (l *Lab) create() error {
	if err := os.RemoveAll(l.runDir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(l.runDir, "share"), 0o755); err != nil {
		return err
	}
	if err := ipCmd("netns", "add", l.name); err != nil {
		return err
	}
	ns, err := os.Open(filepath.Join("/run/netns", l.name))
	if err != nil {
		return err
	}
	l.ns = ns
	steps := [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", bridgeName, "address", BridgeMAC, "type", "bridge"},
		// The bridge forwards at once (no STP learning delay) and a new tap
		// needs no DAD wait for the host's IPv6 address.
		{"link", "set", bridgeName, "type", "bridge", "forward_delay", "0", "stp_state", "0"},
		{"addr", "add", fmt.Sprintf("%s/%d", HostIP, prefixLen), "dev", bridgeName},
		{"addr", "add", fmt.Sprintf("%s/%d", HostIP6, prefixLen6), "dev", bridgeName, "nodad"},
		{"link", "set", bridgeName, "up"},
	}
	for _, s := range steps {
		if err := ipCmd(append([]string{"-n", l.name}, s...)...); err != nil {
			return err
		}
	}
	agent, err := agentBinary(l.dir)
	if err != nil {
		return err
	}
	if err := linkOrCopy(agent, filepath.Join(l.runDir, "share", agentName)); err != nil {
		return err
	}
	l.opts.Logf("lab: namespace %s, run dir %s", l.name, l.runDir)
	return nil
}

// Name returns the network namespace's name (for `ip netns exec`).
func (l *Lab) Name() string { return l.name }

// Bridge returns the bridge's interface name inside the namespace.
func (l *Lab) Bridge() string { return bridgeName }

// RunDir returns the directory holding this lab's console logs, captures
// and share/ (which guests see read-write at GuestShareDir).
func (l *Lab) RunDir() string { return l.runDir }

// ShareDir returns the host path of the directory every guest of this lab
// sees read-write at GuestShareDir: put test programs or inputs here.
func (l *Lab) ShareDir() string { return filepath.Join(l.runDir, "share") }

// GuestShareDir is where guests see the lab's ShareDir.
const GuestShareDir = "/run/rxego"

// Close stops captures, kills every guest, deletes the namespace (and with
// it the bridge, taps and loss rules) and, unless Options.Keep, removes the
// run directory. It is safe to call more than once; errors are joined.
func (l *Lab) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	caps := l.captures
	guests := make([]*Guest, 0, len(l.guests))
	for _, g := range l.guests {
		guests = append(guests, g)
	}
	l.mu.Unlock()

	var errs []error
	for _, c := range caps {
		if err := c.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, g := range guests {
		g.kill()
	}
	if l.ns != nil {
		l.ns.Close()
	}
	if err := deleteNetns(l.name); err != nil {
		errs = append(errs, err)
	}
	if !l.opts.Keep {
		if err := os.RemoveAll(l.runDir); err != nil {
			errs = append(errs, err)
		}
	} else {
		l.opts.Logf("lab: kept %s", l.runDir)
	}
	return errors.Join(errs...)
}

// deleteNetns kills what still runs in namespace name and deletes it; a
// namespace that does not exist is not an error.
func deleteNetns(name string) error {
	if _, err := os.Stat(filepath.Join("/run/netns", name)); err != nil {
		return nil
	}
	if out, err := exec.Command("ip", "netns", "pids", name).Output(); err == nil {
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			if pid, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil && pid > 1 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	// The kernel frees the namespace after its last process is gone; a
	// killed QEMU takes a moment, and `ip netns del` works regardless.
	return ipCmd("netns", "del", name)
}

// removeStale deletes lab namespaces (and run directories) whose creating
// process no longer exists, left behind by a crashed or killed test.
func removeStale(dir string, logf func(string, ...any)) {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		pid, ok := labPID(e.Name())
		if !ok || processAlive(pid) {
			continue
		}
		logf("lab: removing stale namespace %s", e.Name())
		deleteNetns(e.Name())
	}
	runs, _ := os.ReadDir(filepath.Join(dir, "run"))
	for _, e := range runs {
		if pid, ok := labPID(e.Name()); ok && !processAlive(pid) {
			os.RemoveAll(filepath.Join(dir, "run", e.Name()))
		}
	}
}

// labPID parses the creating PID out of a lab namespace name.
func labPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, netnsPrefix)
	if !ok {
		return 0, false
	}
	rest, _, _ = strings.Cut(rest, "x")
	pid, err := strconv.Atoi(rest)
	return pid, err == nil && pid > 0
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// ipCmd runs ip(8) and turns a failure into an error with its output.
func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// waitTimeout bounds how long a helper process may take to stop.
const waitTimeout = 5 * time.Second
