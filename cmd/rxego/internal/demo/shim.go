package demo

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/transport"
	"github.com/rxego/rxego/transport/impair"
)

// lossyConn is the receiving side's network for the loss scenario: armed
// with n, it drops the n-th request packet it receives, once, so the same
// packet is lost on every run.
type lossyConn struct {
	transport.Conn
	nth     atomic.Int32 // 0: nothing armed
	seen    atomic.Int32
	dropped atomic.Int32
}

// dropNth arms the conn to drop the n-th request packet from now on.
func (c *lossyConn) dropNth(n int) {
	c.seen.Store(0)
	c.nth.Store(int32(n))
}

// Recv implements transport.Conn, leaving out the doomed packet.
func (c *lossyConn) Recv(msgs []transport.Message) (int, error) {
	for {
		n, err := c.Conn.Recv(msgs)
		if c.nth.Load() == 0 || n == 0 {
			return n, err
		}
		kept := msgs[:0]
		for _, m := range msgs[:n] {
			if in := bth.Opcode(m.Buf[0]).Info(); in != nil && in.Flags&bth.Request != 0 {
				if c.seen.Add(1) == c.nth.Load() {
					c.nth.Store(0)
					c.dropped.Add(1)
					continue
				}
			}
			kept = append(kept, m)
		}
		if len(kept) > 0 || err != nil {
			return len(kept), err
		}
	}
}

// markingConn is the sending side's network for the congestion scenario:
// while marking, its packets go through transport.Impair with CE marking
// on every ECN-capable packet, as a congested switch would mark them;
// otherwise straight to the socket.
//
// It also stamps sent packets with the time their send started: the UDP
// transport stamps them when the send system call returns, and on
// loopback the peer's reply may have been received, and stamped, by then,
// which would draw the reply before its request.
type markingConn struct {
	transport.Conn              // the socket
	impaired       *impair.Conn // the socket, behind a CE-marking shim
	marking        atomic.Bool
	mu             sync.Mutex // orders sends across a switch
	sendStart      atomic.Pointer[time.Time]
}

// newMarkingConn wraps c; seed fixes the impairment's random stream (CE
// marking with probability 1 uses none, but Impair wants one).
func newMarkingConn(c transport.Conn, seed uint64) *markingConn {
	return &markingConn{Conn: c, impaired: impair.Wrap(c, impair.Config{Seed: seed, Dir: impair.Send, CE: 1})}
}

// Send implements transport.Conn.
func (c *markingConn) Send(msgs []transport.Message) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.sendStart.Store(&now)
	defer c.sendStart.Store(nil)
	if c.marking.Load() {
		return c.impaired.Send(msgs)
	}
	return c.Conn.Send(msgs)
}

// Close implements transport.Conn: the Impaired Conn closes the socket.
func (c *markingConn) Close() error { return c.impaired.Close() }

// SetTap implements transport.Conn, stamping sent packets with the time
// their send started.
func (c *markingConn) SetTap(t transport.Tap) {
	if t == nil {
		c.Conn.SetTap(nil)
		return
	}
	c.Conn.SetTap(stampTap{c, t})
}

// stampTap is a Tap that moves sent packets' timestamps to the start of
// their markingConn send.
type stampTap struct {
	c *markingConn
	transport.Tap
}

// Packet implements transport.Tap.
func (s stampTap) Packet(dir transport.Dir, at time.Time, local, remote netip.AddrPort, tos uint8, ipID uint16, pkt []byte) {
	if dir == transport.Out {
		if st := s.c.sendStart.Load(); st != nil {
			at = *st
		}
	}
	s.Tap.Packet(dir, at, local, remote, tos, ipID, pkt)
}
