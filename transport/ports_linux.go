package transport

import (
	"errors"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/rxego/rxego/bth"
)

// withSourcePorts returns c, or, when opts.SourcePorts asks for source
// ports, c with that many send sockets bound to ports in 0xC000-0xFFFF
// beside it. member and of place c in its group (0 and 1 for Listen): the
// 14-bit port space is cut into opts.SourcePorts*of equal parts and this
// member's sockets take every of-th, so the sockets of a group never
// compete for a port.
func withSourcePorts(c *udpConn, scope uint32, opts Options, member, of int) (Conn, error) {
	n := opts.SourcePorts
	if n <= 0 {
		return c, nil
	}
	n = min(n, MaxSourcePorts/of)
	p := &portsConn{udpConn: c, pool: make([]*udpConn, 0, n)}
	width := MaxSourcePorts / (n * of)
	for k := range n {
		first := (k*of + member) * width
		var err error
		var s *udpConn
		for try := range width {
			at := netip.AddrPortFrom(c.ep.local.Addr(), uint16(SourcePortBase+first+try))
			if s, err = listenUDP(at, scope, opts, sockSend); !errors.Is(err, syscall.EADDRINUSE) {
				break
			}
		}
		if err != nil {
			p.closePool()
			return nil, err
		}
		p.pool = append(p.pool, s)
	}
	return p, nil
}

// portsConn is a Conn that receives on its address's port (4791) and
// sends each packet from one of a pool of source-port sockets, chosen by
// the packet's destination QP: all of a connection's packets leave from
// one port, and connections spread over the pool.
type portsConn struct {
	*udpConn
	pool []*udpConn

	gmu     sync.Mutex // guards the scratch below (Send and SendFilled)
	scratch []Message  // msgs while Send regroups them
	counts  []int      // messages per pool socket, then each group's start
	order   []int      // the pool sockets in the order their groups go (regroup)
	rng     uint64     // xorshift state shuffling order
}

// pick returns the index of the pool socket for a packet or run whose
// BTH starts b.
func (p *portsConn) pick(b []byte) int {
	if len(b) < minPacket {
		return 0 // Send rejects it
	}
	return FlowPort(bth.BTH(b).DestQP(), len(p.pool))
}

// Scatters implements Scatterer: the pool's sockets send scattered
// messages as Listen's Conn does.
func (p *portsConn) Scatters() bool { return true }

// Send implements Conn. It first regroups msgs in place by pool socket,
// keeping the order of each socket's messages (so of each QP's), and
// sends each group in that socket's sendmmsg calls: posts to many QPs
// still leave in a few system calls. n counts msgs in the new order.
func (p *portsConn) Send(msgs []Message) (int, error) { return p.sendGroups(msgs, (*udpConn).Send) }

// SendFilled implements FilledSender.
func (p *portsConn) SendFilled(msgs []Message) (int, error) {
	return p.sendGroups(msgs, (*udpConn).SendFilled)
}

func (p *portsConn) sendGroups(msgs []Message, send func(*udpConn, []Message) (int, error)) (int, error) {
	p.gmu.Lock()
	p.regroup(msgs)
	p.gmu.Unlock()
	done := 0
	for done < len(msgs) {
		k := p.pick(msgs[done].Buf)
		end := done + 1
		for end < len(msgs) && p.pick(msgs[end].Buf) == k {
			end++
		}
		n, err := send(p.pool[k], msgs[done:end])
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// regroup sorts msgs by pool socket, stably (a counting sort through
// scratch, which grows once and is cleared after). The groups go in a
// new random order each batch: in a fixed order, the QPs of the first
// sockets would always leave first, and behind a marking switch the
// others would always take the marks (DCQCN then starved them: two flows
// on one shard settled at 190 and 38 Mbit/s).
func (p *portsConn) regroup(msgs []Message) {
	if len(msgs) < 2 {
		return
	}
	n := len(p.pool)
	if p.counts == nil {
		p.counts, p.order = make([]int, n), make([]int, n)
		for k := range p.order {
			p.order[k] = k
		}
		p.rng = uint64(time.Now().UnixNano()) | 1
	}
	clear(p.counts)
	for i := range msgs {
		p.counts[p.pick(msgs[i].Buf)]++
	}
	// Fisher-Yates with xorshift: a few steps per batch, no allocation.
	for j := n - 1; j > 0; j-- {
		p.rng ^= p.rng << 13
		p.rng ^= p.rng >> 7
		p.rng ^= p.rng << 17
		i := int(p.rng % uint64(j+1))
		p.order[i], p.order[j] = p.order[j], p.order[i]
	}
	// counts[k] becomes group k's first index, the groups in order.
	off := 0
	for _, k := range p.order {
		c := p.counts[k]
		p.counts[k] = off
		off += c
	}
	p.scratch = append(p.scratch[:0], msgs...)
	for i := range p.scratch {
		k := p.pick(p.scratch[i].Buf)
		msgs[p.counts[k]] = p.scratch[i]
		p.counts[k]++
	}
	clear(p.scratch) // no references to the caller's buffers
}

// Stats implements Conn: the receive socket's counters and the pool's.
func (p *portsConn) Stats() Stats {
	st := p.udpConn.Stats()
	gso := true
	for _, s := range p.pool {
		o := s.Stats()
		gso = gso && o.GSO
		o.GSO, o.GRO = st.GSO, st.GRO
		st.Add(o)
	}
	st.GSO = gso
	return st
}

// SetTap implements Conn.
func (p *portsConn) SetTap(t Tap) {
	p.udpConn.SetTap(t)
	for _, s := range p.pool {
		s.SetTap(t)
	}
}

// Close implements Conn.
func (p *portsConn) Close() error {
	err := p.udpConn.Close()
	p.closePool()
	return err
}

func (p *portsConn) closePool() {
	for _, s := range p.pool {
		s.Close()
	}
}

// Quiet implements Quieter: the pool's sockets leave their send waits'
// instances too.
func (p *portsConn) Quiet() {
	p.udpConn.Quiet()
	for _, s := range p.pool {
		s.Quiet()
	}
}

// SourcePorts returns the pool's ports, in pool order (SourcePorter).
func (p *portsConn) SourcePorts() []uint16 {
	out := make([]uint16, len(p.pool))
	for i, s := range p.pool {
		out[i] = s.ep.local.Port()
	}
	return out
}
