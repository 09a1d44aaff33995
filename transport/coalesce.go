package transport

import (
	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/reth"
)

// Coalesce merges runs of msgs into GSO sends, in place, and returns the
// shortened slice. A run is consecutive messages whose buffers lie back to
// back in memory (each starts where the one before it ends, inside its
// capacity), to the same peer and TOS and QPs of one block (below), all
// of the first's length but the last, which may be shorter, at most MaxSegments of them
// and together within one IPv4 UDP datagram: it becomes one Message with
// Seg set, which Send hands the kernel as one datagram, copying nothing.
// Messages that already have Seg set are left alone. Scattered messages
// (Payload set) merge likewise when both their Bufs and their Payloads
// lie back to back (consecutive packets of one message, read from one
// registered memory range), never with messages that are not scattered;
// the lengths compared are the wire lengths (Message.Len). An engine that builds
// a batch's packets in one slab (as package qp does) gets a long message's
// packets out in a few system calls this way; the limits are this
// package's, so a run Coalesce makes is one Send accepts. ports is the
// number of source ports the Conn sends from (Options.SourcePorts; 0 for
// one).
//
// A packet joins a run only if its destination QP is in the first
// packet's block (QPNBlock: the same QP, or one whose number differs only
// in the low bits), or if both are plain ACKs. Packets of other QPs may
// share the peer and source port, but a receiver that steers datagrams to
// a socket per QP group (an rxego device's shards: SO_REUSEPORT with a
// BPF program that reads the first packet's QP number) takes a GSO
// datagram that arrives whole, as on loopback, for one datagram, so
// another QP's packets in it would reach their QP on the wrong socket,
// beside the packets that came the right way and out of order with them
// (and go-back-N sends them all again). A group steers by block
// (GroupMember), whatever its size, so a block's packets go to one
// socket. A plain ACK is cumulative: one that comes late is stale and
// dropped, so ACKs for many QPs still leave in one datagram. A run never
// mixes source ports: packets of QPs that leave from different ones
// (FlowPort) do not share one.
func Coalesce(msgs []Message, ports int) []Message {
	out := msgs[:0]
	for i := 0; i < len(msgs); {
		k := runLen(msgs[i:], ports)
		m := msgs[i]
		if k > 1 {
			n, p := 0, 0
			for j := i; j < i+k; j++ {
				n += len(msgs[j].Buf)
				p += len(msgs[j].Payload)
			}
			m.Seg = m.Len()
			m.Buf = m.Buf[:n]
			if m.Payload != nil {
				m.Payload = m.Payload[:p]
			}
		}
		out = append(out, m)
		i += k
	}
	clear(msgs[len(out):]) // no stale references to the caller's buffers
	return out
}

// runLen returns how many messages from msgs[0] form one GSO run.
func runLen(msgs []Message, ports int) int {
	first := &msgs[0]
	if first.Seg > 0 {
		return 1
	}
	seg, total := first.Len(), first.Len()
	k := 1
	for ; k < len(msgs) && k < MaxSegments; k++ {
		prev, m := &msgs[k-1], &msgs[k]
		if prev.Len() != seg || len(m.Buf) == 0 || m.Len() > seg || m.Seg > 0 ||
			m.Peer != first.Peer || m.TOS != first.TOS || !sameFlow(first.Buf, m.Buf, ports) ||
			total+m.Len() > maxPayload4 || !adjacent(prev.Buf, m.Buf) || !payloadsFollow(prev, m) {
			break
		}
		total += m.Len()
	}
	return k
}

// payloadsFollow reports whether m can follow prev in a run as far as
// their payloads go: neither scattered, or both, with m's payload right
// after prev's.
func payloadsFollow(prev, m *Message) bool {
	if prev.Payload == nil || m.Payload == nil {
		return prev.Payload == nil && m.Payload == nil
	}
	return adjacent(prev.Payload, m.Payload)
}

// adjacent reports whether b starts right where a ends, inside a's
// capacity, so a[:len(a)+len(b)] covers both.
func adjacent(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 || cap(a) < len(a)+len(b) {
		return false
	}
	return &a[:len(a)+1][len(a)] == &b[0]
}

// sameFlow reports whether b may follow a (a run's first packet) as far as
// their destination QPs go: one block of QP numbers, or both plain ACKs,
// leaving from the same of ports source ports. Buffers too short for a
// BTH have no QP to compare and do not separate.
func sameFlow(a, b []byte, ports int) bool {
	if len(a) < minPacket || len(b) < minPacket {
		return true
	}
	x, y := bth.BTH(a).DestQP(), bth.BTH(b).DestQP()
	if x == y {
		return true
	}
	if x>>QPNBlockShift != y>>QPNBlockShift && !(plainACK(a) && plainACK(b)) {
		return false
	}
	return ports <= 1 || FlowPort(x, ports) == FlowPort(y, ports)
}

// plainACK reports whether b is an RC ACKNOWLEDGE whose AETH says ACK,
// not RNR NAK or NAK (those stay in their QP's own datagrams).
func plainACK(b []byte) bool {
	return len(b) >= bth.Len+reth.AETHLen && bth.BTH(b).Opcode() == bth.RCAck &&
		reth.AETH(b[bth.Len:]).Syndrome().Kind() == reth.KindACK
}

// QPNBlockShift sets the size of a block of QP numbers (QPNBlock): the
// numbers that differ only in their QPNBlockShift low bits.
const QPNBlockShift = 4

// QPNBlock is how many QP numbers make a block: a group of Conns
// (ListenGroup) steers a whole block to one Conn, and Coalesce lets the
// packets of one block's QPs share a GSO datagram.
const QPNBlock = 1 << QPNBlockShift

// GroupMember is which of a group of n Conns (ListenGroup) receives the
// packets for QP number qpn: its block's number mod n, so that the QPs of
// a block, whose packets may share a datagram, land on one Conn.
func GroupMember(qpn uint32, n int) int { return int((qpn >> QPNBlockShift) % uint32(n)) }

// FlowPort is which of ports source ports a packet for destination QP
// qpn leaves from.
func FlowPort(qpn uint32, ports int) int { return int(FlowHash(qpn)) * ports >> 14 }
