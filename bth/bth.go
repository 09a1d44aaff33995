// Package bth is the RoCEv2 wire layer: the Base Transport Header as a
// zero-allocation view over bytes, the one opcode table that drives every
// encoder and decoder, 24-bit PSN arithmetic, and the packet parser and
// builder that place the extended headers of package reth where the table
// says they go.
//
// A RoCEv2 packet, as carried in the payload of a UDP datagram to port 4791,
// is: BTH (12 bytes), the opcode's extended headers in table order, the
// payload plus 0..3 pad bytes, and the 4-byte ICRC (see package icrc).
//
// bth imports reth (for header lengths and views) and nothing else of ours.
package bth

import "encoding/binary"

// Len is the length of the Base Transport Header in bytes.
const Len = 12

// ICRCLen is the length of the invariant CRC that ends every packet.
const ICRCLen = 4

// DefaultPKey is the default partition key (full membership, partition 0x7fff),
// the only one RoCEv2 devices normally use.
const DefaultPKey = 0xffff

// BTH is a view over the 12 bytes of a Base Transport Header.
//
//	byte 0     opcode
//	byte 1     SE(7) M(6) PadCnt(5..4) TVer(3..0)
//	bytes 2-3  P_Key
//	byte 4     FECN(7) BECN(6) reserved(5..0)  (the byte the ICRC masks)
//	bytes 5-7  destination QP
//	byte 8     AckReq(7) reserved(6..0)
//	bytes 9-11 PSN
type BTH []byte

// Opcode returns the opcode.
func (b BTH) Opcode() Opcode { return Opcode(b[0]) }

// SE reports the solicited event bit.
func (b BTH) SE() bool { return b[1]&0x80 != 0 }

// MigReq reports the migration request bit (M).
func (b BTH) MigReq() bool { return b[1]&0x40 != 0 }

// PadCount returns the number of pad bytes (0..3) after the payload.
func (b BTH) PadCount() int { return int(b[1]>>4) & 3 }

// TVer returns the transport header version (0 for IBTA 1.x).
func (b BTH) TVer() uint8 { return b[1] & 0xf }

// PKey returns the partition key.
func (b BTH) PKey() uint16 { return binary.BigEndian.Uint16(b[2:4]) }

// FECN reports the forward explicit congestion notification bit.
func (b BTH) FECN() bool { return b[4]&0x80 != 0 }

// BECN reports the backward explicit congestion notification bit.
func (b BTH) BECN() bool { return b[4]&0x40 != 0 }

// Resv6 returns the six reserved bits of byte 4 (sent as zero).
func (b BTH) Resv6() uint8 { return b[4] & 0x3f }

// DestQP returns the 24-bit destination QP number.
func (b BTH) DestQP() uint32 { return uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7]) }

// AckReq reports whether the requester asks for an acknowledgement.
func (b BTH) AckReq() bool { return b[8]&0x80 != 0 }

// Resv7 returns the seven reserved bits of byte 8 (sent as zero).
func (b BTH) Resv7() uint8 { return b[8] & 0x7f }

// PSN returns the 24-bit packet sequence number.
func (b BTH) PSN() PSN { return PSN(uint32(b[9])<<16 | uint32(b[10])<<8 | uint32(b[11])) }

// SetOpcode sets the opcode.
func (b BTH) SetOpcode(op Opcode) { b[0] = byte(op) }

// SetFlags sets SE, M, the pad count and TVer in one write.
func (b BTH) SetFlags(se, mig bool, pad int, tver uint8) {
	v := byte(pad&3)<<4 | tver&0xf
	if se {
		v |= 0x80
	}
	if mig {
		v |= 0x40
	}
	b[1] = v
}

// SetSE sets or clears the solicited event bit.
func (b BTH) SetSE(on bool) { setBit(&b[1], 0x80, on) }

// SetPadCount sets the pad count (0..3).
func (b BTH) SetPadCount(pad int) { b[1] = b[1]&^0x30 | byte(pad&3)<<4 }

// SetPKey sets the partition key.
func (b BTH) SetPKey(p uint16) { binary.BigEndian.PutUint16(b[2:4], p) }

// SetFECN sets or clears FECN.
func (b BTH) SetFECN(on bool) { setBit(&b[4], 0x80, on) }

// SetBECN sets or clears BECN.
func (b BTH) SetBECN(on bool) { setBit(&b[4], 0x40, on) }

// SetDestQP sets the 24-bit destination QP number and clears the reserved
// bits of byte 4 except FECN and BECN.
func (b BTH) SetDestQP(qpn uint32) {
	b[4] &= 0xc0
	b[5], b[6], b[7] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
}

// SetAckReq sets or clears AckReq (the reserved bits of byte 8 are zeroed).
func (b BTH) SetAckReq(on bool) {
	b[8] = 0
	if on {
		b[8] = 0x80
	}
}

// SetPSN sets the 24-bit PSN.
func (b BTH) SetPSN(p PSN) { b[9], b[10], b[11] = byte(p>>16), byte(p>>8), byte(p) }

// SetRaw writes bytes 4 and 8 verbatim, reserved bits included, so a packet
// re-encoded from decoded fields reproduces the original bytes exactly.
func (b BTH) SetRaw(byte4, byte8 uint8) { b[4], b[8] = byte4, byte8 }

func setBit(p *byte, mask byte, on bool) {
	if on {
		*p |= mask
	} else {
		*p &^= mask
	}
}
