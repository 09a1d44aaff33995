package transport

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
)

// DefaultPipeQueue is how many packets a pipe Conn holds before it drops.
const DefaultPipeQueue = 1024

// PipeNetwork is an in-memory fabric of Conns for tests that need no
// sockets: Conns bound to any addresses deliver to each other through
// bounded queues. ICRCs are computed and checked as over UDP (IPv4 packets
// carry ID 0, or 0, 1, 2, ... within a Seg run, as with GSO), so a packet
// changed on the way is caught. A packet to a full queue is dropped and
// counted as DropOverflow at the receiver; one to an address nobody
// listens on is counted in the sender's SendDrops.
type PipeNetwork struct {
	// QueueLen is the queue length, in packets, of Conns opened after it is
	// set; 0 means DefaultPipeQueue.
	QueueLen int

	mu    sync.RWMutex
	conns map[netip.AddrPort]*pipeConn
}

// NewPipeNetwork returns an empty network.
func NewPipeNetwork() *PipeNetwork {
	return &PipeNetwork{conns: map[netip.AddrPort]*pipeConn{}}
}

// Listen opens a Conn on local (port 0 means Port). Of opts only TOS is
// used. Binding an address twice fails with syscall.EADDRINUSE.
func (n *PipeNetwork) Listen(local netip.AddrPort, opts Options) (Conn, error) {
	a := local.Addr().Unmap()
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() {
		return nil, fmt.Errorf("%w: %v", ErrAddress, local)
	}
	port := local.Port()
	if port == 0 {
		port = Port
	}
	local = netip.AddrPortFrom(a.WithZone(""), port)
	q := n.QueueLen
	if q <= 0 {
		q = DefaultPipeQueue
	}
	c := &pipeConn{net: n, ep: newEndpoint(local), tos: opts.TOS, q: make(chan pipePkt, q), done: make(chan struct{})}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.conns[local]; ok {
		return nil, fmt.Errorf("transport: pipe listen %v: %w", local, syscall.EADDRINUSE)
	}
	n.conns[local] = c
	return c, nil
}

func (n *PipeNetwork) lookup(a netip.AddrPort) *pipeConn {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.conns[a]
}

// pipePkt is a packet in flight: its own copy of the bytes.
type pipePkt struct {
	buf  []byte
	from netip.AddrPort
	tos  uint8
	id   uint16
}

type pipeConn struct {
	net    *PipeNetwork
	ep     endpoint
	tos    uint8
	q      chan pipePkt
	done   chan struct{}
	closed atomic.Bool
	tap    TapSlot
	ctr    counters
	rmu    sync.Mutex
	drops  []dropRec
}

func (c *pipeConn) LocalAddr() netip.AddrPort { return c.ep.local }

func (c *pipeConn) SetTap(t Tap) { c.tap.Set(t) }

func (c *pipeConn) Stats() Stats {
	s := c.ctr.snapshot()
	s.GSO = true
	return s
}

func (c *pipeConn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return net.ErrClosed
	}
	c.net.mu.Lock()
	delete(c.net.conns, c.ep.local)
	c.net.mu.Unlock()
	close(c.done)
	return nil
}

// Scatters implements Scatterer: a pipe takes scattered messages,
// gathering each into the copy it delivers.
func (c *pipeConn) Scatters() bool { return true }

// Send implements Conn.
func (c *pipeConn) Send(msgs []Message) (int, error) { return c.send(msgs, true) }

// SendFilled implements FilledSender.
func (c *pipeConn) SendFilled(msgs []Message) (int, error) { return c.send(msgs, false) }

func (c *pipeConn) send(msgs []Message, fill bool) (int, error) {
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	tap, at := c.tap.Get()
	c.ctr.sendCalls.Add(1)
	for i := range msgs {
		m := &msgs[i]
		peer, ok := c.ep.peer(m.Peer)
		if !ok {
			return i, fmt.Errorf("%w: %v", ErrPeer, m.Peer)
		}
		k, err := c.ep.runSegments(m.Len(), m.Seg)
		if err != nil {
			return i, err
		}
		buf := m.Buf
		if m.Payload != nil {
			// A pipe copies every packet anyway: gather first.
			if buf, err = m.Gather(nil); err != nil {
				return i, err
			}
		}
		seg := m.Seg
		if k == 1 {
			seg = len(buf)
		} else {
			c.ctr.gsoSends.Add(1)
			c.ctr.gsoSegments.Add(uint64(k))
		}
		if fill {
			c.ep.fillRun(buf, seg, peer, 0, true)
		}
		tos := m.TOS
		if tos == 0 {
			tos = c.tos
		}
		dst := c.net.lookup(peer)
		var id uint16
		for off := 0; off < len(buf); off += seg {
			p := buf[off:min(off+seg, len(buf))]
			if tap != nil {
				tap.Packet(Out, at, c.ep.local, peer, tos, id, p)
			}
			c.ctr.sentPackets.Add(1)
			c.ctr.sentBytes.Add(uint64(len(p)))
			if dst == nil {
				c.ctr.sendDrops.Add(1)
			} else {
				dst.deliver(pipePkt{buf: append([]byte(nil), p...), from: c.ep.local, tos: tos, id: id})
			}
			if !c.ep.v6 {
				id++
			}
		}
	}
	return len(msgs), nil
}

// deliver queues a packet, or drops it when the queue is full.
func (c *pipeConn) deliver(p pipePkt) {
	select {
	case <-c.done:
	case c.q <- p:
	default:
		c.ctr.drops[DropOverflow].Add(1)
	}
}

// Recv implements Conn.
func (c *pipeConn) Recv(msgs []Message) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	for {
		c.rmu.Lock()
		n, err := c.fill(msgs)
		drops := c.drops
		c.drops = c.drops[:0]
		c.rmu.Unlock()
		if tap, at := c.tap.Get(); tap != nil {
			for i := range msgs[:n] {
				m := &msgs[i]
				tap.Packet(In, at, c.ep.local, m.Peer, m.TOS, m.IPID, m.Buf)
			}
			for i := range drops {
				d := &drops[i]
				tap.Drop(d.reason, at, c.ep.local, d.peer, d.tos, d.pkt)
			}
		}
		clear(drops)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// fill waits for one packet, then takes whatever else is queued.
func (c *pipeConn) fill(msgs []Message) (int, error) {
	n := 0
	for n < len(msgs) {
		var p pipePkt
		if n == 0 && len(c.drops) == 0 {
			select {
			case <-c.done:
				return 0, net.ErrClosed
			case p = <-c.q:
			}
		} else {
			select {
			case p = <-c.q:
			default:
				return n, nil
			}
		}
		pk, reason, ok := c.ep.check(p.buf, p.from, p.id)
		if !ok {
			c.ctr.drops[reason].Add(1)
			c.drops = append(c.drops, dropRec{reason: reason, peer: p.from, tos: p.tos, pkt: p.buf})
			continue
		}
		msgs[n] = Message{Buf: p.buf, Pkt: pk, Peer: p.from, TOS: p.tos, IPID: p.id}
		n++
		c.ctr.recvPackets.Add(1)
		c.ctr.recvBytes.Add(uint64(len(p.buf)))
	}
	return n, nil
}
