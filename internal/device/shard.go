package device

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// shard is one of a device's engines with its send path: the QPs whose
// number's block is idx mod the shard count (Device.ShardOf) live on it.
// Nothing on one QP's data path is shared with another shard's QPs except
// the device-wide objects verbs share (CQs, SRQs, PDs, MRs).
type shard struct {
	d    *Device
	idx  int
	eng  *qp.Engine
	conn transport.Conn // sends (and, in a group, receives) this shard's packets
	// conns are the shard's Conns per GID (conns[0] is conn): a packet
	// leaves from its route's (Device.route).
	conns []transport.Conn

	ports int // source ports conn sends from (transport.SourcePorter), 0 for one
	// zeroCopy asks the engine to leave payloads in registered memory
	// (Config.ZeroCopy), where every Conn of the shard can send them so.
	zeroCopy bool
	sendMu   *sync.Mutex // the shard's own, or the device's for a shared Conn
	// work hands the sender (runSender) a batch to send, and sent says
	// it has; both are nil on a device that does not send in parallel.
	work, sent chan struct{}
	senderRuns atomic.Uint64 // batches the sender sent
	msgs       []transport.Message
	gmsgs      [][]transport.Message // per further GID, with several
}

// runSender is the shard's sender on a device that sends in parallel
// (Device.Batch): it builds and sends what a batch's posts left on the
// shard's engine, until the device stops.
func (s *shard) runSender() {
	for {
		select {
		case <-s.work:
			s.eng.RunBatch()
			s.senderRuns.Add(1)
			s.sent <- struct{}{}
		case <-s.d.stop:
			return
		}
	}
}

// handOff gives the shard's batch to its sender and reports whether it
// did; on a stopped device the caller runs it.
func (s *shard) handOff() bool {
	select {
	case s.work <- struct{}{}:
		return true
	case <-s.d.stop:
		s.eng.RunBatch()
		return false
	}
}

// waitSent waits for the sender to finish the batch handOff gave it.
func (s *shard) waitSent() { <-s.sent }

// shardOut adapts a shard's Conn to the engine's Output.
type shardOut shard

// Emit sends the engine's packets in one batch; the transport coalesces
// the runs the engine built back to back into GSO sends
// (transport.Coalesce).
func (o *shardOut) Emit(pkts []qp.OutPacket) {
	s := (*shard)(o)
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if len(s.conns) > 1 {
		s.emitGIDs(pkts)
		return
	}
	msgs := s.msgs[:0]
	for i := range pkts {
		p := &pkts[i]
		msgs = append(msgs, transport.Message{Buf: p.Buf, Payload: p.Payload, Peer: p.Dest, TOS: p.TOS})
	}
	s.msgs = msgs // keep the grown array for the next call
	s.send(s.conn, pkts, msgs)
	clear(s.msgs[:cap(s.msgs)]) // do not keep the engine's buffers alive
}

// Scatters implements qp.ScatterOutput: with Config.ZeroCopy, the
// engine leaves large payloads in registered memory when every Conn of
// the shard sends them from there (transport.Scatterer); behind a Conn
// that is not one (the impairment shim, a caller's own Conn) it builds
// whole packets.
func (o *shardOut) Scatters() bool {
	if !o.zeroCopy {
		return false
	}
	for _, c := range o.conns {
		if sc, ok := c.(transport.Scatterer); !ok || !sc.Scatters() {
			return false
		}
	}
	return true
}

// emitGIDs sends pkts on a device with several GIDs, each packet from its
// route's Conn (Device.route, by its destination QP).
func (s *shard) emitGIDs(pkts []qp.OutPacket) {
	if s.gmsgs == nil {
		s.gmsgs = make([][]transport.Message, len(s.conns))
	}
	s.d.routes.mu.RLock() // once per batch
	for i := range pkts {
		p := &pkts[i]
		g := s.d.route(p.Dest, p.DestQPN)
		s.gmsgs[g] = append(s.gmsgs[g], transport.Message{Buf: p.Buf, Payload: p.Payload, Peer: p.Dest, TOS: p.TOS})
	}
	s.d.routes.mu.RUnlock()
	for g, msgs := range s.gmsgs {
		if len(msgs) > 0 {
			s.send(s.conns[g], pkts, msgs)
			clear(msgs[:cap(msgs)])
			s.gmsgs[g] = msgs[:0]
		}
	}
}

// send sends msgs, made of pkts, on c.
func (s *shard) send(c transport.Conn, pkts []qp.OutPacket, msgs []transport.Message) {
	msgs = transport.Coalesce(msgs, s.ports)
	for len(msgs) > 0 {
		n, err := c.Send(msgs)
		if err != nil {
			s.eng.Stats.SendErr.Add(1)
			if n < len(msgs) && transport.Unsendable(err) {
				// Longer than the interface carries: resending cannot
				// help, so the work request fails (qp.Engine.SendFailed).
				if p := firstPacket(pkts, msgs[n].Buf); p != nil {
					s.eng.SendFailed(p)
				}
			}
			// Otherwise the packet is lost as if the network dropped it;
			// the transport's retransmission recovers, as on a real link.
			n++
		}
		msgs = msgs[min(n, len(msgs)):]
	}
}

// firstPacket returns the packet of pkts whose buffer starts b: a
// message's first packet, found by address since the transport may have
// merged (Coalesce) and regrouped (source ports) the messages. Only a
// failed send looks.
func firstPacket(pkts []qp.OutPacket, b []byte) *qp.OutPacket {
	for i := range pkts {
		if len(pkts[i].Buf) > 0 && len(b) > 0 && &pkts[i].Buf[0] == &b[0] {
			return &pkts[i]
		}
	}
	return nil
}

// demux is the Input of a Conn of a sharded device: it hands each
// packet to its destination QP's shard. On a steered socket group every
// packet is already on its shard and the batch goes to the engine as it
// is; what the kernel could not steer (packets of another QP coalesced
// into one GRO batch, a shared Options.Conn) goes to the right engine
// from this goroutine, under that engine's lock, in arrival order per
// shard.
type demux struct {
	d        *Device
	home     int
	per      [][]qp.InPacket // scratch, per shard
	handedOn atomic.Uint64   // packets handed to another shard's engine
}

func newDemux(d *Device, home int) *demux {
	x := &demux{d: d, home: home, per: make([][]qp.InPacket, len(d.shards))}
	for i := range x.per {
		x.per[i] = make([]qp.InPacket, 0, 64)
	}
	return x
}

// split reports whether every packet of pkts belongs to the home shard;
// otherwise it sorts them into per.
func (x *demux) split(pkts []qp.InPacket) bool {
	all := true
	for i := range pkts {
		if x.d.ShardOf(pkts[i].Pkt.BTH().DestQP()) != x.home {
			all = false
			break
		}
	}
	if all {
		return true
	}
	for i := range pkts {
		s := x.d.ShardOf(pkts[i].Pkt.BTH().DestQP())
		x.per[s] = append(x.per[s], pkts[i])
	}
	x.handedOn.Add(uint64(len(pkts) - len(x.per[x.home])))
	return false
}

// each runs input on the engine of every shard with packets, and clears
// the scratch.
func (x *demux) each(input func(*qp.Engine, []qp.InPacket) bool) bool {
	woke := false
	for i, p := range x.per {
		if len(p) > 0 {
			woke = input(x.d.shards[i].eng, p) || woke
			clear(p)
			x.per[i] = p[:0]
		}
	}
	return woke
}

// settleLimit bounds how long a CM message waits for another shard's
// reader (Receiver.Settle).
const settleLimit = 2 * time.Millisecond

// settle makes the other shards take in what their sockets hold when
// pkts carry a message for the GSI QP (QP1, the connection manager's):
// a CM message acts on QPs of every shard (a DREQ moves one to ERR), and
// must not overtake packets that arrived before it on another shard's
// socket. CM messages are rare; data packets never wait.
func (x *demux) settle(pkts []qp.InPacket) {
	if len(x.d.rcvs) < 2 {
		return
	}
	for i := range pkts {
		if pkts[i].Pkt.BTH().DestQP() == gsiQPN {
			for j, r := range x.d.rcvs {
				if j != x.home {
					r.Settle(settleLimit)
				}
			}
			return
		}
	}
}

// gsiQPN is the QP number of the General Services Interface (CM MADs).
const gsiQPN = 1

// InputWoke implements Input.
func (x *demux) InputWoke(pkts []qp.InPacket) bool {
	x.settle(pkts)
	if x.split(pkts) {
		return x.d.shards[x.home].eng.InputWoke(pkts)
	}
	return x.each((*qp.Engine).InputWoke)
}

// InputPolled implements Input.
func (x *demux) InputPolled(pkts []qp.InPacket) bool {
	x.settle(pkts)
	if x.split(pkts) {
		return x.d.shards[x.home].eng.InputPolled(pkts)
	}
	return x.each((*qp.Engine).InputPolled)
}

// FlushAcks implements Input: the ACKs of every shard this Conn
// handed packets to may be held.
func (x *demux) FlushAcks() {
	for _, s := range x.d.shards {
		s.eng.FlushAcks()
	}
}
