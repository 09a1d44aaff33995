package mckey_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cmd/rxego/internal/exchange"
	"github.com/rxego/rxego/cmd/rxego/internal/mckey"
	"github.com/rxego/rxego/internal/testenv/netns"
)

// wire is a veth pair between two network namespaces made for one test:
// a0 (address A) in the first, b0 (address B) in the second, both with
// multicast on and the first one's multicast route through a0, so that
// datagrams to a group cross the pair as on a real link.
type wire struct {
	nsA, nsB *os.File
	A, B     netip.Addr
}

var seq int

func newWire(t *testing.T, v6 bool) wire {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2")
	}
	seq++
	base := fmt.Sprintf("rxmk%d%d", os.Getpid()%100000, seq)
	a, b := base+"a", base+"b"
	w := wire{A: netip.MustParseAddr("198.18.0.1"), B: netip.MustParseAddr("198.18.0.2")}
	addA, addB, route := "198.18.0.1/24", "198.18.0.2/24", []string{"route", "add", "224.0.0.0/4", "dev", "a0"}
	if v6 {
		// 2001:2::/48 is IPv6's benchmarking range, as 198.18.0.0/15 is
		// IPv4's; nodad makes the addresses usable at once. IPv6 has a
		// multicast route per interface already.
		w.A, w.B = netip.MustParseAddr("2001:2::1"), netip.MustParseAddr("2001:2::2")
		addA, addB, route = "2001:2::1/64", "2001:2::2/64", nil
	}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", a).Run()
		exec.Command("ip", "netns", "del", b).Run()
	})
	steps := [][]string{
		{"netns", "add", a}, {"netns", "add", b},
		{"-n", a, "link", "add", "a0", "type", "veth", "peer", "name", "b0", "netns", b},
		{"-n", a, "link", "set", "a0", "multicast", "on", "up"},
		{"-n", b, "link", "set", "b0", "multicast", "on", "up"},
		{"-n", a, "addr", "add", addA, "dev", "a0", "nodad"},
		{"-n", b, "addr", "add", addB, "dev", "b0", "nodad"},
	}
	if route != nil {
		steps = append(steps, append([]string{"-n", a}, route...))
	}
	for _, args := range steps {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Skipf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	var err error
	if w.nsA, err = os.Open("/var/run/netns/" + a); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.nsA.Close() })
	if w.nsB, err = os.Open("/var/run/netns/" + b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.nsB.Close() })
	return w
}

// side is a device and connection manager in a namespace.
type side struct {
	ns  *os.File
	dev *rxego.Device
	m   *cm.Manager
}

func openSide(t *testing.T, ns *os.File, addr netip.Addr) *side {
	t.Helper()
	s := &side{ns: ns}
	err := netns.Do(ns, func() (err error) {
		if s.dev, err = rxego.Open(netip.AddrPortFrom(addr, rxego.DefaultPort).String(), nil); err != nil {
			return err
		}
		s.m, err = cm.New(s.dev, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.m.Close(); s.dev.Close() })
	return s
}

// lineWriter is an io.Writer that closes ready when a line with want
// passes.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	want  string
	ready chan struct{}
	once  sync.Once
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.ready) })
	}
	return len(p), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestMckeyAcrossWire: two receiving QPs on one device join a group with
// rdma_cm's join; a sender on the other side of a veth pair (another
// namespace) joins send-only and sends 10 datagrams to the group: each
// receiving QP gets all 10, whole and verified. IPv4 (the MGID
// ::ffff:239.1.2.3) and IPv6 (ff0e::1:2, its own MGID).
func TestMckeyAcrossWire(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name, group, mgid := "ipv4", netip.MustParseAddr("239.1.2.3"), netip.MustParseAddr("::ffff:239.1.2.3")
		if v6 {
			name, group, mgid = "ipv6", netip.MustParseAddr("ff0e::1:2"), netip.MustParseAddr("ff0e::1:2")
		}
		t.Run(name, func(t *testing.T) {
			w := newWire(t, v6)
			snd, rcv := openSide(t, w.nsA, w.A), openSide(t, w.nsB, w.B)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			const count, size = 10, 100
			out := &lineWriter{want: "receiving data transfers", ready: make(chan struct{})}
			type result struct {
				res mckey.Result
				err error
			}
			done := make(chan result, 1)
			go func() {
				var r result
				r.err = netns.Do(rcv.ns, func() (err error) {
					r.res, err = mckey.Run(ctx, rcv.m, mckey.Config{Group: group, Pause: -1,
						Params: exchange.Params{Connections: 2, Count: count, Size: size, Out: out}})
					return err
				})
				done <- r
			}()
			select {
			case <-out.ready:
			case r := <-done:
				t.Fatalf("receiver ended first: %+v %v\n%s", r.res, r.err, out)
			}
			var sres mckey.Result
			err := netns.Do(snd.ns, func() (err error) {
				sres, err = mckey.Run(ctx, snd.m, mckey.Config{Group: group, Sender: true, SendOnly: true, Pause: -1,
					Params: exchange.Params{Count: count, Size: size}})
				return err
			})
			if err != nil || sres != (mckey.Result{Connections: 1, Sent: count}) {
				t.Fatalf("sender: %+v %v", sres, err)
			}
			r := <-done
			if r.err != nil || r.res != (mckey.Result{Connections: 2, Received: 2 * count, Verified: 2 * count}) {
				t.Fatalf("receivers: %+v %v\n%s", r.res, r.err, out)
			}
			if !strings.Contains(out.String(), "mckey: joined dgid: "+mgid.String()+" ") {
				t.Errorf("no join line for MGID %v:\n%s", mgid, out)
			}
			// The group's socket is closed (left), its counters kept.
			if st := rcv.dev.Transport().Stats(); st.RecvPackets != count {
				t.Errorf("receiver's transport counted %d packets received, want %d", st.RecvPackets, count)
			}
			c := rcv.m.Counters()
			if c["cm_mcast_joins"] != 2 || c["cm_mcast_leaves"] != 2 {
				t.Errorf("receiver CM counters: joins %d leaves %d, want 2 and 2", c["cm_mcast_joins"], c["cm_mcast_leaves"])
			}
		})
	}
}

// TestJoinMulticastChecks: bad joins are refused and change nothing; a
// second join of the same QP to a group, and a second leave, fail; a
// manager's Close leaves what it joined.
func TestJoinMulticastChecks(t *testing.T) {
	w := newWire(t, false)
	s := openSide(t, w.nsB, w.B)
	var pd *rxego.PD
	var ud, rc, other *rxego.QP
	err := netns.Do(s.ns, func() (err error) {
		if pd, err = s.dev.AllocPD(); err != nil {
			return err
		}
		cq, err := s.dev.CreateCQ(8)
		if err != nil {
			return err
		}
		caps := rxego.Caps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
		if ud, err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.UD, SendCQ: cq, RecvCQ: cq, Caps: caps}); err != nil {
			return err
		}
		if other, err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.UD, SendCQ: cq, RecvCQ: cq, Caps: caps}); err != nil {
			return err
		}
		if rc, err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq, RecvCQ: cq, Caps: caps}); err != nil {
			return err
		}
		if err := other.ActivateUD(0x1111, 0); err != nil {
			return err
		}
		return ud.ActivateUD(cm.UDPQKey, 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	group := netip.MustParseAddr("239.9.9.9")
	for _, c := range []struct {
		name  string
		q     *rxego.QP
		group netip.Addr
		opts  *cm.JoinOptions
		want  string
	}{
		{"unicast group", ud, netip.MustParseAddr("198.18.0.9"), nil, "not an IP multicast group"},
		{"RC QP", rc, group, nil, "only UD QPs"},
		{"wrong Q_Key", other, group, nil, "Q_Key 0x1111"},
		{"source not a GID", ud, group, &cm.JoinOptions{Source: netip.MustParseAddr("198.18.0.77")}, "none of the device's GIDs"},
		{"no IPv6 GID", ud, netip.MustParseAddr("ff0e::9"), nil, "no IPv6 GID"},
	} {
		var err error
		netns.Do(s.ns, func() error { _, err = s.m.JoinMulticast(pd, c.q, c.group, c.opts); return nil })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	if c := s.m.Counters(); c["cm_mcast_joins"] != 0 {
		t.Errorf("refused joins counted: %d", c["cm_mcast_joins"])
	}
	var ms *cm.Membership
	if err := netns.Do(s.ns, func() (err error) { ms, err = s.m.JoinMulticast(pd, ud, group, nil); return err }); err != nil {
		t.Fatal(err)
	}
	if ms.MGID != netip.MustParseAddr("::ffff:239.9.9.9") || ms.QPN != rxego.MulticastQPN || ms.QKey != cm.UDPQKey {
		t.Errorf("membership %+v", ms)
	}
	if _, err := s.m.JoinMulticast(pd, ud, group, nil); !errors.Is(err, cm.ErrJoined) {
		t.Errorf("second join: %v, want ErrJoined", err)
	}
	// The wrong-Q_Key QP may still join send-only: it receives nothing.
	var so *cm.Membership
	if err := netns.Do(s.ns, func() (err error) {
		so, err = s.m.JoinMulticast(pd, other, group, &cm.JoinOptions{SendOnly: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := ms.Leave(); err != nil {
		t.Fatal(err)
	}
	if err := ms.Leave(); !errors.Is(err, cm.ErrClosed) {
		t.Errorf("second leave: %v, want ErrClosed", err)
	}
	// Leave detached the QP.
	if err := ud.DetachMcast(ms.MGID); err == nil || !strings.Contains(err.Error(), "not attached") {
		t.Errorf("detach after leave: %v, want not attached", err)
	}
	if err := s.m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := so.Leave(); !errors.Is(err, cm.ErrClosed) {
		t.Errorf("leave after the manager closed: %v, want ErrClosed", err)
	}
	if c := s.m.Counters(); c["cm_mcast_joins"] != 2 || c["cm_mcast_leaves"] != 2 {
		t.Errorf("counters: joins %d leaves %d, want 2 and 2", c["cm_mcast_joins"], c["cm_mcast_leaves"])
	}
}
