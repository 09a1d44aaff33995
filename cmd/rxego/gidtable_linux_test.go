package main

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/capfile"
	"github.com/rxego/rxego/internal/testenv/netns"
)

// gidNet makes a network namespace with two veth pairs: d0, the server's,
// with two IPv4 and two IPv6 (ULA) addresses besides its link-local one,
// and d1, the client's, with one of each (the peers d0p and d1p hold
// none). It returns the namespace's name once d0's link-local address
// has passed duplicate address detection.
func gidNet(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (a network namespace)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2")
	}
	ns := fmt.Sprintf("rxgid%d", os.Getpid()%100000)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	for _, args := range []string{
		"netns add " + ns,
		"-n " + ns + " link set lo up",
		"-n " + ns + " link add d0 type veth peer name d0p",
		"-n " + ns + " link add d1 type veth peer name d1p",
		"-n " + ns + " addr add 198.18.0.1/24 dev d0",
		"-n " + ns + " addr add 198.18.0.3/24 dev d0",
		"-n " + ns + " addr add fd5e::1/64 dev d0 nodad",
		"-n " + ns + " addr add fd5e::3/64 dev d0 nodad",
		"-n " + ns + " addr add 198.18.1.1/24 dev d1",
		"-n " + ns + " addr add fd5e:1::1/64 dev d1 nodad",
		"-n " + ns + " link set d0p up",
		"-n " + ns + " link set d1p up",
		"-n " + ns + " link set d0 up",
		"-n " + ns + " link set d1 up",
	} {
		if out, err := exec.Command("ip", strings.Fields(args)...).CombinedOutput(); err != nil {
			t.Skipf("ip %s: %v: %s", args, err, out)
		}
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, _ := exec.Command("ip", "-n", ns, "-6", "addr", "show", "dev", "d0", "scope", "link").CombinedOutput()
		if bytes.Contains(out, []byte("fe80")) && !bytes.Contains(out, []byte("tentative")) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("d0 has no usable link-local address: %s", out)
		}
	}
	return ns
}

// TestPingpongGIDTable: "rxego pingpong -d d0 -g N" (and "rxego perf
// write_bw -d d0 -x N") serves d0's whole GID table, in rxe's order
// (rxego.InterfaceGIDs: the link-local GID, the two IPv4 addresses, the
// two IPv6 ones), and sends from entry N: the second IPv4 address (RC,
// perf) and an IPv6 one (UD), neither of them the first of its family,
// which a device sends from when told nothing. The client's capture
// shows every packet of the server's coming from GID N, and pingpong's
// exchange names it.
func TestPingpongGIDTable(t *testing.T) {
	ns := gidNet(t)
	var table []netip.Addr
	f, err := os.Open("/var/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := netns.Do(f, func() (err error) { table, err = rxego.InterfaceGIDs("d0"); return err }); err != nil {
		t.Fatal(err)
	}
	if len(table) != 5 {
		t.Fatalf("d0's GID table %v: want the link-local GID and four addresses", table)
	}
	idx := func(a string) int {
		for i, g := range table {
			if g == netip.MustParseAddr(a) {
				return i
			}
		}
		t.Fatalf("%s is not in d0's table %v", a, table)
		return -1
	}
	for i, tc := range []struct {
		name, gid, client string
		cmd               []string // the command, both sides
		ok                string   // in the client's stdout on success
	}{
		{"rc", "198.18.0.3", "198.18.1.1", []string{"pingpong", "-t", "rc", "-n", "20", "-c", "-s", "1024"}, "verify: 20 of 20"},
		{"ud", "fd5e::3", "fd5e:1::1", []string{"pingpong", "-t", "ud", "-n", "20", "-c", "-s", "1024"}, "verify: 20 of 20"},
		{"perf", "198.18.0.3", "198.18.1.1", []string{"perf", "write_bw", "-n", "20", "-s", "1024"}, " 1024       20 "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := idx(tc.gid)
			port := strconv.Itoa(18600 + i)
			gflag := "-g"
			if tc.cmd[0] == "perf" {
				gflag = "-x"
			}
			done := make(chan [3]string, 1)
			go func() {
				out, errOut, code := rxegoIn(t, ns, append(tc.cmd, "-d", "d0", gflag, strconv.Itoa(n), "--gid-table", "-p", port)...)
				done <- [3]string{strconv.Itoa(code), out, errOut}
			}()
			pcap := t.TempDir() + "/client.pcapng"
			var out, errOut string
			var code int
			for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
				out, errOut, code = rxegoIn(t, ns, append(tc.cmd, gflag, tc.client, "-p", port, "--pcap", pcap, "198.18.0.1")...)
				if !strings.Contains(errOut, "connection refused") && !strings.Contains(errOut, "couldn't connect") { // the server was not listening yet
					break
				}
			}
			want := netip.MustParseAddr(tc.gid)
			wantGID := netip.AddrFrom16(want.As16()).String()
			if code != 0 || !strings.Contains(out, tc.ok) {
				t.Errorf("client: exit %d\n%s%s", code, out, errOut)
			}
			srv := <-done
			var listed []string
			for i, g := range table {
				listed = append(listed, fmt.Sprintf("%d %v", i, g))
			}
			line := "device on d0 serves GIDs " + strings.Join(listed, ", ") + "; source GID index " + strconv.Itoa(n)
			if srv[0] != "0" || !strings.Contains(srv[2], line) {
				t.Errorf("server: exit %s, want stderr to say %q\n%s%s", srv[0], line, srv[1], srv[2])
			}
			if tc.cmd[0] == "pingpong" && (!strings.Contains(out, "remote address: LID 0x0000") || !strings.Contains(out, "GID "+wantGID+"\n") ||
				!strings.Contains(srv[1], "local address:  LID 0x0000") || !strings.Contains(srv[1], "GID "+wantGID+"\n")) {
				t.Errorf("the exchange does not name GID %s:\nclient:\n%s\nserver:\n%s", wantGID, out, srv[1])
			}
			// Every packet the client received came from GID n.
			client := netip.MustParseAddr(tc.client)
			got := map[netip.Addr]int{}
			err := capfile.Each(pcap, func(fr capfile.Frame) error {
				src, dst := ipAddrs(fr.IP)
				if dst == client {
					got[src]++
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[want] == 0 {
				t.Errorf("client received packets from %v; want all from %v", got, want)
			}
		})
	}
}

// ipAddrs returns the source and destination of an IPv4 or IPv6 header.
func ipAddrs(ip []byte) (src, dst netip.Addr) {
	if len(ip) >= 20 && ip[0]>>4 == 4 {
		return netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	}
	if len(ip) >= 40 {
		return netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
	}
	return
}
