package transport

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"syscall"
	"testing"
	"time"
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
// Conns, IPv4 and IPv6, and checks each landed on Conn QPN mod 4, parsed.
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
					if int(q%n) != i || psnOf(m.Buf) != q || m.Pkt.Info == nil {
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
