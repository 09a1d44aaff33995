package rxego_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/netns"
	"github.com/rxego/rxego/qp"
)

var mcastSeq atomic.Int32

// mcastNet makes a network namespace for one test with a veth pair whose
// end mc0 holds 198.18.0.1-3/24 and the route for 239.0.0.0/8: multicast
// sent there loops back to the members joined on mc0 (IP_MULTICAST_LOOP),
// and the copy reaching mc1 is dropped (nothing joined there).
func mcastNet(t *testing.T) *os.File {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (a network namespace)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2")
	}
	ns := fmt.Sprintf("rxmc%d%d", os.Getpid()%100000, mcastSeq.Add(1))
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	for _, args := range []string{
		"netns add " + ns,
		"-n " + ns + " link set lo up",
		"-n " + ns + " link add mc0 type veth peer name mc1",
		"-n " + ns + " link set mc1 up",
		"-n " + ns + " link set mc0 multicast on up",
		"-n " + ns + " addr add 198.18.0.1/24 dev mc0",
		"-n " + ns + " addr add 198.18.0.2/24 dev mc0",
		"-n " + ns + " addr add 198.18.0.3/24 dev mc0",
		"-n " + ns + " route add 239.0.0.0/8 dev mc0",
	} {
		if out, err := exec.Command("ip", strings.Fields(args)...).CombinedOutput(); err != nil {
			t.Skipf("ip %s: %v: %s", args, err, out)
		}
	}
	f, err := os.Open("/var/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// mcRecv posts n receives of 1 KiB on s.
func mcRecv(t *testing.T, s *side, n int) {
	t.Helper()
	for i := range n {
		if err := s.qp.PostRecv(rxego.RecvWR{ID: uint64(i), SGL: []rxego.SGE{{Addr: s.mr.IOVA() + uint64(i)*1024, Length: 1024, LKey: s.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
}

// noCompletion fails when cq completes something within d.
func noCompletion(t *testing.T, name string, cq *rxego.CQ, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	wc := make([]rxego.WC, 1)
	if n, _ := cq.PollWait(ctx, wc); n > 0 {
		t.Errorf("%s: unexpected completion %+v", name, wc[0])
	}
}

// TestUDMulticast: three UD QPs on two devices attach to 239.1.2.3 (the
// MGID ::ffff:239.1.2.3); a datagram a third device sends there with QPN
// 0xFFFFFF reaches each of them once, whole, and the sender's own QP
// nothing. After one QP detaches it gets nothing more; the device leaves
// the group with its last QP. Bad attaches are refused.
func TestUDMulticast(t *testing.T) {
	ns := mcastNet(t)
	mgid := netip.MustParseAddr("::ffff:239.1.2.3")
	var a, b1, b2, c *side
	tap := &srcTap{from: map[uint32]map[netip.Addr]int{}} // device b's
	err := netns.Do(ns, func() error {
		devs := make([]*rxego.Device, 3)
		for i := range devs {
			o := &rxego.Options{Shards: 2}
			if i == 1 {
				o.Tap = tap
			}
			d, err := rxego.Open(fmt.Sprintf("198.18.0.%d", i+1), o)
			if err != nil {
				return err
			}
			t.Cleanup(func() { d.Close() })
			devs[i] = d
		}
		a, b1, b2, c = sideOn(t, devs[0], rxego.UD, 8192), sideOn(t, devs[1], rxego.UD, 8192), sideOn(t, devs[1], rxego.UD, 8192), sideOn(t, devs[2], rxego.UD, 8192)
		for _, s := range []*side{a, b1, b2, c} {
			if err := s.qp.ActivateUD(0x3333, 0); err != nil {
				return err
			}
		}
		for _, s := range []*side{b1, b2, c} {
			if err := s.qp.AttachMcast(mgid); err != nil {
				return err
			}
		}
		return b1.qp.AttachMcast(mgid) // again: no change
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*side{a, b1, b2, c} {
		mcRecv(t, s, 4)
	}
	ah, err := a.pd.CreateAH(netip.AddrPortFrom(mgid, 0))
	if err != nil {
		t.Fatal(err)
	}
	send := func(msg string) {
		t.Helper()
		copy(a.buf[4096:], msg)
		if err := a.qp.PostSend(rxego.SendWR{ID: 9, Opcode: rxego.WRSend, Flags: rxego.SendSignaled, AH: ah,
			RemoteQPN: rxego.MulticastQPN, RemoteQKey: 0x3333,
			SGL: []rxego.SGE{{Addr: a.mr.IOVA() + 4096, Length: uint32(len(msg)), LKey: a.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		if wc := wait1(t, a.cq); wc.Status != qp.WCSuccess || wc.ID != 9 {
			t.Fatalf("send completion %+v", wc)
		}
	}
	check := func(name string, s *side, msg string) {
		t.Helper()
		wc := wait1(t, s.cq)
		if wc.Status != qp.WCSuccess || wc.ByteLen != uint32(40+len(msg)) || wc.Src.Addr() != a.dev.Addr().Addr() || wc.QPN != s.qp.Num() {
			t.Fatalf("%s: completion %+v", name, wc)
		}
		s.dev.Sync()
		off := int(wc.ID)*1024 + 40
		if got := s.buf[off : off+len(msg)]; !bytes.Equal(got, []byte(msg)) {
			t.Errorf("%s: received %q, want %q", name, got, msg)
		}
	}
	send("to all three")
	for name, s := range map[string]*side{"b1": b1, "b2": b2, "c": c} {
		check(name, s, "to all three")
	}
	if src := tap.sources(rxego.MulticastQPN); len(src) != 1 || src[0] != a.dev.Addr().Addr() {
		t.Errorf("device b's tap saw multicast from %v, want %v", src, a.dev.Addr().Addr())
	}
	if err := b2.qp.DetachMcast(mgid); err != nil {
		t.Fatal(err)
	}
	send("b2 left")
	check("b1", b1, "b2 left")
	check("c", c, "b2 left")
	for name, s := range map[string]*side{"a (the sender)": a, "b2 (detached)": b2, "b1 (one copy)": b1, "c (one copy)": c} {
		noCompletion(t, name, s.cq, 100*time.Millisecond)
	}
	if err := b2.qp.DetachMcast(mgid); err == nil {
		t.Error("a second detach succeeded")
	}
	if err := b1.qp.DetachMcast(mgid); err != nil { // device b leaves the group
		t.Fatal(err)
	}
	send("c only")
	check("c", c, "c only")
	noCompletion(t, "b1 after leaving", b1.cq, 100*time.Millisecond)

	if err := c.qp.AttachMcast(netip.MustParseAddr("198.18.0.1")); err == nil || !strings.Contains(err.Error(), "not a multicast GID") {
		t.Errorf("attach to a unicast GID: %v", err)
	}
	var rc *side
	if err := netns.Do(ns, func() error { rc = sideOn(t, c.dev, rxego.RC, 64); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := rc.qp.AttachMcast(mgid); err == nil || !strings.Contains(err.Error(), "only UD") {
		t.Errorf("attach an RC QP: %v", err)
	}
	if err := c.qp.AttachMcast(netip.MustParseAddr("ff0e::1")); err == nil || !strings.Contains(err.Error(), "no IPv6 GID") {
		t.Errorf("attach to an IPv6 group on an IPv4-only device: %v", err)
	}
}
