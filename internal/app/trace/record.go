// Package trace turns captured frames into per-packet RoCEv2 records: the
// addresses and IP fields a reader of a trace needs, and every BTH and
// extended header field, in wire units. `rxego trace` prints them as text
// or JSON lines; later tools (ladder diagrams, live capture) build on the
// same Record.
//
// Frames are decoded with gopacket and the rocelayer package, so a trace
// sees exactly what any gopacket program sees.
package trace

import (
	"math/bits"
	"net/netip"
	"strconv"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/rocelayer"
)

// Record is one RoCEv2 packet of a trace. JSON keys are given in the field
// tags; all numbers are emitted as exact JSON integers (encoding/json
// writes uint64 digits verbatim, never through float64).
type Record struct {
	Frame   int        `json:"frame"` // 1-based frame number in the capture
	Time    time.Time  `json:"time"`  // capture timestamp (RFC 3339 in JSON)
	Src     netip.Addr `json:"src"`
	Dst     netip.Addr `json:"dst"`
	SrcPort uint16     `json:"src_port"`
	DstPort uint16     `json:"dst_port"`
	IPID    *uint16    `json:"ip_id,omitempty"` // IPv4 Identification; nil for IPv6
	DSCP    uint8      `json:"dscp"`
	ECN     uint8      `json:"ecn"`

	// GSO is set on a packet that the capture saw inside a UDP GSO
	// datagram, before the kernel cut it into the segments the peer
	// receives, and that the trace cut out as the kernel does.
	GSO *GSOSegment `json:"gso,omitempty"`

	// RoCE holds the decoded packet; it is nil when Error is set, so a
	// malformed packet carries no made-up header values.
	*RoCE

	// Error says why a frame sent to or from UDP port 4791 is not a valid
	// RoCEv2 packet (truncated, unknown opcode, bad pad, ...).
	Error string `json:"error,omitempty"`
}

// RoCE is the transport part of a Record: every BTH field and the
// extended headers present for the opcode (nil when absent).
type RoCE struct {
	Opcode     bth.Opcode `json:"opcode"`
	OpcodeName string     `json:"opcode_name"`
	DestQP     uint32     `json:"dqpn"`
	PSN        bth.PSN    `json:"psn"`
	AckReq     bool       `json:"ackreq"`
	SE         bool       `json:"se"`
	MigReq     bool       `json:"migreq"`
	Pad        uint8      `json:"pad"`
	TVer       uint8      `json:"tver"`
	PKey       uint16     `json:"pkey"`
	FECN       bool       `json:"fecn"`
	BECN       bool       `json:"becn"`
	PayloadLen int        `json:"payload_len"` // without pad bytes
	// ICRCWire is the ICRC's four bytes as they are on the wire, in hex,
	// as Wireshark shows them ("0x0b09ea84"); ICRC is the same bytes read
	// little-endian, the value hash/crc32 computes, also in hex in JSON
	// (icrc_crc32 "0x84ea090b"): both are one ICRC, not two.
	ICRC     HexU32 `json:"icrc_crc32"`
	ICRCWire string `json:"icrc_wire"`
	ICRCOK   bool   `json:"icrc_ok"`

	RETH      *RETH      `json:"reth,omitempty"`
	AETH      *AETH      `json:"aeth,omitempty"`
	Imm       *uint32    `json:"imm,omitempty"`
	IETHRKey  *uint32    `json:"ieth_rkey,omitempty"`
	Atomic    *Atomic    `json:"atomic,omitempty"`
	AtomicAck *AtomicAck `json:"atomic_ack,omitempty"`
	DETH      *DETH      `json:"deth,omitempty"`
	FETH      *uint32    `json:"feth,omitempty"`

	// CM is the connection manager message of a UD SEND to QP1.
	CM *CM `json:"cm,omitempty"`
}

// GSOSegment places a packet in the GSO datagram it was cut from.
type GSOSegment struct {
	Index int `json:"index"` // 1-based
	Count int `json:"count"` // segments in the datagram
	Size  int `json:"size"`  // segment size: UDP payload bytes of each but the last
	// Inferred is set when the size was found from the RoCE headers (each
	// segment a BTH for the same QP with the next PSN, the first one's
	// ICRC checking) because the kernel did not say (before 6.2).
	Inferred bool `json:"inferred,omitempty"`
}

// RETH is the RDMA extended header.
type RETH struct {
	VA     uint64 `json:"va"`
	RKey   uint32 `json:"rkey"`
	DMALen uint32 `json:"dma_len"`
}

// AETH is the ACK extended header.
type AETH struct {
	Syndrome uint8  `json:"syndrome"`
	MSN      uint32 `json:"msn"`
}

// Atomic is the AtomicETH of CompareSwap and FetchAdd.
type Atomic struct {
	VA      uint64 `json:"va"`
	RKey    uint32 `json:"rkey"`
	SwapAdd uint64 `json:"swap_add"`
	Compare uint64 `json:"compare"`
}

// AtomicAck is the AtomicAckETH of an ATOMIC ACKNOWLEDGE.
type AtomicAck struct {
	Orig uint64 `json:"orig"`
}

// DETH is the datagram extended header of UD packets.
type DETH struct {
	QKey  uint32 `json:"qkey"`
	SrcQP uint32 `json:"src_qp"`
}

// FromFrame decodes one captured frame of link type link (an Ethernet,
// Linux cooked or raw IP frame, say) and returns its record; ok is false
// when the frame is not UDP to or from port 4791.
func FromFrame(frame int, ts time.Time, link gopacket.Decoder, data []byte) (rec Record, ok bool) {
	p := gopacket.NewPacket(data, link, gopacket.DecodeOptions{NoCopy: true})
	return FromPacket(frame, ts, p)
}

// FromPacket builds the record of a decoded gopacket packet captured at ts
// (kept in UTC); ok is false
// when it has no UDP layer to or from port 4791. A packet whose RoCE layer
// failed to decode gives a record with Error set.
func FromPacket(frame int, ts time.Time, p gopacket.Packet) (rec Record, ok bool) {
	var ip gopacket.Layer
	var udp *layers.UDP
	var r *rocelayer.RoCE
	for _, l := range p.Layers() {
		switch v := l.(type) {
		case *layers.IPv4, *layers.IPv6:
			ip = v
		case *layers.UDP:
			if v.SrcPort == rocelayer.Port || v.DstPort == rocelayer.Port {
				udp = v
			}
		case *rocelayer.RoCE:
			r = v
		}
		if r != nil {
			break
		}
	}
	if udp == nil {
		return Record{}, false
	}
	rec = Record{Frame: frame, Time: ts.UTC(), SrcPort: uint16(udp.SrcPort), DstPort: uint16(udp.DstPort)}
	switch v := ip.(type) {
	case *layers.IPv4:
		rec.Src, _ = netip.AddrFromSlice(v.SrcIP.To4())
		rec.Dst, _ = netip.AddrFromSlice(v.DstIP.To4())
		rec.IPID = ptr(v.Id)
		rec.DSCP, rec.ECN = v.TOS>>2, v.TOS&3
	case *layers.IPv6:
		rec.Src, _ = netip.AddrFromSlice(v.SrcIP.To16())
		rec.Dst, _ = netip.AddrFromSlice(v.DstIP.To16())
		rec.DSCP, rec.ECN = v.TrafficClass>>2, v.TrafficClass&3
	}
	if r == nil {
		// gopacket calls no decoder for an empty payload.
		rec.Error = "no RoCEv2 packet in a " + strconv.Itoa(len(udp.Payload)) + "-byte UDP payload"
		if el := p.ErrorLayer(); el != nil {
			rec.Error = el.Error().Error()
		}
		return rec, true
	}
	rec.RoCE = fromLayer(r)
	return rec, true
}

// fromLayer copies a decoded RoCE layer into a record's transport part.
func fromLayer(r *rocelayer.RoCE) *RoCE {
	h := &r.Header
	in := h.Opcode.Info()
	t := &RoCE{
		Opcode: h.Opcode, OpcodeName: in.Name, DestQP: h.DestQP, PSN: h.PSN,
		AckReq: h.AckReq, SE: h.SE, MigReq: h.MigReq, Pad: h.Pad, TVer: h.TVer, PKey: h.PKey,
		FECN: h.FECN, BECN: h.BECN, PayloadLen: len(r.LayerPayload()),
		ICRC: HexU32(r.ICRC), ICRCWire: WireICRC(r.ICRC), ICRCOK: r.ICRCChecked && r.ICRCValid,
	}
	has := func(e bth.Ext) bool { return in.Ext&e != 0 }
	if has(bth.ExtRETH) {
		t.RETH = &RETH{h.RETH.VA, h.RETH.RKey, h.RETH.DMALen}
	}
	if has(bth.ExtAETH) {
		t.AETH = &AETH{uint8(h.AETH.Syndrome), h.AETH.MSN}
	}
	if has(bth.ExtImmDt) {
		t.Imm = ptr(h.Imm)
	}
	if has(bth.ExtIETH) {
		t.IETHRKey = ptr(h.IETHRKey)
	}
	if has(bth.ExtAtomicETH) {
		t.Atomic = &Atomic{h.Atomic.VA, h.Atomic.RKey, h.Atomic.SwapAdd, h.Atomic.Compare}
	}
	if has(bth.ExtAtomicAckETH) {
		t.AtomicAck = &AtomicAck{h.AtomicAck}
	}
	if has(bth.ExtDETH) {
		t.DETH = &DETH{h.DETH.QKey, h.DETH.SrcQP}
	}
	if has(bth.ExtFETH) {
		t.FETH = ptr(h.FETH)
	}
	t.CM = decodeCM(h.Opcode, h.DestQP, r.LayerPayload())
	return t
}

// HexU32 is a 32-bit value JSON shows as "0x" and eight hex digits.
type HexU32 uint32

// MarshalJSON implements json.Marshaler.
func (v HexU32) MarshalJSON() ([]byte, error) {
	return []byte(`"0x` + string(hex(make([]byte, 0, 8), uint64(v), 8)) + `"`), nil
}

// WireICRC formats an ICRC value (its bytes read little-endian) as its
// wire bytes in hex, "0x" and eight digits, as Wireshark shows it.
func WireICRC(v uint32) string {
	return "0x" + string(hex(make([]byte, 0, 8), uint64(bits.ReverseBytes32(v)), 8))
}

// ptr returns a pointer to a copy of v, so a record keeps no reference
// into the decoded layer or the frame.
func ptr[T any](v T) *T { return &v }
