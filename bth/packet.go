package bth

import (
	"encoding/binary"
	"errors"

	"github.com/rxego/rxego/reth"
)

// Parse errors. They are sentinel values so a receive path can count drops
// by reason without allocating.
var (
	ErrTruncated     = errors.New("bth: packet shorter than its headers and ICRC")
	ErrUnknownOpcode = errors.New("bth: unknown opcode")
	ErrTVer          = errors.New("bth: unsupported transport version")
	ErrPayload       = errors.New("bth: payload or pad count not allowed for opcode")
	ErrAtomicWrite   = errors.New("bth: ATOMIC WRITE payload must be 8 bytes")
	ErrBufferSmall   = errors.New("bth: buffer too small")
	ErrAlign         = errors.New("bth: payload plus pad is not a multiple of 4 bytes")
)

// Packet is a parsed RoCEv2 packet: the UDP payload from the BTH through the
// ICRC, plus the table row of its opcode. It is a small value; its header
// accessors return views into Raw and never allocate.
type Packet struct {
	Raw  []byte // BTH .. ICRC
	Info *Info
}

// Parse checks b (a UDP payload) against the opcode table and returns the
// packet. Lengths, opcode, transport version and pad count (payload plus
// pad must fill whole 4-byte words) are checked; the
// ICRC is not (see package icrc), and neither is anything that needs QP
// state.
func Parse(b []byte) (Packet, error) {
	if len(b) < Len+ICRCLen {
		return Packet{}, ErrTruncated
	}
	h := BTH(b)
	in, ok := Lookup(h.Opcode())
	if !ok {
		return Packet{}, ErrUnknownOpcode
	}
	if h.TVer() != 0 {
		return Packet{}, ErrTVer
	}
	if len(b) < in.HdrLen+ICRCLen {
		return Packet{}, ErrTruncated
	}
	body := len(b) - in.HdrLen - ICRCLen // payload plus pad
	pad := h.PadCount()
	if in.Flags&Payload == 0 {
		if body != 0 || pad != 0 {
			return Packet{}, ErrPayload
		}
	} else if pad > body {
		return Packet{}, ErrPayload
	} else if body&3 != 0 {
		// The pad count exists to align the payload; a body it does not
		// align is truncated or mis-built, and would not re-encode.
		return Packet{}, ErrAlign
	}
	if in.Op == OpAtomicWrite && body-pad != 8 {
		return Packet{}, ErrAtomicWrite
	}
	return Packet{Raw: b, Info: in}, nil
}

// BTH returns the base header.
func (p Packet) BTH() BTH { return BTH(p.Raw[:Len]) }

func (p Packet) ext(e Ext, n int) []byte {
	off := p.Info.Offset(e)
	if off < 0 {
		return nil
	}
	return p.Raw[off : off+n]
}

// RETH returns the RETH, or nil when the opcode has none.
func (p Packet) RETH() reth.RETH { return p.ext(ExtRETH, reth.RETHLen) }

// AETH returns the AETH, or nil.
func (p Packet) AETH() reth.AETH { return p.ext(ExtAETH, reth.AETHLen) }

// AtomicETH returns the AtomicETH, or nil.
func (p Packet) AtomicETH() reth.AtomicETH { return p.ext(ExtAtomicETH, reth.AtomicETHLen) }

// AtomicAckETH returns the AtomicAckETH, or nil.
func (p Packet) AtomicAckETH() reth.AtomicAckETH {
	return p.ext(ExtAtomicAckETH, reth.AtomicAckETHLen)
}

// ImmDt returns the immediate data header, or nil.
func (p Packet) ImmDt() reth.ImmDt { return p.ext(ExtImmDt, reth.ImmDtLen) }

// IETH returns the invalidate header, or nil.
func (p Packet) IETH() reth.IETH { return p.ext(ExtIETH, reth.IETHLen) }

// DETH returns the datagram header, or nil.
func (p Packet) DETH() reth.DETH { return p.ext(ExtDETH, reth.DETHLen) }

// FETH returns the flush header, or nil.
func (p Packet) FETH() reth.FETH { return p.ext(ExtFETH, reth.FETHLen) }

// RDETH returns the reliable datagram header, or nil.
func (p Packet) RDETH() reth.RDETH { return p.ext(ExtRDETH, reth.RDETHLen) }

// CNP returns the CNP body, or nil.
func (p Packet) CNP() reth.CNP { return p.ext(ExtCNP, reth.CNPLen) }

// Payload returns the payload without pad bytes.
func (p Packet) Payload() []byte {
	end := len(p.Raw) - ICRCLen - BTH(p.Raw).PadCount()
	return p.Raw[p.Info.HdrLen:end]
}

// ICRC returns the packet's ICRC as stored (little-endian on the wire).
func (p Packet) ICRC() uint32 { return binary.LittleEndian.Uint32(p.Raw[len(p.Raw)-ICRCLen:]) }

// Header is every field of a RoCEv2 packet's headers as a plain value, for
// code where a copy is clearer than a view: tests, traces, tools. Fields of
// extended headers the opcode does not carry are ignored by Encode and left
// zero by Decode.
type Header struct {
	Opcode Opcode
	SE     bool
	MigReq bool
	Pad    uint8 // decoded pad count; Encode derives its own from the payload
	TVer   uint8
	PKey   uint16
	FECN   bool
	BECN   bool
	Resv6  uint8 // reserved bits of BTH byte 4, kept so re-encoding is exact
	DestQP uint32
	AckReq bool
	Resv7  uint8 // reserved bits of BTH byte 8
	PSN    PSN

	RETH      RETHFields
	AETH      AETHFields
	Atomic    AtomicFields
	AtomicAck uint64 // AtomicAckETH original value
	Imm       uint32 // ImmDt
	IETHRKey  uint32
	DETH      DETHFields
	FETH      uint32 // the whole FETH word
	RDETH     uint32 // the whole RDETH word
}

// RETHFields are the RETH's fields.
type RETHFields struct {
	VA     uint64
	RKey   uint32
	DMALen uint32
}

// AETHFields are the AETH's fields.
type AETHFields struct {
	Syndrome reth.Syndrome
	MSN      uint32
}

// AtomicFields are the AtomicETH's fields.
type AtomicFields struct {
	VA      uint64
	RKey    uint32
	SwapAdd uint64
	Compare uint64
}

// DETHFields are the DETH's fields.
type DETHFields struct {
	QKey  uint32
	SrcQP uint32
}

// Decode copies every header field of p into a Header.
func (p Packet) Decode() Header {
	b := p.BTH()
	h := Header{
		Opcode: b.Opcode(), SE: b.SE(), MigReq: b.MigReq(), Pad: uint8(b.PadCount()),
		TVer: b.TVer(), PKey: b.PKey(), FECN: b.FECN(), BECN: b.BECN(), Resv6: b.Resv6(),
		DestQP: b.DestQP(), AckReq: b.AckReq(), Resv7: b.Resv7(), PSN: b.PSN(),
	}
	if r := p.RETH(); r != nil {
		h.RETH = RETHFields{r.VA(), r.RKey(), r.DMALen()}
	}
	if a := p.AETH(); a != nil {
		h.AETH = AETHFields{a.Syndrome(), a.MSN()}
	}
	if a := p.AtomicETH(); a != nil {
		h.Atomic = AtomicFields{a.VA(), a.RKey(), a.SwapAdd(), a.Compare()}
	}
	if a := p.AtomicAckETH(); a != nil {
		h.AtomicAck = a.Orig()
	}
	if i := p.ImmDt(); i != nil {
		h.Imm = i.Imm()
	}
	if i := p.IETH(); i != nil {
		h.IETHRKey = i.RKey()
	}
	if d := p.DETH(); d != nil {
		h.DETH = DETHFields{d.QKey(), d.SrcQP()}
	}
	if f := p.FETH(); f != nil {
		h.FETH = f.Raw()
	}
	if r := p.RDETH(); r != nil {
		h.RDETH = binary.BigEndian.Uint32(r)
	}
	return h
}

// PadFor returns the pad count that brings a payload to a 4-byte multiple.
func PadFor(payloadLen int) int { return -payloadLen & 3 }

// PacketLen returns the length of a packet with this opcode and payload
// length, ICRC included, or -1 for an unknown opcode.
func PacketLen(op Opcode, payloadLen int) int {
	in, ok := Lookup(op)
	if !ok {
		return -1
	}
	return in.HdrLen + payloadLen + PadFor(payloadLen) + ICRCLen
}

// Encode writes the headers of h, then payload, zero pad bytes and a zero
// ICRC placeholder into buf, and returns the packet length. The pad count
// written is derived from len(payload); the ICRC is left for package icrc
// to fill in once the IP and UDP headers are known.
func (h *Header) Encode(buf []byte, payload []byte) (int, error) {
	in, ok := Lookup(h.Opcode)
	if !ok {
		return 0, ErrUnknownOpcode
	}
	if len(payload) > 0 && in.Flags&Payload == 0 {
		return 0, ErrPayload
	}
	if in.Op == OpAtomicWrite && len(payload) != 8 {
		return 0, ErrAtomicWrite
	}
	pad := PadFor(len(payload))
	n := in.HdrLen + len(payload) + pad + ICRCLen
	if len(buf) < n {
		return 0, ErrBufferSmall
	}
	b := BTH(buf)
	b.SetOpcode(h.Opcode)
	b.SetFlags(h.SE, h.MigReq, pad, h.TVer)
	b.SetPKey(h.PKey)
	b4 := h.Resv6 & 0x3f
	if h.FECN {
		b4 |= 0x80
	}
	if h.BECN {
		b4 |= 0x40
	}
	b8 := h.Resv7 & 0x7f
	if h.AckReq {
		b8 |= 0x80
	}
	b.SetDestQP(h.DestQP)
	b.SetRaw(b4, b8)
	b.SetPSN(h.PSN)
	p := Packet{Raw: buf[:n], Info: in}
	if r := p.RETH(); r != nil {
		r.Set(h.RETH.VA, h.RETH.RKey, h.RETH.DMALen)
	}
	if a := p.AETH(); a != nil {
		a.Set(h.AETH.Syndrome, h.AETH.MSN)
	}
	if a := p.AtomicETH(); a != nil {
		a.Set(h.Atomic.VA, h.Atomic.RKey, h.Atomic.SwapAdd, h.Atomic.Compare)
	}
	if a := p.AtomicAckETH(); a != nil {
		a.SetOrig(h.AtomicAck)
	}
	if i := p.ImmDt(); i != nil {
		i.SetImm(h.Imm)
	}
	if i := p.IETH(); i != nil {
		i.SetRKey(h.IETHRKey)
	}
	if d := p.DETH(); d != nil {
		d.Set(h.DETH.QKey, h.DETH.SrcQP)
	}
	if f := p.FETH(); f != nil {
		binary.BigEndian.PutUint32(f, h.FETH)
	}
	if r := p.RDETH(); r != nil {
		binary.BigEndian.PutUint32(r, h.RDETH)
	}
	if c := p.CNP(); c != nil {
		c.Clear()
	}
	copy(buf[in.HdrLen:], payload)
	clear(buf[in.HdrLen+len(payload) : n])
	return n, nil
}
