package qp

import (
	"github.com/rxego/rxego/internal/iphdr"
)

// GRHLen is the space a UD receive buffer reserves for the GRH.
const GRHLen = 40

// respondUD delivers a UD datagram into the next receive WQE, after the
// 40 bytes verbs reserves for the GRH: for RoCEv2 over IPv4 that space
// holds 20 zero bytes and then the IPv4 header, over IPv6 the IPv6 header.
func (e *Engine) respondUD(q *QP, in *InPacket) {
	p := in.Pkt
	d := p.DETH()
	if d.QKey() != q.attr.QKey {
		e.drop(DropBadQKey)
		return
	}
	payload := p.Payload()
	if len(payload) > q.mtuOrMax() {
		e.drop(DropBadLength)
		return
	}
	w, ok := q.takeRecv()
	if !ok && in.Dest.IsMulticast() {
		e.drop(DropMcastNoRecvWQE)
		q.mcastNoRecv.Add(1)
		return
	}
	if !ok {
		e.drop(DropNoRecvWQE)
		return
	}
	var grh [GRHLen]byte
	fillGRH(grh[:], in)
	err := e.scatter(q.pd, w.sgl(), 0, grh[:])
	if err == nil {
		err = e.scatter(q.pd, w.sgl(), GRHLen, payload)
	}
	if err != nil {
		q.pushWC(q.recvCQ, WC{ID: w.id, Status: WCLocLenErr, Opcode: WCRecv, QPN: q.num})
		return
	}
	wc := WC{ID: w.id, Opcode: WCRecv, ByteLen: uint32(GRHLen + len(payload)), QPN: q.num,
		SrcQP: d.SrcQP(), Flags: WCWithGRH, Src: in.Src}
	if h := p.ImmDt(); h != nil {
		wc.Imm, wc.Flags = h.Imm(), wc.Flags|WCWithImm
	}
	e.Stats.RcvdBytes.Add(uint64(len(payload)))
	q.pushWC(q.recvCQ, wc)
}

// fillGRH synthesizes the IP header a UD receiver finds in its GRH space;
// a UDP socket does not show the real one, so the fields the kernel would
// vary (ID, checksum) are left zero.
func fillGRH(g []byte, in *InPacket) {
	roceLen := len(in.Pkt.Raw)
	src, dst := in.Src.Addr(), in.Dest
	if src.Is4() || src.Is4In6() {
		f := iphdr.IPv4Fields{TOS: in.TOS, TotalLength: uint16(iphdr.IPv4Len + iphdr.UDPLen + roceLen),
			DF: true, TTL: 64, Protocol: iphdr.ProtoUDP, Src: src.Unmap().As4()}
		if dst.IsValid() {
			f.Dst = dst.Unmap().As4()
		}
		iphdr.IPv4(g[GRHLen-iphdr.IPv4Len:]).Encode(&f) // the last 20 bytes, as verbs puts it
		return
	}
	f := iphdr.IPv6Fields{TrafficClass: in.TOS, PayloadLength: uint16(iphdr.UDPLen + roceLen),
		NextHeader: iphdr.ProtoUDP, HopLimit: 64, Src: src.As16()}
	if dst.IsValid() {
		f.Dst = dst.As16()
	}
	iphdr.IPv6(g).Encode(&f)
}
