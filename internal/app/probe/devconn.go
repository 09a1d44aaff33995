package probe

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/transport"
)

// devConn lets a whole rxego device share the probe's port 4791: the
// device sends and receives through the wire's socket, so that the
// connection manager's MADs (QP 1) and perftest's -R exchange (a comm QP
// that rdma_cm connected) run on rxego's own engine, while the packets
// of the QPs the probe claimed (the data QPs, once connected) reach the
// probe's scenarios and never the engine. One address, one socket: the
// peer sees one RoCE endpoint, as perftest's client would be.
//
// The device's packets are paced and counted apart from the probe's
// budget (its CM and exchange are the tool's handshake, bounded by it),
// but recorded in the run's capture like every other packet.
type devConn struct {
	w      *wire
	in     chan transport.Message
	closed chan struct{}
	once   sync.Once

	mu    sync.Mutex
	tap   transport.Tap
	stats transport.Stats
}

// errDevConnClosed is Recv's and Send's error once the device closed its
// Conn (net.ErrClosed, which the engine's receive loop expects).
var errDevConnClosed = net.ErrClosed

// attachDevice returns the Conn a device opened on the wire's address
// uses (rxego.Options.Conn). From now on the wire's received packets go
// to the device, except those for QPs claimed with claim.
func (w *wire) attachDevice() *devConn {
	c := &devConn{w: w, in: make(chan transport.Message, 256), closed: make(chan struct{})}
	w.mu.Lock()
	w.dev = c
	w.mu.Unlock()
	return c
}

// claim routes the packets sent to the probe's QP qpn to the scenarios
// instead of the device.
func (w *wire) claim(qpn uint32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.claimed == nil {
		w.claimed = map[uint32]bool{}
	}
	w.claimed[qpn] = true
}

// toDevice says whether the wire hands a packet for qpn to the device
// (and, when so, which Conn).
func (w *wire) toDevice(qpn uint32) *devConn {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dev == nil || w.claimed[qpn] {
		return nil
	}
	return w.dev
}

// deliver queues one received packet for the device; a full queue drops
// it, as a socket's full buffer would (the engine retries).
func (c *devConn) deliver(p bth.Packet, pkt []byte, from netip.AddrPort, id uint16, at time.Time) {
	c.mu.Lock()
	tap := c.tap
	c.mu.Unlock()
	select {
	case <-c.closed:
		return
	default:
	}
	select {
	case c.in <- transport.Message{Buf: pkt, Pkt: p, Peer: from, IPID: id}:
		if tap != nil {
			tap.Packet(transport.In, at, c.w.local, from, 0, id, pkt)
		}
	default:
		c.mu.Lock()
		c.stats.Drops[transport.DropOverflow]++
		c.mu.Unlock()
	}
}

// Send implements transport.Conn: the ICRC is computed as the wire
// computes its own (IPv4 ID 0, DF), and the packet goes to the wire's
// peer, the only address a probe talks to. A run of packets (Seg, which
// the device's sender makes of adjacent packets to one peer) goes as
// separate datagrams, as a Conn without GSO sends it.
func (c *devConn) Send(msgs []transport.Message) (int, error) {
	for i, m := range msgs {
		select {
		case <-c.closed:
			return i, errDevConnClosed
		default:
		}
		if rxAddr(m.Peer) != c.w.peer {
			return i, fmt.Errorf("probe: the device sent to %v; the probe talks only to %v", m.Peer, c.w.peer)
		}
		seg := m.Seg
		if seg <= 0 || seg > len(m.Buf) {
			seg = len(m.Buf)
		}
		for off := 0; off < len(m.Buf); off += seg {
			if err := c.sendOne(m.Buf[off:min(off+seg, len(m.Buf))], m.TOS); err != nil {
				return i, err
			}
		}
	}
	return len(msgs), nil
}

// sendOne sends one packet of the device's, recorded in the capture.
func (c *devConn) sendOne(buf []byte, tos uint8) error {
	pkt := append([]byte(nil), buf...)
	c.w.fillICRC(pkt)
	now := time.Now()
	c.w.record(transport.Out, now, c.w.local, c.w.peer, tos, 0, pkt)
	if _, err := c.w.conn.WriteToUDPAddrPort(pkt, c.w.peer); err != nil {
		return fmt.Errorf("probe: the device's send to %v: %w", c.w.peer, err)
	}
	c.mu.Lock()
	c.stats.SentPackets++
	c.stats.SentBytes += uint64(len(pkt))
	c.stats.SendCalls++
	tap := c.tap
	c.mu.Unlock()
	if tap != nil {
		tap.Packet(transport.Out, now, c.w.local, c.w.peer, tos, 0, pkt)
	}
	return nil
}

// rxAddr is ap with port 4791 when it has none and its address unmapped.
func rxAddr(ap netip.AddrPort) netip.AddrPort {
	if ap.Port() == 0 {
		ap = netip.AddrPortFrom(ap.Addr(), transport.Port)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// Recv implements transport.Conn.
func (c *devConn) Recv(msgs []transport.Message) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	var m transport.Message
	select {
	case <-c.closed:
		return 0, errDevConnClosed
	case m = <-c.in:
	}
	msgs[0] = m
	n := 1
more:
	for n < len(msgs) {
		select {
		case m = <-c.in:
			msgs[n] = m
			n++
		default:
			break more
		}
	}
	c.mu.Lock()
	c.stats.RecvCalls++
	for _, m := range msgs[:n] {
		c.stats.RecvPackets++
		c.stats.RecvBytes += uint64(len(m.Buf))
	}
	c.mu.Unlock()
	return n, nil
}

// LocalAddr implements transport.Conn.
func (c *devConn) LocalAddr() netip.AddrPort { return c.w.local }

// Stats implements transport.Conn.
func (c *devConn) Stats() transport.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// SetTap implements transport.Conn.
func (c *devConn) SetTap(t transport.Tap) {
	c.mu.Lock()
	c.tap = t
	c.mu.Unlock()
}

// Close implements transport.Conn: the device lets go; the wire (and its
// socket) stays the probe's, and packets for unclaimed QPs are dropped
// from now on.
func (c *devConn) Close() error {
	c.once.Do(func() {
		close(c.closed)
		c.w.mu.Lock()
		if c.w.dev == c {
			c.w.dev = nil
		}
		c.w.mu.Unlock()
	})
	return nil
}
