package dcqcn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rxego/rxego/internal/testenv/netns"
	"golang.org/x/sys/unix"
)

// nsPrefix starts the name of every namespace this package creates, so a
// leftover from a killed run can be recognised and removed.
const nsPrefix = "rxegodcqcn"

// cmdTimeout bounds every helper command (ip, nft, tcpdump control).
const cmdTimeout = 10 * time.Second

// Netns is a network namespace created by NewNetns.
type Netns struct {
	name string
	f    *os.File // /run/netns/<name>, for setns
}

// NewNetns creates the network namespace nsPrefix+<pid>-<suffix> with its
// loopback up.
func NewNetns(suffix string) (*Netns, error) {
	name := fmt.Sprintf("%s%d-%s", nsPrefix, os.Getpid(), suffix)
	if err := run("ip", "netns", "add", name); err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join("/run/netns", name))
	if err != nil {
		_ = run("ip", "netns", "del", name)
		return nil, err
	}
	n := &Netns{name: name, f: f}
	if err := n.Run("ip", "link", "set", "lo", "up"); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// Name returns the namespace's name, for `ip netns exec`.
func (n *Netns) Name() string { return n.name }

// Close deletes the namespace (and the veth end inside it).
func (n *Netns) Close() error {
	n.f.Close()
	return run("ip", "netns", "del", n.name)
}

// Do runs fn on an OS thread switched into the namespace. Sockets fn
// creates live in the namespace for good, so fn can open rxego devices
// there; goroutines fn starts do not run in it. A thread that cannot be
// switched back is discarded rather than reused.
func (n *Netns) Do(fn func() error) error {
	return netns.Do(n.f, fn)
}

// Command returns name args... to run inside the namespace.
func (n *Netns) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.name, name}, args...)...)
	cmd.WaitDelay = time.Second
	return cmd
}

// Run runs a command inside the namespace and returns its error with its
// output.
func (n *Netns) Run(name string, args ...string) error {
	_, err := n.Output(name, args...)
	return err
}

// Output runs a command inside the namespace and returns its standard
// output.
func (n *Netns) Output(name string, args ...string) ([]byte, error) {
	return output(append([]string{"ip", "netns", "exec", n.name, name}, args...)...)
}

// Veth joins a and b with a veth pair of the given MTU and gives the ends
// the addresses (CIDR) addrA and addrB. The devices disappear with the
// namespaces.
func Veth(a, b *Netns, addrA, addrB string, mtu int) error {
	m := strconv.Itoa(mtu)
	steps := [][]string{
		{"ip", "link", "add", "veth0", "mtu", m, "netns", a.name, "type", "veth", "peer", "name", "veth0", "mtu", m, "netns", b.name},
		{"ip", "-n", a.name, "addr", "add", addrA, "dev", "veth0"},
		{"ip", "-n", b.name, "addr", "add", addrB, "dev", "veth0"},
		{"ip", "-n", a.name, "link", "set", "veth0", "up"},
		{"ip", "-n", b.name, "link", "set", "veth0", "up"},
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			return err
		}
	}
	// Permanent neighbour entries: no ARP, so the first packets are not
	// held (and some dropped) while an address resolves.
	for _, e := range []struct {
		from, to *Netns
		addr     string
	}{{a, b, addrB}, {b, a, addrA}} {
		mac, err := macOf(e.to, "veth0")
		if err != nil {
			return err
		}
		ip, _, _ := strings.Cut(e.addr, "/")
		if err := run("ip", "-n", e.from.name, "neigh", "replace", ip, "lladdr", mac, "dev", "veth0", "nud", "permanent"); err != nil {
			return err
		}
	}
	return nil
}

// macOf returns the MAC address of dev in n.
func macOf(n *Netns, dev string) (string, error) {
	out, err := output("ip", "-n", n.name, "-j", "link", "show", dev)
	if err != nil {
		return "", err
	}
	var links []struct {
		Address string `json:"address"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 || links[0].Address == "" {
		return "", fmt.Errorf("ip link show %s in %s: no address in %q", dev, n.name, out)
	}
	return links[0].Address, nil
}

// Cleanup deletes namespaces left behind by runs of this package whose
// process is gone.
func Cleanup() {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), nsPrefix)
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if unix.Kill(pid, 0) == unix.ESRCH {
			_ = run("ip", "netns", "del", e.Name())
		}
	}
}

func run(argv ...string) error {
	_, err := output(argv...)
	return err
}

func output(argv ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

// errNotRoot is returned by Available when the process cannot create
// namespaces.
var errNotRoot = errors.New("e2e: needs root (network namespaces, nftables, ethtool)")

// Available reports why the end-to-end set-up cannot run here, or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return errNotRoot
	}
	for _, tool := range []string{"ip", "nft", "ethtool"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("e2e: %s not found: %w", tool, err)
		}
	}
	return nil
}
