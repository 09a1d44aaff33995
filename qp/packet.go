package qp

import (
	"net/netip"

	"github.com/rxego/rxego/bth"
)

// emit queues a packet of q's, built in buf, for sending.
func (e *Engine) emit(q *QP, buf []byte, dest netip.AddrPort, tos uint8) {
	e.emitScattered(q, buf, nil, dest, tos)
}

// emitScattered queues a packet of q's whose header and trailer are built
// in buf and whose payload, when not nil, stays where it lies (see
// OutPacket.Payload).
func (e *Engine) emitScattered(q *QP, buf, payload []byte, dest netip.AddrPort, tos uint8) {
	e.outq = append(e.outq, OutPacket{Buf: buf, Payload: payload, Dest: dest, TOS: tos, QPN: q.num, DestQPN: bth.BTH(buf).DestQP()})
	e.Stats.SentPkts.Add(1)
	if len(e.outq) >= outBatch {
		e.flush()
	}
}

// flush hands queued packets to the output and reclaims the slab.
func (e *Engine) flush() {
	if len(e.outq) == 0 {
		e.slabOff = 0
		return
	}
	e.cfg.Out.Emit(e.outq)
	clear(e.outq)
	e.outq = e.outq[:0]
	e.slabOff = 0
}

// buf returns a buffer of n bytes (at most MaxPacket) for the next packet:
// the next free bytes of the slab, flushing the queue first when the slab
// is full. Consecutive packets are adjacent in memory, so the Output can
// send a message's packets as one GSO run. The buffer is valid until the
// next flush; one that is not emitted must be returned with unbuf before
// the next call to buf.
func (e *Engine) buf(n int) []byte {
	if e.slab == nil {
		e.slab = make([]byte, slabSize)
		e.outq = make([]OutPacket, 0, outBatch)
	}
	if e.slabOff+n > len(e.slab) {
		e.flush()
	}
	b := e.slab[e.slabOff : e.slabOff+n]
	e.slabOff += n
	return b
}

// unbuf gives back the buffer the last buf call returned, unsent.
func (e *Engine) unbuf(b []byte) { e.slabOff -= len(b) }

// packetsFor returns how many packets (PSNs) a message of n bytes takes.
func packetsFor(n uint32, mtu int) int {
	if n == 0 {
		return 1
	}
	return int((uint64(n) + uint64(mtu) - 1) / uint64(mtu))
}

// wireOverhead approximates a packet's bytes beyond its payload on the
// wire (Ethernet, IP, UDP, BTH and ICRC), for pacing and byte counting.
const wireOverhead = 14 + 20 + 8 + 12 + 16 + 4

// header starts a packet: it returns the buffer sized for op with a
// payload of n bytes and the BTH filled in.
func (e *Engine) header(q *QP, op bth.Opcode, psn bth.PSN, n int, ackReq, se bool, destQPN uint32) ([]byte, bth.Packet) {
	return e.headerFor(q, op, psn, n, false, ackReq, se, destQPN)
}

// headerFor is header for a payload of n bytes that is copied into the
// buffer (scattered false) or left where it lies (scattered: the buffer
// then holds only the header and the trailer, pad and ICRC).
func (e *Engine) headerFor(q *QP, op bth.Opcode, psn bth.PSN, n int, scattered, ackReq, se bool, destQPN uint32) ([]byte, bth.Packet) {
	in := op.Info()
	inBuf := n
	if scattered {
		inBuf = 0
	}
	size := in.HdrLen + inBuf + bth.PadFor(n) + bth.ICRCLen
	buf := e.buf(size)
	b := bth.BTH(buf)
	b.SetOpcode(op)
	b.SetFlags(se, false, bth.PadFor(n), 0)
	b.SetPKey(bth.DefaultPKey)
	b.SetFECN(false) // the slab holds an earlier packet's bytes
	b.SetBECN(false)
	b.SetDestQP(destQPN) // and clears byte 4's reserved bits
	b.SetAckReq(ackReq)
	b.SetPSN(psn)
	clear(buf[in.HdrLen+inBuf : size])
	return buf, bth.Packet{Raw: buf, Info: in}
}

// position is the opcode flag of a packet's place in its message.
func position(first, last bool) bth.Flags {
	switch {
	case first && last:
		return bth.Only
	case first:
		return bth.First
	case last:
		return bth.Last
	}
	return bth.Middle
}
