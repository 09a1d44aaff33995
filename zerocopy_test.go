package rxego_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/icrc"
	"github.com/rxego/rxego/transport"
)

// scatterConn is a device's Conn that counts the scattered messages
// (payload left in registered memory) it is given, and offers to take
// them (transport.Scatterer) only when scatter is set.
type scatterConn struct {
	transport.Conn
	scatter   bool
	scattered atomic.Int64
}

func (c *scatterConn) Scatters() bool { return c.scatter }

func (c *scatterConn) Send(msgs []transport.Message) (int, error) {
	for i := range msgs {
		if msgs[i].Payload != nil {
			c.scattered.Add(1)
		}
	}
	return c.Conn.Send(msgs)
}

// icrcTap checks the ICRC of every packet sent against the addresses and
// IP ID it left with, and counts packets and drops.
type icrcTap struct {
	mu              sync.Mutex
	sent, bad, drop int
}

func (t *icrcTap) Packet(dir rxego.TapDir, _ time.Time, local, remote netip.AddrPort, _ uint8, id uint16, pkt []byte) {
	if dir != rxego.TapOut {
		return
	}
	var ok bool
	if local.Addr().Is4() {
		v := icrc.V4{Src: local.Addr().As4(), Dst: remote.Addr().As4(), SrcPort: local.Port(), DstPort: remote.Port(), DF: true}
		ok = v.Check(id, pkt)
	} else {
		v := icrc.V6{Src: local.Addr().As16(), Dst: remote.Addr().As16(), SrcPort: local.Port(), DstPort: remote.Port()}
		ok = v.Check(pkt)
	}
	t.mu.Lock()
	t.sent++
	if !ok {
		t.bad++
	}
	t.mu.Unlock()
}

func (t *icrcTap) Drop(rxego.TapDropReason, time.Time, netip.AddrPort, netip.AddrPort, uint8, []byte) {
	t.mu.Lock()
	t.drop++
	t.mu.Unlock()
}

// zcSide is one device of TestZeroCopyEndToEnd.
type zcSide struct {
	dev  *rxego.Device
	conn *scatterConn
	tap  *icrcTap
	qp   *rxego.QP
	cq   *rxego.CQ
	mr   *rxego.MR
	buf  []byte
}

func openZCSide(t *testing.T, addr string, scatter bool, size int) *zcSide {
	t.Helper()
	a := netip.MustParseAddr(addr)
	var c transport.Conn
	var err error
	for range 50 {
		if c, err = transport.Listen(netip.AddrPortFrom(a, uint16(20000+rand.IntN(40000))), transport.Options{}); !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	s := &zcSide{conn: &scatterConn{Conn: c, scatter: scatter}, tap: &icrcTap{}, buf: make([]byte, size+64)}
	if s.dev, err = rxego.Open(c.LocalAddr().String(), &rxego.Options{Conn: s.conn, Tap: s.tap, ZeroCopy: true}); err != nil {
		c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { s.dev.Close() })
	pd, _ := s.dev.AllocPD()
	s.cq, _ = s.dev.CreateCQ(16)
	if s.qp, err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: s.cq, RecvCQ: s.cq, Caps: rxego.Caps{MaxSendWR: 16, MaxRecvWR: 16}}); err != nil {
		t.Fatal(err)
	}
	if s.mr, err = pd.RegMR(s.buf, rxego.AccessLocalWrite|rxego.AccessRemoteWrite|rxego.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *zcSide) wait(t *testing.T, what string) rxego.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wc := make([]rxego.WC, 1)
	if n, err := s.cq.PollWait(ctx, wc); n != 1 || err != nil || wc[0].Status != rxego.WCSuccess {
		t.Fatalf("%s: completion %d %v %+v", what, n, err, wc[0])
	}
	return wc[0]
}

// TestZeroCopyEndToEnd runs WRITE, SEND and READ between two devices
// over loopback, IPv4 and IPv6, MTU 1024 and 4096, 1 byte to 1 MiB, with
// payloads left in registered memory and copied: the data must arrive,
// every packet sent must carry the right ICRC for the IP ID it left with,
// nothing may be dropped, and the scattering devices must have scattered
// exactly when a payload is long enough.
func TestZeroCopyEndToEnd(t *testing.T) {
	sizes := []int{1, 511, 4096 + 5, 65536 + 3, 1 << 20}
	if testing.Short() {
		sizes = sizes[:4]
	}
	for _, fam := range []struct{ name, a, b string }{{"v4", "127.0.0.1", "127.0.0.2"}, {"v6", "::1", "::1"}} {
		for _, scatter := range []bool{false, true} {
			for _, mtu := range []rxego.MTU{rxego.MTU1024, rxego.MTU4096} {
				name := fmt.Sprintf("%s/scatter=%v/mtu=%d", fam.name, scatter, mtu.Bytes())
				t.Run(name, func(t *testing.T) {
					a := openZCSide(t, fam.a, scatter, 1<<20)
					b := openZCSide(t, fam.b, scatter, 1<<20)
					if err := a.qp.Connect(rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qp.Num(), PSN: 2000}, &rxego.ConnectOptions{MTU: mtu, LocalPSN: 1000}); err != nil {
						t.Fatal(err)
					}
					if err := b.qp.Connect(rxego.RemoteQP{Addr: a.dev.Addr(), QPN: a.qp.Num(), PSN: 1000}, &rxego.ConnectOptions{MTU: mtu, LocalPSN: 2000}); err != nil {
						t.Fatal(err)
					}
					for _, size := range sizes {
						for _, op := range []rxego.WROpcode{rxego.WRWrite, rxego.WRSend, rxego.WRRead} {
							zcRound(t, a, b, op, size)
						}
					}
					if scatter != (a.conn.scattered.Load()+b.conn.scattered.Load() > 0) {
						t.Errorf("scatter %v: %d and %d scattered messages", scatter, a.conn.scattered.Load(), b.conn.scattered.Load())
					}
					for i, s := range []*zcSide{a, b} {
						s.tap.mu.Lock()
						if s.tap.sent == 0 || s.tap.bad != 0 || s.tap.drop != 0 {
							t.Errorf("side %d: %d packets sent, %d with a wrong ICRC, %d dropped", i, s.tap.sent, s.tap.bad, s.tap.drop)
						}
						s.tap.mu.Unlock()
					}
				})
			}
		}
	}
}

// zcRound moves size bytes from one side's memory to the other's with op
// and checks they arrived.
func zcRound(t *testing.T, a, b *zcSide, op rxego.WROpcode, size int) {
	t.Helper()
	what := fmt.Sprintf("%v %d bytes", op, size)
	src, dst := a, b
	if op == rxego.WRRead {
		src, dst = b, a
	}
	for i := range src.buf[:size] {
		src.buf[i] = byte(rand.Uint32())
	}
	src.dev.Sync()
	if op == rxego.WRSend {
		if err := b.qp.PostRecv(rxego.RecvWR{ID: 2, SGL: []rxego.SGE{{Addr: b.mr.IOVA(), Length: uint32(len(b.buf)), LKey: b.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.qp.PostSend(rxego.SendWR{ID: 1, Opcode: op, Flags: rxego.SendSignaled,
		SGL:        []rxego.SGE{{Addr: a.mr.IOVA(), Length: uint32(size), LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	a.wait(t, what)
	if op == rxego.WRSend {
		b.wait(t, what+" (receive)")
	}
	dst.dev.Sync()
	if !bytes.Equal(dst.buf[:size], src.buf[:size]) {
		t.Fatalf("%s: data differs", what)
	}
	// Order these reads before the engines write the buffers again (the
	// race detector does not see the order the network gives).
	a.dev.Sync()
	b.dev.Sync()
}
