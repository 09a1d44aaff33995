package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rxego/rxego/conformance/agentproto"
)

// BootOptions configure one guest. The zero value is usable.
type BootOptions struct {
	// MemoryMB is the guest's RAM; default DefaultMemoryMB.
	MemoryMB int
	// MTU of the guest's eth0 and its tap; default 1500 (RoCE path MTU
	// 1024). The bridge, the host's end, takes the smallest MTU of its
	// ports, as Linux bridges do.
	MTU int
	// IP6 is the guest's IPv6 address; default 2001:2::<last octet of the
	// IPv4 address, as written>, e.g. 2001:2::11 for 198.18.0.11.
	IP6 string
	// NoRXE boots without creating rxe0 (for tests that add it themselves).
	NoRXE bool
	// Timeout bounds the boot until the agent answers and rxe0 is ACTIVE;
	// default DefaultBootTimeout.
	Timeout time.Duration
	// Append is added to the kernel command line.
	Append string
}

// Defaults for BootOptions.
const (
	DefaultMemoryMB    = 512
	DefaultBootTimeout = 120 * time.Second
)

// Guest is one booted VM. Its methods are safe for concurrent use.
type Guest struct {
	lab     *Lab
	kernel  KernelInfo
	ip      netip.Addr
	ip6     netip.Addr
	tap     string
	console string
	cmd     *exec.Cmd
	exited  chan struct{} // closed when QEMU has exited
	waitErr error         // QEMU's exit; valid after exited
	started time.Time
	boot    time.Duration
}

// Kernel returns what the guest runs.
func (g *Guest) Kernel() KernelInfo { return g.kernel }

// IP returns the guest's IPv4 address.
func (g *Guest) IP() string { return g.ip.String() }

// IP6 returns the guest's IPv6 address.
func (g *Guest) IP6() string { return g.ip6.String() }

// BootTime returns how long the guest took from QEMU's start until the
// agent answered and rxe0 was ACTIVE.
func (g *Guest) BootTime() time.Duration { return g.boot }

// ConsoleLog returns the path of the guest's serial console log.
func (g *Guest) ConsoleLog() string { return g.console }

// ConsoleTail returns the last n lines of the console log.
func (g *Guest) ConsoleTail(n int) string {
	data, _ := os.ReadFile(g.console)
	return strings.Join(lastLines(string(data), n), "\n")
}

// Boot starts a guest running kernel series kernel ("6.1" or "6.12") at
// IPv4 address ip (198.18.0.2 to .254) and waits until its agent answers
// and, unless opts.NoRXE, rxe0's port 1 is ACTIVE. On failure the error
// carries the console log's tail and the guest is gone.
func (l *Lab) Boot(kernel, ip string, opts BootOptions) (*Guest, error) {
	g, err := l.startGuest(kernel, ip, opts)
	if err != nil {
		return nil, err
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultBootTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := g.waitReady(ctx, !opts.NoRXE); err != nil {
		g.Close()
		return nil, fmt.Errorf("guest %s (kernel %s): %w\nconsole %s:\n%s", ip, kernel, err, g.console, g.ConsoleTail(40))
	}
	g.boot = time.Since(g.started)
	l.opts.Logf("lab: guest %s kernel %s ready in %v", g.ip, g.kernel.Release, g.boot.Round(time.Millisecond))
	return g, nil
}

// startGuest validates the request, creates the tap and starts QEMU.
func (l *Lab) startGuest(kernel, ip string, opts BootOptions) (*Guest, error) {
	if !knownKernel(kernel) {
		return nil, fmt.Errorf("kernel %q: want one of %v", kernel, Kernels)
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil || !addr.Is4() {
		return nil, fmt.Errorf("guest address %q: not an IPv4 address", ip)
	}
	host := netip.MustParseAddr(HostIP)
	last := addr.As4()[3]
	if netip.PrefixFrom(host, prefixLen).Masked() != netip.PrefixFrom(addr, prefixLen).Masked() ||
		last < 2 || last > 254 {
		return nil, fmt.Errorf("guest address %s: must be in %s/%d, .2 to .254", ip, HostIP, prefixLen)
	}
	ip6s := opts.IP6
	if ip6s == "" {
		ip6s = fmt.Sprintf("2001:2::%d", last)
	}
	ip6, err := netip.ParseAddr(ip6s)
	if err != nil || !ip6.Is6() || ip6.Is4In6() {
		return nil, fmt.Errorf("guest IPv6 address %q: not an IPv6 address", ip6s)
	}
	mem := opts.MemoryMB
	if mem <= 0 {
		mem = DefaultMemoryMB
	}
	mtu := opts.MTU
	if mtu == 0 {
		mtu = 1500
	}
	if mtu < 576 || mtu > 9000 {
		return nil, fmt.Errorf("guest MTU %d: want 576 to 9000", mtu)
	}

	info, err := Kernel(kernel)
	if err != nil {
		return nil, err
	}
	g := &Guest{lab: l, kernel: info, ip: addr, ip6: ip6,
		tap:     fmt.Sprintf("tap%d", last),
		console: filepath.Join(l.runDir, fmt.Sprintf("console-%d.log", last)),
		exited:  make(chan struct{})}

	l.mu.Lock()
	switch {
	case l.closed:
		l.mu.Unlock()
		return nil, errors.New("lab is closed")
	case l.guests[addr] != nil:
		l.mu.Unlock()
		return nil, fmt.Errorf("guest %s already booted", addr)
	}
	l.guests[addr] = g
	l.mu.Unlock()

	if err := l.addTap(g.tap, mtu); err != nil {
		l.forget(g)
		return nil, err
	}
	rxe := "1"
	if opts.NoRXE {
		rxe = "0"
	}
	kdir := filepath.Join(l.dir, "kernels", kernel)
	cmdline := strings.Join([]string{
		"console=ttyS0", "panic=-1", "mitigations=off",
		"rxego.ip=" + fmt.Sprintf("%s/%d", addr, prefixLen),
		"rxego.ip6=" + fmt.Sprintf("%s/%d", ip6, prefixLen6),
		"rxego.mtu=" + strconv.Itoa(mtu),
		"rxego.rxe=" + rxe,
		"rxego.agent=" + agentName,
		"rxego.port=" + strconv.Itoa(agentproto.DefaultPort),
		opts.Append,
	}, " ")
	args := []string{
		"netns", "exec", l.name, "qemu-system-x86_64",
		// Stock kernels do not survive KVM on this kind of host; TCG does.
		"-accel", "tcg",
		"-m", strconv.Itoa(mem), "-smp", "1",
		"-nodefaults", "-nographic", "-display", "none", "-monitor", "none",
		"-no-reboot", // a guest power-off or panic ends QEMU
		"-kernel", filepath.Join(kdir, "vmlinuz"),
		"-initrd", filepath.Join(kdir, "initramfs.cpio"),
		"-append", strings.TrimSpace(cmdline),
		"-serial", "file:" + g.console,
		"-netdev", fmt.Sprintf("tap,id=n0,ifname=%s,script=no,downscript=no", g.tap),
		"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,mac=52:54:00:12:00:%02x", last),
		"-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
		"-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
		"-fsdev", "local,id=share,path=" + l.ShareDir() + ",security_model=none,multidevs=remap",
		"-device", "virtio-9p-pci,fsdev=share,mount_tag=share",
	}
	qlog, err := os.Create(filepath.Join(l.runDir, fmt.Sprintf("qemu-%d.log", last)))
	if err != nil {
		l.forget(g)
		return nil, err
	}
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = qlog, qlog
	// Own process group: a ^C to the test does not reach QEMU before Close
	// does; Pdeathsig: a killed test does not leave QEMU running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	g.started = time.Now()
	if err := cmd.Start(); err != nil {
		qlog.Close()
		l.forget(g)
		return nil, fmt.Errorf("starting qemu: %w", err)
	}
	g.cmd = cmd
	go func() {
		g.waitErr = cmd.Wait()
		qlog.Close()
		close(g.exited)
	}()
	return g, nil
}

// addTap creates tap name in the namespace, on the bridge, at mtu; the
// bridge's MTU is raised to match so jumbo guests can talk to the host.
func (l *Lab) addTap(name string, mtu int) error {
	steps := [][]string{
		{"tuntap", "add", "dev", name, "mode", "tap"},
		{"link", "set", name, "mtu", strconv.Itoa(mtu), "master", bridgeName, "up"},
	}
	for _, s := range steps {
		if err := ipCmd(append([]string{"-n", l.name}, s...)...); err != nil {
			return err
		}
	}
	return nil
}

// forget removes g from its lab's table.
func (l *Lab) forget(g *Guest) {
	l.mu.Lock()
	if l.guests[g.ip] == g {
		delete(l.guests, g.ip)
	}
	l.mu.Unlock()
}

// waitReady polls until the agent answers and (if rxe) rxe0 is ACTIVE.
func (g *Guest) waitReady(ctx context.Context, rxe bool) error {
	// Watching the console for the agent's first line avoids dialling an
	// address nobody answers ARP for yet (each such dial hangs).
	marker := []byte("rxego-agent: ")
	for {
		select {
		case <-g.exited:
			return fmt.Errorf("qemu exited during boot: %v", g.waitErr)
		default:
		}
		if data, _ := os.ReadFile(g.console); bytes.Contains(data, marker) {
			break
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("agent did not start: %w", err)
		}
	}
	var last error
	for {
		select {
		case <-g.exited:
			return fmt.Errorf("qemu exited during boot: %v", g.waitErr)
		default:
		}
		last = g.readyOnce(ctx, rxe)
		if last == nil {
			return nil
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("not ready: %v (%w)", last, err)
		}
	}
}

func (g *Guest) readyOnce(ctx context.Context, rxe bool) error {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := g.call(cctx, &agentproto.Request{Op: agentproto.OpPing})
	if err != nil {
		return err
	}
	if resp.Release != g.kernel.Release {
		return fmt.Errorf("guest runs %q, want %q", resp.Release, g.kernel.Release)
	}
	if !rxe {
		return nil
	}
	resp, err = g.call(cctx, &agentproto.Request{Op: agentproto.OpRead, Path: rxePort + "/state"})
	if err != nil {
		return err
	}
	if !bytes.Contains(resp.Data, []byte("ACTIVE")) {
		return fmt.Errorf("rxe0 port state %q", strings.TrimSpace(string(resp.Data)))
	}
	return nil
}

// rxePort is rxe0's port 1 in the guest's sysfs.
const rxePort = "/sys/class/infiniband/rxe0/ports/1"

// Close kills the guest and removes its tap. The lab's Close does this for
// every guest still running.
func (g *Guest) Close() error {
	g.kill()
	g.lab.forget(g)
	return ipCmd("-n", g.lab.name, "link", "del", g.tap)
}

// Kill stops QEMU (a guest that hangs without exiting), keeping its tap
// and console log; Exited reports true afterwards.
func (g *Guest) Kill() { g.kill() }

// kill stops QEMU and waits (bounded) for it to go.
func (g *Guest) kill() {
	if g.cmd == nil || g.cmd.Process == nil {
		return
	}
	select {
	case <-g.exited:
		return
	default:
	}
	g.cmd.Process.Kill()
	select {
	case <-g.exited:
	case <-time.After(waitTimeout):
	}
}

// Exited reports whether QEMU has ended (crash, panic, power-off).
func (g *Guest) Exited() bool {
	select {
	case <-g.exited:
		return true
	default:
		return false
	}
}

// knownKernel reports whether series is one setup.sh prepares.
func knownKernel(series string) bool { return slices.Contains(Kernels, series) }

// Guests returns the lab's running guests, ordered by address.
func (l *Lab) Guests() []*Guest {
	l.mu.Lock()
	defer l.mu.Unlock()
	gs := make([]*Guest, 0, len(l.guests))
	for _, g := range l.guests {
		gs = append(gs, g)
	}
	slices.SortFunc(gs, func(a, b *Guest) int { return a.ip.Compare(b.ip) })
	return gs
}
