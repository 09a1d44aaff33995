// Package reth holds the InfiniBand extended transport headers that follow
// the BTH in a RoCEv2 packet: RETH, AETH, AtomicETH, AtomicAckETH, ImmDt,
// IETH, DETH, FETH, RDETH and the CNP body.
//
// Each header is a view over a byte slice in the style of gVisor's
// pkg/tcpip/header: accessors decode in place and setters encode in place,
// so neither direction allocates. A view must be at least its header's
// length long; callers obtain views from the bth packet parser, which checks
// lengths once against the opcode table. All multi-byte fields are big-endian
// on the wire, as IBTA specifies.
package reth

import (
	"encoding/binary"
	"strconv"
)

// Header lengths in bytes.
const (
	RETHLen         = 16
	AETHLen         = 4
	AtomicETHLen    = 28
	AtomicAckETHLen = 8
	ImmDtLen        = 4
	IETHLen         = 4
	DETHLen         = 8
	FETHLen         = 4
	RDETHLen        = 4
	CNPLen          = 16
)

// RETH is the RDMA Extended Transport Header: virtual address, remote key
// and DMA length of an RDMA WRITE, READ, FLUSH or ATOMIC WRITE.
type RETH []byte

// VA returns the remote virtual address.
func (h RETH) VA() uint64 { return binary.BigEndian.Uint64(h[0:8]) }

// RKey returns the remote key.
func (h RETH) RKey() uint32 { return binary.BigEndian.Uint32(h[8:12]) }

// DMALen returns the DMA length of the whole message in bytes.
func (h RETH) DMALen() uint32 { return binary.BigEndian.Uint32(h[12:16]) }

// Set writes all RETH fields.
func (h RETH) Set(va uint64, rkey, dmaLen uint32) {
	binary.BigEndian.PutUint64(h[0:8], va)
	binary.BigEndian.PutUint32(h[8:12], rkey)
	binary.BigEndian.PutUint32(h[12:16], dmaLen)
}

// AETH is the ACK Extended Transport Header: an 8-bit syndrome and the
// 24-bit message sequence number.
type AETH []byte

// Syndrome returns the raw syndrome byte.
func (h AETH) Syndrome() Syndrome { return Syndrome(h[0]) }

// MSN returns the 24-bit message sequence number.
func (h AETH) MSN() uint32 { return uint32(h[1])<<16 | uint32(h[2])<<8 | uint32(h[3]) }

// Set writes the syndrome and MSN (MSN is truncated to 24 bits).
func (h AETH) Set(s Syndrome, msn uint32) {
	h[0] = byte(s)
	h[1], h[2], h[3] = byte(msn>>16), byte(msn>>8), byte(msn)
}

// Syndrome is the AETH syndrome: bits 6..5 select ACK, RNR NAK or NAK, bits
// 4..0 carry the credit count, the RNR timer or the NAK code.
type Syndrome uint8

// AckKind is the kind of an AETH syndrome.
type AckKind uint8

// Syndrome kinds (IBTA table 43).
const (
	KindACK      AckKind = 0 // 0b00: ACK, low bits are the credit count
	KindRNR      AckKind = 1 // 0b01: RNR NAK, low bits are the RNR timer
	KindReserved AckKind = 2 // 0b10: reserved
	KindNAK      AckKind = 3 // 0b11: NAK, low bits are the NAK code
)

// NAK codes carried in the low five bits of a NAK syndrome.
const (
	NAKPSNSeqError    uint8 = 0 // PSN sequence error
	NAKInvalidRequest uint8 = 1 // invalid request
	NAKRemoteAccess   uint8 = 2 // remote access error
	NAKRemoteOp       uint8 = 3 // remote operational error
	NAKInvalidRDReq   uint8 = 4 // invalid RD request
)

// CreditsInvalid is the credit count that says "no end-to-end credit
// information" (rxe always sends it).
const CreditsInvalid uint8 = 0x1f

// Kind returns whether the syndrome is an ACK, RNR NAK or NAK.
func (s Syndrome) Kind() AckKind { return AckKind(s>>5) & 3 }

// Value returns the low five bits: credits, RNR timer or NAK code.
func (s Syndrome) Value() uint8 { return uint8(s) & 0x1f }

// ACKSyndrome builds an ACK syndrome with the given credit count.
func ACKSyndrome(credits uint8) Syndrome { return Syndrome(credits & 0x1f) }

// RNRSyndrome builds an RNR NAK syndrome with the given 5-bit RNR timer.
func RNRSyndrome(timer uint8) Syndrome { return Syndrome(0x20 | timer&0x1f) }

// NAKSyndrome builds a NAK syndrome with the given NAK code.
func NAKSyndrome(code uint8) Syndrome { return Syndrome(0x60 | code&0x1f) }

// String names the syndrome the way a trace reader wants to see it.
func (s Syndrome) String() string {
	switch s.Kind() {
	case KindACK:
		return "ACK"
	case KindRNR:
		return "RNR_NAK(timer=" + strconv.Itoa(int(s.Value())) + ")"
	case KindNAK:
		switch s.Value() {
		case NAKPSNSeqError:
			return "NAK(PSN_SEQ_ERR)"
		case NAKInvalidRequest:
			return "NAK(INVALID_REQ)"
		case NAKRemoteAccess:
			return "NAK(REMOTE_ACCESS_ERR)"
		case NAKRemoteOp:
			return "NAK(REMOTE_OP_ERR)"
		case NAKInvalidRDReq:
			return "NAK(INVALID_RD_REQ)"
		}
		return "NAK(code=" + strconv.Itoa(int(s.Value())) + ")"
	}
	return "RESERVED(" + strconv.Itoa(int(s)) + ")"
}

// AtomicETH is the Atomic Extended Transport Header of CompareSwap and
// FetchAdd requests.
type AtomicETH []byte

// VA returns the remote virtual address (8-byte aligned for a valid request).
func (h AtomicETH) VA() uint64 { return binary.BigEndian.Uint64(h[0:8]) }

// RKey returns the remote key.
func (h AtomicETH) RKey() uint32 { return binary.BigEndian.Uint32(h[8:12]) }

// SwapAdd returns the swap value (CompareSwap) or the addend (FetchAdd).
func (h AtomicETH) SwapAdd() uint64 { return binary.BigEndian.Uint64(h[12:20]) }

// Compare returns the compare value (CompareSwap only).
func (h AtomicETH) Compare() uint64 { return binary.BigEndian.Uint64(h[20:28]) }

// Set writes all AtomicETH fields.
func (h AtomicETH) Set(va uint64, rkey uint32, swapAdd, compare uint64) {
	binary.BigEndian.PutUint64(h[0:8], va)
	binary.BigEndian.PutUint32(h[8:12], rkey)
	binary.BigEndian.PutUint64(h[12:20], swapAdd)
	binary.BigEndian.PutUint64(h[20:28], compare)
}

// AtomicAckETH carries the original remote value in an ATOMIC ACKNOWLEDGE.
type AtomicAckETH []byte

// Orig returns the value the remote location held before the atomic.
func (h AtomicAckETH) Orig() uint64 { return binary.BigEndian.Uint64(h[0:8]) }

// SetOrig writes the original value.
func (h AtomicAckETH) SetOrig(v uint64) { binary.BigEndian.PutUint64(h[0:8], v) }

// ImmDt is the 32-bit immediate data header.
type ImmDt []byte

// Imm returns the immediate data as it is on the wire (big-endian).
func (h ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(h[0:4]) }

// SetImm writes the immediate data.
func (h ImmDt) SetImm(v uint32) { binary.BigEndian.PutUint32(h[0:4], v) }

// IETH is the Invalidate Extended Transport Header of SEND with Invalidate.
type IETH []byte

// RKey returns the rkey the responder must invalidate.
func (h IETH) RKey() uint32 { return binary.BigEndian.Uint32(h[0:4]) }

// SetRKey writes the rkey to invalidate.
func (h IETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(h[0:4], v) }

// DETH is the Datagram Extended Transport Header of UD (and GSI) packets.
type DETH []byte

// QKey returns the queue key.
func (h DETH) QKey() uint32 { return binary.BigEndian.Uint32(h[0:4]) }

// SrcQP returns the 24-bit source QP number (the top byte is reserved).
func (h DETH) SrcQP() uint32 { return binary.BigEndian.Uint32(h[4:8]) & 0xffffff }

// Set writes the Q_Key and source QPN; the reserved byte is zeroed.
func (h DETH) Set(qkey, srcQP uint32) {
	binary.BigEndian.PutUint32(h[0:4], qkey)
	binary.BigEndian.PutUint32(h[4:8], srcQP&0xffffff)
}

// FETH is the Flush Extended Transport Header: the selectivity level
// (bits 5..4 of the last byte) and placement type (bits 3..0).
type FETH []byte

// SelectivityLevel returns 0 for "the memory region range" or 1 for "the
// whole memory region".
func (h FETH) SelectivityLevel() uint8 { return (h[3] >> 4) & 3 }

// PlacementType returns the placement type bits (1 global visibility,
// 2 persistence).
func (h FETH) PlacementType() uint8 { return h[3] & 0xf }

// Raw returns the whole 32-bit FETH word.
func (h FETH) Raw() uint32 { return binary.BigEndian.Uint32(h[0:4]) }

// Set writes the selectivity level and placement type; reserved bits zero.
func (h FETH) Set(selectivity, placement uint8) {
	binary.BigEndian.PutUint32(h[0:4], uint32(selectivity&3)<<4|uint32(placement&0xf))
}

// RDETH is the Reliable Datagram Extended Transport Header (EE context).
// RoCEv2 implementations do not use RD; the view exists so a decoder can
// name it.
type RDETH []byte

// EECnxt returns the 24-bit end-to-end context.
func (h RDETH) EECnxt() uint32 { return binary.BigEndian.Uint32(h[0:4]) & 0xffffff }

// CNP is the 16-byte reserved body of a RoCEv2 Congestion Notification
// Packet (opcode 0x81). All bytes are reserved and sent as zero.
type CNP []byte

// Clear zeroes the reserved body.
func (h CNP) Clear() { clear(h[:CNPLen]) }
