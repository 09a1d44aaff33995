package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// TestMain lets the test binary stand in for rxego: run with
// RXEGO_CLI_MAIN=1 it is the command itself, so the tests below see the
// real exit codes and the split between stdout and stderr.
func TestMain(m *testing.M) {
	if os.Getenv("RXEGO_CLI_MAIN") == "1" {
		os.Args = append([]string{"rxego"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// rxegoCmd runs the command line args and returns its stdout, stderr and
// exit code.
func rxegoCmd(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return rxegoIn(t, "", args...)
}

// rxegoIn runs the command line args in the network namespace named ns
// (ip netns exec), or in the test's own for "".
func rxegoIn(t *testing.T, ns string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if ns != "" {
		args, exe = append([]string{"netns", "exec", ns, exe}, args...), "ip"
	}
	c := exec.CommandContext(ctx, exe, args...)
	c.Env = append(os.Environ(), "RXEGO_CLI_MAIN=1")
	var o, e bytes.Buffer
	c.Stdout, c.Stderr = &o, &e
	err = c.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return o.String(), e.String(), c.ProcessState.ExitCode()
}

// TestHelp: -h, --help and `rxego help CMD` print the command's usage with
// its flags on stdout and exit 0, for every command.
func TestHelp(t *testing.T) {
	for name := range commands {
		if name == "help" {
			continue
		}
		for _, args := range [][]string{{name, "-h"}, {name, "--help"}, {"help", name}} {
			out, errOut, code := rxegoCmd(t, args...)
			if code != 0 || errOut != "" || !strings.Contains(out, "usage: rxego "+name) {
				t.Errorf("%q: exit %d, stderr %q, stdout:\n%s", args, code, errOut, out)
			}
			if name != "version" && !strings.Contains(out, "\n  -") {
				t.Errorf("%q: no flags listed:\n%s", args, out)
			}
		}
	}
	out, _, code := rxegoCmd(t, "perf", "-h")
	for _, want := range []string{"-s, --size int", "--report_gbits", "-D, --duration int", "-b, --bidirectional"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("perf -h: exit %d, no %q:\n%s", code, want, out)
		}
	}
	if out, _, code := rxegoCmd(t, "--help"); code != 0 || !strings.Contains(out, "pingpong") {
		t.Errorf("--help: exit %d:\n%s", code, out)
	}
}

// TestUsageErrors: a command line rxego cannot use gets one line saying
// why and one hint, on stderr, and exit 2; nothing runs.
func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"pingpong", "--bogus"}, "flag provided but not defined: --bogus"},
		{[]string{"pingpong", "-bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"ibv_ud_pingpong", "-m", "1024"}, "flag provided but not defined: -m"}, // ud_pingpong has no -m
		{[]string{"ibv_rc_pingpong", "-R"}, "flag provided but not defined: -R"},
		{[]string{"ibv_srq_pingpong", "-g", "127.0.0.1", "-q", "0"}, "-q 0: must be at least 1"},
		{[]string{"ib_send_lat", "-b"}, "are for the BW tests"},
		{[]string{"ib_write_bw", "-x", "1"}, "-x 1: a GID index needs -d INTERFACE"},
		{[]string{"perf", "write_bw", "-x", "1"}, "-x 1: a GID index needs -d INTERFACE"},
		{[]string{"pingpong", "-g", "127.0.0.1", "--metrics-addr", "nonsense"}, `--metrics-addr "nonsense": want HOST:PORT`},
		{[]string{"perf", "write_bw", "--metrics-addr", "127.0.0.1:http"}, `--metrics-addr "127.0.0.1:http": want HOST:PORT`},
		{[]string{"pingpong", "-g", "127.0.0.1", "-s", "99999999999"}, "message size (-s) 99999999999: want 1 to"},
		{[]string{"pingpong", "-g", "127.0.0.1", "-s", "4194304"}, "one slot per receive"},
		{[]string{"pingpong", "-g", "127.0.0.1", "-n", "0"}, "-n 0: must be at least 1"},
		{[]string{"pingpong", "-g", "127.0.0.1", "--rx-depth", "0"}, "--rx-depth 0: must be at least 1"},
		{[]string{"pingpong", "-g", "127.0.0.1", "-r", "100000"}, "rx depth (-r) 100000"},
		{[]string{"pingpong", "-g", "127.0.0.1", "-p", "70000"}, "-p 70000"},
		{[]string{"pingpong", "-t", "ud", "-g", "127.0.0.1", "-s", "2048"}, "UD message size 2048 exceeds the MTU 1024"},
		{[]string{"pingpong", "-g", "1"}, "-g 1: a GID index needs -d INTERFACE"},
		{[]string{"pingpong", "-g", "7", "-d", "lo"}, "-g 7: no such GID index on lo (its table, as rxe's: 0 fe80::200:ff:fe00:0%lo, 1 127.0.0.1"},
		{[]string{"pingpong", "-g", "1", "-d", "rxego-none0"}, "-g 1 -d rxego-none0: rxego: interface"},
		{[]string{"pingpong", "-g", "nonsense"}, "neither an address nor a GID index"},
		{[]string{"perf", "write_bw", "-x", "9", "-d", "lo"}, "-x 9: no such GID index on lo"},
		{[]string{"perf", "write_bw", "-n", "0"}, "-n 0: must be at least 1"},
		{[]string{"perf", "write_bw", "-s", "99999999999"}, "size 99999999999: want 1 to 8388608"},
		{[]string{"perf", "write_bw", "-D", "5", "-e"}, "duration mode doesn't work with events"},
		{[]string{"perf", "send_lat", "-b"}, "are for the BW tests"},
		{[]string{"perf", "-s", "64"}, "name the test first"},
		{[]string{"perf", "nope_bw"}, "unknown test"},
		{[]string{"perf", "write_bw", "-T", "104"}, "-T 104: the TOS is for rdma_cm QPs (-R)"},
		{[]string{"perf", "write_bw", "-R", "--tclass", "104", "--addr", "127.0.0.1"}, "--tclass 104: with -R give the TOS with -T"},
		{[]string{"perf", "write_bw", "--tclass", "256"}, "--tclass 256: want 0 to 255"},
		{[]string{"rping", "-a", "127.0.0.1"}, "give exactly one of -s and -c"},
		{[]string{"rping", "-c", "-a", "127.0.0.1", "-S", "100000"}, "-S 100000: want 23 to 65535"},
		{[]string{"rping", "-c", "-a", "127.0.0.1", "-C", "-1"}, "-C -1: want 0 to"},
		{[]string{"rping", "-c", "-a", "127.0.0.1", "-S", "22"}, "-S 22: want 23 to 65535"},
		{[]string{"ucmatose", "-b", "127.0.0.1", "-C", "99999"}, "count 99999"},
		{[]string{"ucmatose", "-c", "0"}, "-c 0: must be at least 1"},
		{[]string{"mckey", "-s"}, "needs a multicast address: -m"},
		{[]string{"mckey", "-m", "198.18.0.9"}, "not an IP multicast group"},
		{[]string{"mckey", "-m", "239.1.2.3", "-o"}, "send-only join (-o) receives nothing"},
		{[]string{"mckey", "-m", "239.1.2.3", "-p", "0x2"}, "only the UDP port space (0x111)"},
		{[]string{"mckey", "-M", "ff0e::1"}, "requires binding to source address (-b)"},
		{[]string{"mckey", "-m", "239.1.2.3", "-C", "0"}, "-C 0: must be at least 1"},
		{[]string{"demo", "nosuch"}, "unknown scenario"},
		{[]string{"trace", "--nope", "x"}, "flag provided but not defined"},
		{[]string{"version", "extra"}, "no arguments"},
	} {
		out, errOut, code := rxegoCmd(t, c.args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		cmd := c.args[0]
		if code != 2 || out != "" || len(lines) != 2 || !strings.Contains(lines[0], c.want) ||
			!strings.HasPrefix(lines[0], "rxego "+cmd+": ") || lines[1] != "try 'rxego "+cmd+" -h'" {
			t.Errorf("%q: exit %d, stdout %q, stderr:\n%s", c.args, code, out, errOut)
		}
	}
	if _, errOut, code := rxegoCmd(t, "nosuch"); code != 2 || !strings.Contains(errOut, "unknown command") {
		t.Errorf("unknown command: exit %d: %s", code, errOut)
	}
	// help's own error points at the list of commands, not at help's flags.
	if _, errOut, code := rxegoCmd(t, "help", "foo"); code != 2 ||
		errOut != "rxego help: unknown command \"foo\"\ntry 'rxego help' for the list of commands\n" {
		t.Errorf("help foo: exit %d: %q", code, errOut)
	}
}

// TestHelpListsCTools: `rxego help` names every C tool command, and each
// command's -h shows its long options with two dashes.
func TestHelpListsCTools(t *testing.T) {
	out, _, code := rxegoCmd(t, "help")
	for _, name := range []string{"ibv_rc_pingpong", "ibv_uc_pingpong", "ibv_ud_pingpong", "ibv_srq_pingpong",
		"ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_atomic_bw", "ib_write_lat", "ib_read_lat", "ib_send_lat",
		"ib_atomic_lat", "rping", "ucmatose", "udaddy", "mckey"} {
		if code != 0 || !strings.Contains(out, " "+name) {
			t.Errorf("help: exit %d, no %s:\n%s", code, name, out)
		}
	}
	for name := range commands {
		out, _, _ := rxegoCmd(t, name, "-h")
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(line, "  -") && !strings.HasPrefix(f[0], "--") &&
				len(strings.TrimSuffix(f[0], ",")) > 2 {
				t.Errorf("%s -h: a long flag with one dash: %q", name, line)
			}
		}
	}
}

// TestCToolCommandLines: a C tool's command line runs as it is with
// "rxego " in front: ibv_rc_pingpong's -t is --ts (rxego pingpong's -t
// picks the tool and would swallow -g), and the server runs as
// ibv_rc_pingpong too.
func TestCToolCommandLines(t *testing.T) {
	srv, cli := testaddr.Loopback(), testaddr.Loopback()
	port := refusedPort(t)
	done := make(chan string, 1)
	go func() {
		out, errOut, code := rxegoCmd(t, "ibv_rc_pingpong", "-g", srv.String(), "-p", port, "-n", "20", "-c")
		done <- strconv.Itoa(code) + errOut + out
	}()
	var out, errOut string
	var code int
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		out, errOut, code = rxegoCmd(t, "ibv_rc_pingpong", "-t", "-g", cli.String(), "-p", port, "-n", "20", "-c", srv.String())
		if !strings.Contains(errOut, "connection refused") {
			break
		}
	}
	if code != 0 || !strings.Contains(out, "verify: 20 of 20") || !strings.Contains(errOut, "--ts: rxego's completions carry no timestamps") {
		t.Errorf("client: exit %d\n%s%s", code, out, errOut)
	}
	if s := <-done; !strings.HasPrefix(s, "0") || !strings.Contains(s, "verify: 20 of 20") {
		t.Errorf("server: %s", s)
	}
}

// TestMetricsAddrBusy: a --metrics-addr port another program holds gets a
// hint that names --metrics-addr (not -p, the exchange's port).
func TestMetricsAddrBusy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, errOut, code := rxegoCmd(t, "pingpong", "-g", testaddr.Loopback().String(), "--metrics-addr", ln.Addr().String(),
		"-p", refusedPort(t), "127.0.0.1")
	if code != 1 || !strings.Contains(errOut, "address already in use") ||
		!strings.Contains(errOut, "hint: another program listens on this TCP port; give --metrics-addr another port") {
		t.Errorf("exit %d: %s", code, errOut)
	}
}

// TestVersion prints the module's version line.
func TestVersion(t *testing.T) {
	out, _, code := rxegoCmd(t, "version")
	if code != 0 || !strings.HasPrefix(out, "rxego ") || !strings.Contains(out, " go1.") {
		t.Errorf("exit %d: %q", code, out)
	}
}

// TestRegisterTwicePanics checks that a command name claimed twice stops
// the program at start-up with the name, and that the command registered
// first stays in place.
func TestRegisterTwicePanics(t *testing.T) {
	before := commands["version"]
	for _, reg := range []func(string, string, func([]string) error){register, registerCTool} {
		func() {
			defer func() {
				r := recover()
				if msg, _ := r.(string); !strings.Contains(msg, `"version"`) {
					t.Errorf("registering version twice: recovered %v, want a panic naming it", r)
				}
			}()
			reg("version", "a second version", func([]string) error { return nil })
		}()
	}
	if got := commands["version"]; got.summary != before.summary || got.cTool != before.cTool {
		t.Errorf("version's command after the panics: %+v, want the first one", got)
	}
}

// TestExpandShort checks the getopt spellings against Go's flag forms.
func TestExpandShort(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Bool("v", false, "")
	fs.Bool("V", false, "")
	fs.Int("C", 0, "")
	fs.String("a", "", "")
	fs.Duration("timeout", 0, "")
	alias(fs, "C", "count")
	for _, c := range []struct{ in, want []string }{
		{[]string{"-vV"}, []string{"-v", "-V"}},
		{[]string{"-vC10"}, []string{"-v", "-C=10"}},
		{[]string{"-vC", "10"}, []string{"-v", "-C", "10"}},
		{[]string{"-C", "-1"}, []string{"-C", "-1"}},
		{[]string{"-timeout", "3s", "-a1.2.3.4"}, []string{"-timeout", "3s", "-a=1.2.3.4"}},
		{[]string{"--count", "5", "x", "--", "-vV"}, []string{"--count", "5", "x", "--", "-vV"}},
		{[]string{"-vX"}, []string{"-vX"}}, // X is no flag: flag.Parse reports it
	} {
		if got := expandShort(fs, c.in); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q: %q, want %q", c.in, got, c.want)
		}
	}
	ops, err := parseArgs(fs, []string{"a1", "-vV", "--count=3", "a2", "--", "-v"})
	if err != nil || !reflect.DeepEqual(ops, []string{"a1", "a2", "-v"}) || fs.Lookup("C").Value.String() != "3" {
		t.Errorf("operands %q, err %v, C %v", ops, err, fs.Lookup("C").Value)
	}
	if err := positive(fs, "C"); err != nil {
		t.Errorf("positive: %v", err)
	}
	fs.Set("count", "0")
	if err := positive(fs, "C"); err == nil || !strings.Contains(err.Error(), "--count 0") {
		t.Errorf("positive(--count 0): %v", err)
	}
}

// refusedPort returns a loopback TCP port nobody listens on.
func refusedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return strconv.Itoa(port)
}

// TestClientRefused: a pingpong, perf or rping client whose server is not
// there says "couldn't connect ... connection refused" and exits 1, with
// a long -timeout it would otherwise have spent retrying.
func TestClientRefused(t *testing.T) {
	port := refusedPort(t)
	local := testaddr.Loopback().String()
	for _, args := range [][]string{
		{"pingpong", "-g", local, "-p", port, "-timeout", "60s", "127.0.0.1"},
		{"perf", "write_bw", "-p", port, "-timeout", "60s", "127.0.0.1"},
	} {
		_, errOut, code := rxegoCmd(t, args...)
		if code != 1 || !strings.Contains(errOut, "couldn't connect to 127.0.0.1:"+port) || !strings.Contains(errOut, "connection refused") {
			t.Errorf("%q: exit %d: %s", args, code, errOut)
		}
	}
	// rdma_cm: a device with a connection manager but no listener answers
	// the REQ with a REJ (reason 8), as the Linux CM does.
	dev := testaddr.Open(t, nil)
	m, err := cm.New(dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	srv := dev.Addr().Addr().String()
	_, errOut, code := rxegoCmd(t, "rping", "-c", "-vV", "-a", srv, "-I", testaddr.Loopback().String(), "-C", "1", "-timeout", "60s")
	if code != 1 || !strings.Contains(errOut, "couldn't connect to "+srv+":7174: connection refused") {
		t.Errorf("rping: exit %d: %s", code, errOut)
	}
}

// TestAddressInUse: a second process on the same address gets the hint.
func TestAddressInUse(t *testing.T) {
	dev := testaddr.Open(t, nil)
	_, errOut, code := rxegoCmd(t, "pingpong", "-g", dev.Addr().Addr().String(), "-p", refusedPort(t), "127.0.0.1")
	if code != 1 || !strings.Contains(errOut, "address already in use") || !strings.Contains(errOut, "hint: another rxego, or the kernel's rdma_rxe") {
		t.Errorf("exit %d: %s", code, errOut)
	}
}

// TestPingpongLongOptions runs a UD pingpong with its default size (the
// 1024-byte MTU: 2 x 20 x 1024 bytes) and the
// C tools' long options and clustered flags, server and client as two
// processes.
func TestPingpongLongOptions(t *testing.T) {
	srv, cli := testaddr.Loopback(), testaddr.Loopback()
	port := refusedPort(t)
	done := make(chan string, 1)
	go func() {
		out, errOut, code := rxegoCmd(t, "pingpong", "-t", "ud", "--gid-idx", srv.String(), "--port", port, "--iters=20", "-ce")
		done <- strconv.Itoa(code) + errOut + out
	}()
	var out, errOut string
	var code int
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		out, errOut, code = rxegoCmd(t, "pingpong", "-t", "ud", "-g", cli.String(), "--port", port, "--iters", "20", "-ec", srv.String())
		if !strings.Contains(errOut, "connection refused") { // the server was not listening yet
			break
		}
	}
	if code != 0 || !strings.Contains(out, "40960 bytes in") || !strings.Contains(out, "verify: 20 of 20") {
		t.Errorf("client: exit %d\n%s%s", code, out, errOut)
	}
	if s := <-done; !strings.HasPrefix(s, "0") || !strings.Contains(s, "verify: 20 of 20") {
		t.Errorf("server: %s", s)
	}
}

// TestPingpongGIDIndex: a server given "-g 1 -d lo", as ibv_rc_pingpong
// -d rxe0 -g 1, serves on lo's IPv4 GID (rxe's index 1) and says so; a
// client on another loopback address completes the exchange with it.
// By default the device serves that one address; with --gid-table, lo's
// whole table, where rxe's index 0, a link-local GID lo does not hold,
// cannot be bound and is left out with a line on stderr.
func TestPingpongGIDIndex(t *testing.T) {
	if c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4791}); err != nil {
		t.Skipf("127.0.0.1:4791 is taken: %v", err)
	} else {
		c.Close()
	}
	for _, table := range []bool{false, true} {
		cli := testaddr.Loopback()
		port := refusedPort(t)
		done := make(chan string, 1)
		go func() {
			args := []string{"pingpong", "-d", "lo", "-g", "1", "-p", port, "-n", "20", "-c"}
			if table {
				args = append(args, "--gid-table")
			}
			out, errOut, code := rxegoCmd(t, args...)
			done <- strconv.Itoa(code) + errOut + out
		}()
		var out, errOut string
		var code int
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			out, errOut, code = rxegoCmd(t, "pingpong", "-g", cli.String(), "-p", port, "-n", "20", "-c", "127.0.0.1")
			if !strings.Contains(errOut, "connection refused") { // the server was not listening yet
				break
			}
		}
		if code != 0 || !strings.Contains(out, "verify: 20 of 20") || !strings.Contains(out, "remote address: LID 0x0000, QPN") ||
			!strings.Contains(out, "GID ::ffff:127.0.0.1") {
			t.Errorf("client: exit %d\n%s%s", code, out, errOut)
		}
		s := <-done
		if !strings.HasPrefix(s, "0") || !strings.Contains(s, "GID ::ffff:127.0.0.1") || !strings.Contains(s, "verify: 20 of 20") {
			t.Errorf("server (--gid-table %v): %s", table, s)
		}
		// lo holds no link-local address: with the whole table, rxe's
		// index 0 is left out, and the server says where index 1 went;
		// serving index 1 alone, it says nothing of the others.
		tableLines := strings.Contains(s, "-d lo: GID index 0 (fe80::200:ff:fe00:0%lo) not served: bind: cannot assign requested address") &&
			strings.Contains(s, "-d lo: rxe's GID index 1 is this device's index 0")
		if tableLines != table || !table && strings.Contains(s, "not served") {
			t.Errorf("server (--gid-table %v): %s", table, s)
		}
	}
}

// TestRpingServerEveryAddress: rping -s without -a listens on every
// address (here two loopback addresses stand for the host's) and serves
// the client that comes to either.
func TestRpingServerEveryAddress(t *testing.T) {
	a, b := testaddr.Loopback(), testaddr.Loopback()
	listenAddrs = func() ([]netip.Addr, error) { return []netip.Addr{a, b}, nil }
	defer func() { listenAddrs = localAddrs }()
	errc := make(chan error, 1)
	port := strconv.Itoa(7000 + int(time.Now().UnixNano()%1000))
	go func() { errc <- runRping([]string{"-s", "-p", port, "-timeout", "20s"}) }()
	var err error
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		_, errOut, code := rxegoCmd(t, "rping", "-c", "-a", b.String(), "-I", testaddr.Loopback().String(), "-p", port, "-C", "3", "-V")
		if err = nil; code != 0 {
			err = errors.New(errOut)
		}
		if err == nil || !strings.Contains(err.Error(), "refused") {
			break
		}
	}
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("server: %v", err)
	}
}

// TestDemoFlagsAfterScenario: flags may follow the scenario names.
func TestDemoFlagsAfterScenario(t *testing.T) {
	var out bytes.Buffer
	addrs := testaddr.Loopback().String() + "," + testaddr.Loopback().String()
	if err := demoTo(&out, []string{"write", "--no-capture", "--addrs", addrs}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "Bob") {
		t.Errorf("no tour:\n%s", out.String())
	}
}

// TestExitCode checks the mapping from errors to status and messages.
func TestExitCode(t *testing.T) {
	var w bytes.Buffer
	if exitCode(&w, "x", nil) != 0 || exitCode(&w, "x", errHelp) != 0 || w.Len() != 0 {
		t.Errorf("nil or help: %q", w.String())
	}
	if exitCode(&w, "pingpong", errors.New("pingpong: rxego: boom")) != 1 || w.String() != "rxego pingpong: boom\n" {
		t.Errorf("runtime error: %q", w.String())
	}
	w.Reset()
	if exitCode(&w, "perf", usageErrorf("perftest: bad")) != 2 || w.String() != "rxego perf: bad\ntry 'rxego perf -h'\n" {
		t.Errorf("usage error: %q", w.String())
	}
}

// TestTimeoutSays: a server nobody comes to says that it waited for a
// client and which timeout ran out.
func TestTimeoutSays(t *testing.T) {
	port := refusedPort(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"pingpong", "-g", testaddr.Loopback().String(), "-p", port, "-timeout", "300ms"},
			"no client connected on port " + port + " within the 300ms timeout"},
		{[]string{"perf", "write_bw", "-p", port, "-timeout", "300ms"},
			"no client connected on port " + port + " within the 300ms timeout"},
	} {
		_, errOut, code := rxegoCmd(t, c.args...)
		if code != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d: %s", c.args, code, errOut)
		}
	}
}

// TestMckeyAnyLoopback: mckey binds to any 127.x address, as every other
// command does (the kernel routes them all to lo), not only to one an
// interface holds: a receiver and a sender on two such addresses
// exchange the datagrams.
func TestMckeyAnyLoopback(t *testing.T) {
	rcv, snd := testaddr.Loopback(), testaddr.Loopback()
	group := netip.AddrFrom4([4]byte{239, 1, byte(rand.IntN(256)), byte(1 + rand.IntN(254))}).String()
	done := make(chan string, 1)
	go func() {
		out, errOut, code := rxegoCmd(t, "mckey", "-m", group, "-b", rcv.String(), "-C", "3", "--pause", "2s", "-timeout", "20s")
		done <- strconv.Itoa(code) + errOut + out
	}()
	time.Sleep(time.Second) // the receiver joins within its 2 s pause
	out, errOut, code := rxegoCmd(t, "mckey", "-m", group, "-b", snd.String(), "-s", "-C", "3", "--pause", "2s", "-timeout", "20s")
	if code != 0 || !strings.Contains(out, "rxego mckey: 1 connection, 3 sent") { // singular for one
		t.Errorf("sender: exit %d\n%s%s", code, out, errOut)
	}
	if s := <-done; !strings.HasPrefix(s, "0") || !strings.Contains(s, "3 received, 3 verified") {
		t.Errorf("receiver: %s", s)
	}
}

// TestRpingNobodyThere: a client toward a loopback address where no RoCE
// device listens (nothing holds UDP port 4791 there) fails at once as
// refused, for rping and the exchange tools alike; toward a device with no
// rdma_cm, whose REQs go unanswered, it says on stderr that the REQ is
// being resent while it waits, and which -timeout ended it.
func TestRpingNobodyThere(t *testing.T) {
	nobody := testaddr.Loopback().String()
	for _, args := range [][]string{
		{"rping", "-c", "-a", nobody, "-timeout", "60s"},
		{"udaddy", "-s", nobody, "-timeout", "60s"},
		{"ucmatose", "-s", nobody, "-timeout", "60s"},
	} {
		_, errOut, code := rxegoCmd(t, args...)
		if code != 1 || !strings.Contains(errOut, "connection refused (no RoCE device on "+nobody+": nothing holds UDP port 4791 there)") {
			t.Errorf("%q: exit %d: %s", args, code, errOut)
		}
	}
	dev := testaddr.Open(t, nil) // a device without a connection manager: no REJ, no REP
	_, errOut, code := rxegoCmd(t, "rping", "-c", "-a", dev.Addr().Addr().String(), "-I", testaddr.Loopback().String(), "-timeout", "6s")
	if code != 1 || !strings.Contains(errOut, "connection request (CM REQ) resent, 1 of 15 retries") ||
		!strings.Contains(errOut, "within the -timeout of 6s") {
		t.Errorf("exit %d: %s", code, errOut)
	}
}

// TestUdaddyServerSays: udaddy's server, which cannot verify content
// (udaddy sends unset memory), says what it checked, and the client
// verifies every echoed datagram.
func TestUdaddyServerSays(t *testing.T) {
	srv := testaddr.Loopback().String()
	done := make(chan string, 1)
	go func() {
		out, errOut, code := rxegoCmd(t, "udaddy", "-b", srv, "-C", "4", "-timeout", "20s")
		done <- strconv.Itoa(code) + errOut + out
	}()
	var out, errOut string
	var code int
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		out, errOut, code = rxegoCmd(t, "udaddy", "-s", srv, "-b", testaddr.Loopback().String(), "-C", "4", "-timeout", "20s")
		if !strings.Contains(errOut, "refused") {
			break
		}
	}
	if code != 0 || !strings.Contains(out, "4 received, 4 verified\n") {
		t.Errorf("client: exit %d\n%s%s", code, out, errOut)
	}
	s := <-done
	if !strings.HasPrefix(s, "0") || !strings.Contains(s, "4 received, 0 verified (nothing failed: the server checks each datagram's length") {
		t.Errorf("server: %s", s)
	}
}
