package transport

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// listenGroupAny opens a group of n Conns on addr at a random free port.
func listenGroupAny(t *testing.T, addr string, opts Options, n int) []Conn {
	t.Helper()
	a := netip.MustParseAddr(addr)
	for range 50 {
		cs, err := ListenGroup(netip.AddrPortFrom(a, uint16(20000+rand.IntN(40000))), opts, n)
		if err == nil {
			t.Cleanup(func() {
				for _, c := range cs {
					c.Close()
				}
			})
			return cs
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatal(err)
		}
	}
	t.Fatal("no free port")
	return nil
}

// TestListenGroupSteers sends packets for QPs 0..63 to a group of four
// Conns, IPv4 and IPv6, and checks each landed on Conn GroupMember(QPN, 4), parsed.
func TestListenGroupSteers(t *testing.T) {
	for _, fam := range []struct{ name, a, b string }{{"v4", "127.0.0.1", "127.0.0.2"}, {"v6", "::1", "::1"}} {
		t.Run(fam.name, func(t *testing.T) {
			const n, qps = 4, 64
			if fam.name == "v6" && !hasIPv6Loopback() {
				t.Skip("no IPv6 loopback")
			}
			src := listenAny(t, fam.a, Options{NoGSO: true})
			group := listenGroupAny(t, fam.b, Options{}, n)
			var msgs []Message
			for q := range qps {
				p := rocePacket(64, uint32(q))
				p[5], p[6], p[7] = byte(q>>16), byte(q>>8), byte(q)
				msgs = append(msgs, Message{Buf: p, Peer: group[0].LocalAddr()})
			}
			if k, err := src.Send(msgs); err != nil || k != qps {
				t.Fatalf("Send = %d, %v", k, err)
			}
			for i, c := range group {
				for _, m := range recvN(t, c, qps/n, 5*time.Second) {
					q := m.Pkt.BTH().DestQP()
					if GroupMember(q, n) != i || psnOf(m.Buf) != q || m.Pkt.Info == nil {
						t.Errorf("Conn %d got a packet for QP %d (PSN %d)", i, q, psnOf(m.Buf))
					}
				}
			}
		})
	}
}

// TestListenGroupExclusive checks a group takes its address as Listen
// does: not where a socket is bound, and no other socket (group or not)
// joins it afterwards.
func TestListenGroupExclusive(t *testing.T) {
	group := listenGroupAny(t, "127.0.0.3", Options{}, 2)
	at := group[0].LocalAddr()
	if _, err := ListenGroup(at, Options{}, 2); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("second group on %v: %v, want EADDRINUSE", at, err)
	}
	if _, err := Listen(at, Options{}); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("Listen on a group's %v: %v, want EADDRINUSE", at, err)
	}
	c := listenAny(t, "127.0.0.4", Options{})
	if _, err := ListenGroup(c.LocalAddr(), Options{}, 2); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("group on a Conn's %v: %v, want EADDRINUSE", c.LocalAddr(), err)
	}
	if _, err := ListenGroup(at, Options{Mode: RecvRaw}, 2); !errors.Is(err, ErrRawGroup) {
		t.Errorf("raw group: %v, want ErrRawGroup", err)
	}
	if _, err := ListenGroup(at, Options{}, 0); err == nil {
		t.Error("a group of 0 opened")
	}
}

// hasIPv6Loopback reports whether ::1 can be bound here.
func hasIPv6Loopback() bool {
	c, err := Listen(netip.AddrPortFrom(netip.IPv6Loopback(), uint16(20000+rand.IntN(40000))), Options{})
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// TestSourcePorts sends to 64 QPs from a Conn with 8 source ports (a
// group member's, IPv4 and IPv6, with and without GSO) and checks every
// packet arrives verified (the ICRC covers the source port) from a port
// in 0xC000-0xFFFF, the same port for every packet of one QP, QPs spread
// over the pool, and the Tap shows the port each packet left from.
func TestSourcePorts(t *testing.T) {
	for _, c := range []struct {
		name, addr string
		opts       Options
		group      int
	}{
		{"v4", "127.0.0.1", Options{SourcePorts: 8}, 0},
		{"v4-nogso", "127.0.0.1", Options{SourcePorts: 8, NoGSO: true}, 0},
		{"v4-group", "127.0.0.1", Options{SourcePorts: 8}, 2},
		{"v6", "::1", Options{SourcePorts: 8}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.addr == "::1" && !hasIPv6Loopback() {
				t.Skip("no IPv6 loopback")
			}
			var src Conn
			if c.group > 0 {
				g := listenGroupAny(t, c.addr, c.opts, c.group)
				src = g[1]
			} else {
				src = listenAny(t, c.addr, c.opts)
			}
			dst := listenAny(t, c.addr, Options{})
			tap := &tapRec{}
			src.SetTap(tap)
			const qps, per = 64, 4
			slab := make([]byte, qps*per*128)
			var msgs []Message
			for q := range qps {
				for k := range per { // back to back: Coalesce makes each QP's four one GSO run
					p := slab[(q*per+k)*128 : (q*per+k+1)*128]
					copy(p, rocePacket(128, uint32(k)))
					p[5], p[6], p[7] = 0, byte(q>>8), byte(q)
					msgs = append(msgs, Message{Buf: p, Peer: dst.LocalAddr()})
				}
			}
			// Runs of QPs whose packets leave from one port may share a
			// GSO datagram; others not.
			msgs = Coalesce(msgs, c.opts.SourcePorts)
			if len(msgs) > qps || len(msgs) < qps/2 {
				t.Fatalf("Coalesce made %d messages of %d QPs' runs", len(msgs), qps)
			}
			if n, err := src.Send(msgs); err != nil || n != len(msgs) {
				t.Fatalf("Send = %d, %v", n, err)
			}
			portOf := map[uint32]uint16{}
			ports := map[uint16]bool{}
			for _, m := range recvN(t, dst, qps*per, 5*time.Second) {
				q := m.Pkt.BTH().DestQP()
				port := m.Peer.Port()
				if port < SourcePortBase || port == src.LocalAddr().Port() {
					t.Fatalf("QP %d's packet from port %d", q, port)
				}
				if p, ok := portOf[q]; ok && p != port {
					t.Fatalf("QP %d's packets from ports %d and %d", q, p, port)
				}
				portOf[q] = port
				ports[port] = true
			}
			if len(ports) < 6 {
				t.Errorf("64 QPs sent from %d ports of 8", len(ports))
			}
			out, _ := tap.snapshot()
			if len(out) != qps*per {
				t.Fatalf("Tap saw %d packets out, want %d", len(out), qps*per)
			}
			for _, p := range out {
				if q := uint32(p.pkt[7]) | uint32(p.pkt[6])<<8; p.local.Port() != portOf[q] {
					t.Errorf("Tap: QP %d's packet from port %d, the wire says %d", q, p.local.Port(), portOf[q])
				}
			}
			st := src.Stats()
			if st.SentPackets != qps*per || (!c.opts.NoGSO && st.GSOSends == 0) {
				t.Errorf("sender stats %+v", st)
			}
			// 64 QPs' runs over 8 ports: one sendmmsg per port used, and
			// regrouping them allocates nothing once warm.
			if st.SendCalls > uint64(len(ports)) {
				t.Errorf("%d sendmmsg calls for %d ports", st.SendCalls, len(ports))
			}
			src.SetTap(nil)
			if a := testing.AllocsPerRun(20, func() { src.Send(msgs) }); a != 0 {
				t.Errorf("Send from the pool: %v allocations", a)
			}
			recvN(t, dst, 20*qps*per+qps*per, 5*time.Second) // drain (AllocsPerRun runs it once more)
		})
	}
}

// TestRegroupOrderVaries: regroup keeps each pool socket's messages
// together and in order, and the groups' order changes from batch to
// batch, so that no QP's packets always leave first (which, behind a
// marking switch, made DCQCN starve the QPs behind: e2e/dcqcn
// TestFairShares, one shard).
func TestRegroupOrderVaries(t *testing.T) {
	p := &portsConn{pool: make([]*udpConn, 8)}
	// Two QPs whose packets leave from different pool sockets.
	qa := uint32(1)
	qb := qa + 1
	for FlowPort(qb, len(p.pool)) == FlowPort(qa, len(p.pool)) {
		qb++
	}
	msg := func(q uint32, seq byte) Message {
		b := rocePacket(64, uint32(seq))
		b[5], b[6], b[7] = byte(q>>16), byte(q>>8), byte(q)
		b[60] = seq
		return Message{Buf: b}
	}
	aFirst := 0
	const batches = 400
	for range batches {
		msgs := []Message{msg(qa, 0), msg(qb, 1), msg(qa, 2), msg(qb, 3), msg(qa, 4)}
		p.regroup(msgs)
		var order []byte
		for _, m := range msgs {
			order = append(order, m.Buf[60])
		}
		switch string(order) {
		case "\x00\x02\x04\x01\x03":
			aFirst++
		case "\x01\x03\x00\x02\x04":
		default:
			t.Fatalf("regrouped order %v: want each QP's messages together, in order", order)
		}
	}
	// Each first about half the time; 100 of 400 is ten standard
	// deviations below.
	if aFirst < batches/4 || aFirst > batches*3/4 {
		t.Errorf("QP %d's group went first in %d of %d batches", qa, aFirst, batches)
	}
	two := []Message{msg(qa, 0), msg(qb, 1)}
	if a := testing.AllocsPerRun(100, func() { p.regroup(two) }); a != 0 {
		t.Errorf("regroup: %v allocations", a)
	}
}

// TestListenGroupForkDuringCheck: a fork (os/exec in another goroutine)
// while ListenGroup's check socket is bound must not make the group's
// bind, right after the check, fail with EADDRINUSE. The hook stands in
// for such a fork at that moment, deterministically: it takes ForkLock
// for writing, as syscall.forkExec does, and if it gets it copies the
// socket, as the child's descriptor table would, keeping the copy past
// the group's binds (as a child not yet at its exec does). Before
// checkFree held ForkLock, the copy kept the port bound: this is how an
// rxego device opened next to an exec.Command (cmd/rxego's probe tests)
// failed to open.
func TestListenGroupForkDuringCheck(t *testing.T) {
	var copies []int
	testHookFreeChecked = func(fd int) {
		if !syscall.ForkLock.TryLock() {
			return // no fork can start now
		}
		defer syscall.ForkLock.Unlock()
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			t.Error(err)
			return
		}
		copies = append(copies, d)
	}
	t.Cleanup(func() {
		testHookFreeChecked = nil
		for _, d := range copies {
			unix.Close(d)
		}
	})
	a := netip.MustParseAddr("127.0.0.5")
	for range 50 {
		at := netip.AddrPortFrom(a, uint16(20000+rand.IntN(40000)))
		forked := len(copies)
		cs, err := ListenGroup(at, Options{}, 2)
		if len(copies) > forked {
			t.Fatalf("a fork could start while the check socket on %v was bound (the group's bind then: %v)", at, err)
		}
		if err == nil {
			for _, c := range cs {
				c.Close()
			}
			return
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatal(err)
		}
	}
	t.Fatal("no free port")
}
