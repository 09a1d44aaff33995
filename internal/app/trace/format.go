package trace

import (
	"math/bits"
	"net/netip"
	"strconv"

	"github.com/rxego/rxego/reth"
)

// TimeFormat is how String prints a record's time: RFC 3339 in UTC with
// microseconds, the resolution of the captures.
const TimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// String formats the record as one line of `rxego trace`:
//
//	#12 2024-11-22T13:07:01.123456Z 198.18.0.12:49441 -> 198.18.0.11:4791 RC_RDMA_WRITE_FIRST dqpn=0x000011 psn=9323414 ackreq=1 reth(va=0x7fe8bf69e000 rkey=0x289 dma_len=2500) len=1024 icrc=ok
//
// A packet cut from a GSO datagram ends with gso(seg=I/N size=S).
// Flags that are normally clear (se, migreq, fecn, becn), a non-zero pad
// count and a non-default P_Key are shown only when set.
func (r *Record) String() string {
	b := make([]byte, 0, 160)
	b = append(b, '#')
	b = strconv.AppendInt(b, int64(r.Frame), 10)
	b = append(b, ' ')
	b = r.Time.UTC().AppendFormat(b, TimeFormat)
	b = append(b, ' ')
	b = netip.AddrPortFrom(r.Src, r.SrcPort).AppendTo(b)
	b = append(b, " -> "...)
	b = netip.AddrPortFrom(r.Dst, r.DstPort).AppendTo(b)
	if r.RoCE == nil {
		b = append(b, " error: "...)
		b = append(b, r.Error...)
		return string(b)
	}
	t := r.RoCE
	b = append(b, ' ')
	b = append(b, t.OpcodeName...)
	b = hex(append(b, " dqpn=0x"...), uint64(t.DestQP), 6)
	b = strconv.AppendUint(append(b, " psn="...), uint64(t.PSN), 10)
	b = flag(append(b, " ackreq="...), t.AckReq)
	for _, f := range []struct {
		name string
		on   bool
	}{{"se", t.SE}, {"migreq", t.MigReq}, {"fecn", t.FECN}, {"becn", t.BECN}} {
		if f.on {
			b = append(append(append(b, ' '), f.name...), "=1"...)
		}
	}
	if t.Pad != 0 {
		b = strconv.AppendUint(append(b, " pad="...), uint64(t.Pad), 10)
	}
	if t.PKey != 0xffff {
		b = hex(append(b, " pkey=0x"...), uint64(t.PKey), 4)
	}
	if e := t.RETH; e != nil {
		b = hex(append(b, " reth(va=0x"...), e.VA, 1)
		b = hex(append(b, " rkey=0x"...), uint64(e.RKey), 1)
		b = strconv.AppendUint(append(b, " dma_len="...), uint64(e.DMALen), 10)
		b = append(b, ')')
	}
	if e := t.AETH; e != nil {
		b = hex(append(b, " aeth(syndrome=0x"...), uint64(e.Syndrome), 2)
		b = append(append(b, ' '), reth.Syndrome(e.Syndrome).String()...)
		b = strconv.AppendUint(append(b, " msn="...), uint64(e.MSN), 10)
		b = append(b, ')')
	}
	if t.Imm != nil {
		b = hex(append(b, " imm=0x"...), uint64(*t.Imm), 8)
	}
	if t.IETHRKey != nil {
		b = hex(append(b, " ieth_rkey=0x"...), uint64(*t.IETHRKey), 1)
	}
	if e := t.Atomic; e != nil {
		b = hex(append(b, " atomic(va=0x"...), e.VA, 1)
		b = hex(append(b, " rkey=0x"...), uint64(e.RKey), 1)
		b = strconv.AppendUint(append(b, " swap_add="...), e.SwapAdd, 10)
		b = strconv.AppendUint(append(b, " compare="...), e.Compare, 10)
		b = append(b, ')')
	}
	if e := t.AtomicAck; e != nil {
		b = strconv.AppendUint(append(b, " atomic_ack(orig="...), e.Orig, 10)
		b = append(b, ')')
	}
	if e := t.DETH; e != nil {
		b = hex(append(b, " deth(qkey=0x"...), uint64(e.QKey), 8)
		b = hex(append(b, " src_qp=0x"...), uint64(e.SrcQP), 6)
		b = append(b, ')')
	}
	if t.FETH != nil {
		b = hex(append(b, " feth=0x"...), uint64(*t.FETH), 8)
	}
	if t.CM != nil {
		b = append(append(b, ' '), t.CM.String()...)
	}
	b = strconv.AppendInt(append(b, " len="...), int64(t.PayloadLen), 10)
	if t.ICRCOK {
		b = append(b, " icrc=ok"...)
	} else {
		b = append(append(append(b, " icrc=bad("...), t.ICRCWire...), ')')
	}
	if g := r.GSO; g != nil {
		b = strconv.AppendInt(append(b, " gso(seg="...), int64(g.Index), 10)
		b = strconv.AppendInt(append(b, '/'), int64(g.Count), 10)
		b = strconv.AppendInt(append(b, " size="...), int64(g.Size), 10)
		if g.Inferred {
			b = append(b, " inferred"...)
		}
		b = append(b, ')')
	}
	return string(b)
}

// hex appends v in lower-case hex, zero-padded to at least width digits.
func hex(b []byte, v uint64, width int) []byte {
	for n := max((bits.Len64(v)+3)/4, 1); n < width; n++ {
		b = append(b, '0')
	}
	return strconv.AppendUint(b, v, 16)
}

// flag appends 1 or 0.
func flag(b []byte, on bool) []byte {
	if on {
		return append(b, '1')
	}
	return append(b, '0')
}
