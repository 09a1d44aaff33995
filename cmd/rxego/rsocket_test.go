package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// rsocketPair runs server (args after the command name, -b and -p added)
// and client (likewise, the server's address given by serverFlag) as two
// rxego processes on loopback addresses; the client is retried while
// the server is not listening yet. It returns both outputs.
func rsocketPair(t *testing.T, tool string, server, client func(srv, cli, port string) []string) (srvOut, cliOut string) {
	t.Helper()
	srv, cli := testaddr.Loopback().String(), testaddr.Loopback().String()
	port := strconv.Itoa(17000 + int(time.Now().UnixNano()%1000))
	type result struct {
		out  string
		code int
	}
	done := make(chan result, 1)
	go func() {
		out, errOut, code := rxegoCmd(t, append([]string{tool}, server(srv, cli, port)...)...)
		done <- result{out + errOut, code}
	}()
	var out, errOut string
	var code int
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		out, errOut, code = rxegoCmd(t, append([]string{tool}, client(srv, cli, port)...)...)
		if code == 0 || !strings.Contains(errOut, "refused") {
			break
		}
	}
	s := <-done
	if code != 0 || s.code != 0 {
		t.Fatalf("client: exit %d\n%s%s\nserver: exit %d\n%s", code, out, errOut, s.code, s.out)
	}
	return s.out, out + errOut
}

// rstreamRow is a row of rstream's table.
var rstreamRow = regexp.MustCompile(`(?m)^(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+[\d.]+s\s+[\d.]+\s+[\d.]+$`)

// TestRstreamCLI runs rxego rstream against itself with the options the
// conformance lab uses against rstream: verification, 4 KiB buffers,
// keepalive, a custom test.
func TestRstreamCLI(t *testing.T) {
	srvOut, cliOut := rsocketPair(t, "rstream",
		func(srv, _, port string) []string {
			return []string{"-b", srv, "-p", port, "-T", "v", "-B", "4096", "-k", "1", "-S", "10000", "-C", "50", "-timeout", "60s"}
		},
		func(srv, cli, port string) []string {
			return []string{"-s", srv, "-b", cli, "-p", port, "-T", "verify", "-B", "4096", "-k", "1", "-S", "10000", "-C", "50", "-timeout", "60s", "--stats"}
		})
	// The client's --stats carries the rsocket counter the lab's packet
	// balance reads (conformance's rsocketAfterShutdown).
	if !regexp.MustCompile(`(?m)^` + statsPrefix + `\{.*"rsocket_after_shutdown":\d+`).MatchString(cliOut) {
		t.Errorf("client --stats: no rsocket_after_shutdown counter:\n%s", cliOut)
	}
	for name, out := range map[string]string{"server": srvOut, "client": cliOut} {
		m := rstreamRow.FindStringSubmatch(out)
		if m == nil || m[1] != "custom" || m[2] != "9.7k" || m[3] != "50" || m[4] != "1" || m[5] != "976k" {
			t.Errorf("%s: no row custom 9.7k 50 1 976k:\n%s", name, out)
		}
		if !strings.Contains(out, "Keepalive: ON\n  time: 1\n") || !strings.Contains(out, "name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer") {
			t.Errorf("%s: want the keepalive lines and rstream's header:\n%s", name, out)
		}
	}
}

// TestRcopyCLI copies a file with rxego rcopy to rxego rcopy and compares
// the bytes and the mode.
func TestRcopyCLI(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	data := bytes.Repeat([]byte("rcopy over rsocket, every byte checked. "), 50_000)
	if err := os.WriteFile(src, data, 0o640); err != nil {
		t.Fatal(err)
	}
	srvOut, cliOut := rsocketPair(t, "rcopy",
		func(srv, _, port string) []string {
			return []string{"-b", srv, "-p", port, "-n", "1", "-timeout", "60s"}
		},
		func(srv, cli, port string) []string {
			return []string{src, srv + ":" + dst, "-b", cli, "-p", port, "-timeout", "60s"}
		})
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("copy: %d bytes, %v; want %d", len(got), err, len(data))
	}
	if st, err := os.Stat(dst); err != nil || st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, %v; want 0640", st.Mode(), err)
	}
	if !strings.Contains(cliOut, "opening...transferring...closing...done\n"+strconv.Itoa(len(data))+" bytes in ") {
		t.Errorf("client output:\n%s", cliOut)
	}
	if !strings.Contains(srvOut, "opening: "+dst+", transferring..."+strconv.Itoa(len(data))+" bytes...closing...done") {
		t.Errorf("server output:\n%s", srvOut)
	}
}

// TestRiostreamCLI runs rxego riostream against itself, verified. The
// receiver watches its buffer for the peer's RDMA WRITEs, which the race
// detector reports by design, so this runs only without it.
func TestRiostreamCLI(t *testing.T) {
	if raceEnabled {
		t.Skip("direct placement's receiver polls memory the engine writes: a race by design")
	}
	srvOut, cliOut := rsocketPair(t, "riostream",
		func(srv, _, port string) []string {
			return []string{"-b", srv, "-p", port, "-T", "v", "-S", "20000", "-C", "10", "-I", "20", "-timeout", "60s"}
		},
		func(srv, cli, port string) []string {
			return []string{"-s", srv, "-b", cli, "-p", port, "-T", "v", "-S", "20000", "-C", "10", "-I", "20", "-timeout", "60s"}
		})
	for name, out := range map[string]string{"server": srvOut, "client": cliOut} {
		m := rstreamRow.FindStringSubmatch(out)
		if m == nil || m[1] != "custom" || m[2] != "19k" || m[3] != "10" || m[4] != "20" || m[5] != "7.6m" {
			t.Errorf("%s: no row custom 19k 10 20 7.6m:\n%s", name, out)
		}
	}
}

// TestRstreamTCP: -T s runs the same tests over TCP sockets.
func TestRstreamTCP(t *testing.T) {
	srvOut, cliOut := rsocketPair(t, "rstream",
		func(srv, _, port string) []string {
			return []string{"-b", srv, "-p", port, "-T", "s", "-T", "v", "-S", "3000", "-C", "100", "-timeout", "60s"}
		},
		func(srv, _, port string) []string {
			return []string{"-s", srv, "-p", port, "-T", "socket", "-T", "v", "-S", "3000", "-C", "100", "-timeout", "60s"}
		})
	for name, out := range map[string]string{"server": srvOut, "client": cliOut} {
		m := rstreamRow.FindStringSubmatch(out)
		if m == nil || m[1] != "custom" || m[2] != "2.9k" || m[3] != "100" {
			t.Errorf("%s: no row custom 2.9k 100:\n%s", name, out)
		}
	}
}
