package bth

import (
	"strconv"

	"github.com/rxego/rxego/reth"
)

// Opcode is the BTH opcode: the top three bits select the transport class
// (RC 000, UC 001, RD 010, UD 011, CNP 100), the low five the operation.
type Opcode uint8

// Class is the transport service class of an opcode.
type Class uint8

// Transport classes.
const (
	RC  Class = 0
	UC  Class = 1
	RD  Class = 2
	UD  Class = 3
	CNP Class = 4
)

var classNames = [...]string{RC: "RC", UC: "UC", RD: "RD", UD: "UD", CNP: "CNP"}

// String returns "RC", "UC", "RD", "UD" or "CNP".
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "class" + strconv.Itoa(int(c))
}

// Op is what an opcode does, independent of its class and position.
type Op uint8

// Operations.
const (
	OpSend Op = iota + 1
	OpWrite
	OpReadRequest
	OpReadResponse
	OpAck
	OpAtomicAck
	OpCompareSwap
	OpFetchAdd
	OpFlush
	OpAtomicWrite
	OpCNP
)

// Ext is a bit set of extended headers.
type Ext uint16

// Extended headers, in the order they follow the BTH on the wire.
const (
	ExtRDETH Ext = 1 << iota
	ExtDETH
	ExtFETH
	ExtRETH
	ExtAtomicETH
	ExtAETH
	ExtAtomicAckETH
	ExtImmDt
	ExtIETH
	ExtCNP
	numExt = iota
)

// extLens gives each extended header's length, indexed by bit position.
var extLens = [numExt]int{
	reth.RDETHLen, reth.DETHLen, reth.FETHLen, reth.RETHLen, reth.AtomicETHLen,
	reth.AETHLen, reth.AtomicAckETHLen, reth.ImmDtLen, reth.IETHLen, reth.CNPLen,
}

// Flags describe an opcode's place in a message and what it carries.
type Flags uint16

// Opcode flags.
const (
	First    Flags = 1 << iota // first packet of a message
	Middle                     // middle packet
	Last                       // last packet (Only = First|Last)
	Payload                    // a payload may follow the headers
	Request                    // sent by a requester
	Response                   // sent by a responder
	Imm                        // carries immediate data
	Inv                        // carries an rkey to invalidate
	Only     = First | Last
)

// Info is one row of the opcode table.
type Info struct {
	Opcode Opcode
	Name   string // e.g. "RC_SEND_FIRST"
	Class  Class
	Op     Op
	Flags  Flags
	Ext    Ext
	HdrLen int // BTH plus extended headers
	// offsets of each present extended header from the start of the BTH
	off [numExt]uint8
}

// Has reports whether f are all set for this opcode.
func (in *Info) Has(f Flags) bool { return in.Flags&f == f }

// Offset returns where extended header e starts (counted from the BTH), or
// -1 when the opcode does not carry it.
func (in *Info) Offset(e Ext) int {
	if in.Ext&e == 0 {
		return -1
	}
	return int(in.off[bitIndex(e)])
}

func bitIndex(e Ext) int {
	for i := 0; i < numExt; i++ {
		if e == 1<<i {
			return i
		}
	}
	return -1
}

var table [256]Info
var valid [256]bool

// byShape indexes the table by what an encoder knows: class, operation,
// position (First, Middle, Last or Only) and whether it carries immediate
// data or an rkey to invalidate. It holds opcode+1, 0 for none.
var byShape [8][16][8][4]uint16

// shape returns byShape's indices of position and carried flags.
func shape(f Flags) (pos, with int) {
	return int(f & (First | Middle | Last)), int(f&(Imm|Inv)) >> 6
}

// Find returns the opcode of class c that does op at position pos (First,
// Middle, Last or Only) and carries with (0, Imm or Inv), as the table has
// it; ok is false when the table has no such opcode. Encoders pick their
// opcodes with it, so the table stays the one source of them.
func Find(c Class, op Op, pos, with Flags) (_ Opcode, ok bool) {
	p, w := shape(pos&(First|Middle|Last) | with&(Imm|Inv))
	if int(c) >= len(byShape) || int(op) >= len(byShape[0]) {
		return 0, false
	}
	v := byShape[c][op][p][w]
	if v == 0 {
		return 0, false
	}
	return Opcode(v - 1), true
}

// Lookup returns the table row for op, or false when op is not a RoCEv2
// opcode rxego knows.
func Lookup(op Opcode) (*Info, bool) {
	return &table[op], valid[op]
}

// Info returns the table row for op, or nil when unknown.
func (op Opcode) Info() *Info {
	if !valid[op] {
		return nil
	}
	return &table[op]
}

// String returns the opcode's name, or its number in hex when unknown.
func (op Opcode) String() string {
	if valid[op] {
		return table[op].Name
	}
	return "OPCODE_0x" + strconv.FormatUint(uint64(op), 16)
}

// Opcodes in use by RoCEv2 RC, UC and UD, plus CNP. RD opcodes are in the
// table for decoding but have no named constants: RoCEv2 does not carry RD.
const (
	RCSendFirst          Opcode = 0x00
	RCSendMiddle         Opcode = 0x01
	RCSendLast           Opcode = 0x02
	RCSendLastImm        Opcode = 0x03
	RCSendOnly           Opcode = 0x04
	RCSendOnlyImm        Opcode = 0x05
	RCWriteFirst         Opcode = 0x06
	RCWriteMiddle        Opcode = 0x07
	RCWriteLast          Opcode = 0x08
	RCWriteLastImm       Opcode = 0x09
	RCWriteOnly          Opcode = 0x0a
	RCWriteOnlyImm       Opcode = 0x0b
	RCReadRequest        Opcode = 0x0c
	RCReadResponseFirst  Opcode = 0x0d
	RCReadResponseMiddle Opcode = 0x0e
	RCReadResponseLast   Opcode = 0x0f
	RCReadResponseOnly   Opcode = 0x10
	RCAck                Opcode = 0x11
	RCAtomicAck          Opcode = 0x12
	RCCompareSwap        Opcode = 0x13
	RCFetchAdd           Opcode = 0x14
	RCSendLastInv        Opcode = 0x16
	RCSendOnlyInv        Opcode = 0x17
	RCFlush              Opcode = 0x1c
	RCAtomicWrite        Opcode = 0x1d
	UCSendFirst          Opcode = 0x20
	UCSendMiddle         Opcode = 0x21
	UCSendLast           Opcode = 0x22
	UCSendLastImm        Opcode = 0x23
	UCSendOnly           Opcode = 0x24
	UCSendOnlyImm        Opcode = 0x25
	UCWriteFirst         Opcode = 0x26
	UCWriteMiddle        Opcode = 0x27
	UCWriteLast          Opcode = 0x28
	UCWriteLastImm       Opcode = 0x29
	UCWriteOnly          Opcode = 0x2a
	UCWriteOnlyImm       Opcode = 0x2b
	UDSendOnly           Opcode = 0x64
	UDSendOnlyImm        Opcode = 0x65
	CNPOpcode            Opcode = 0x81
)

// Positions in the family table that the class rules key on.
const (
	classShift                       = 5
	udSendOnlyLow             Opcode = 0x04
	udSendOnlyImmLow          Opcode = 0x05
	sendWriteFamilyLastOpcode Opcode = 0x0b // UC has SEND and RDMA WRITE only
)

// row describes one operation of a class-independent family.
type row struct {
	low   Opcode
	name  string
	op    Op
	flags Flags
	ext   Ext
}

// family lists the operations shared by RC, UC and RD (the first twelve)
// and by RC and RD (the rest up to FETCH_ADD), then RC's own.
var family = []row{
	{0x00, "SEND_FIRST", OpSend, First | Payload | Request, 0},
	{0x01, "SEND_MIDDLE", OpSend, Middle | Payload | Request, 0},
	{0x02, "SEND_LAST", OpSend, Last | Payload | Request, 0},
	{0x03, "SEND_LAST_WITH_IMMEDIATE", OpSend, Last | Payload | Request | Imm, ExtImmDt},
	{0x04, "SEND_ONLY", OpSend, Only | Payload | Request, 0},
	{0x05, "SEND_ONLY_WITH_IMMEDIATE", OpSend, Only | Payload | Request | Imm, ExtImmDt},
	{0x06, "RDMA_WRITE_FIRST", OpWrite, First | Payload | Request, ExtRETH},
	{0x07, "RDMA_WRITE_MIDDLE", OpWrite, Middle | Payload | Request, 0},
	{0x08, "RDMA_WRITE_LAST", OpWrite, Last | Payload | Request, 0},
	{0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", OpWrite, Last | Payload | Request | Imm, ExtImmDt},
	{0x0a, "RDMA_WRITE_ONLY", OpWrite, Only | Payload | Request, ExtRETH},
	{0x0b, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", OpWrite, Only | Payload | Request | Imm, ExtRETH | ExtImmDt},
	{0x0c, "RDMA_READ_REQUEST", OpReadRequest, Only | Request, ExtRETH},
	{0x0d, "RDMA_READ_RESPONSE_FIRST", OpReadResponse, First | Payload | Response, ExtAETH},
	{0x0e, "RDMA_READ_RESPONSE_MIDDLE", OpReadResponse, Middle | Payload | Response, 0},
	{0x0f, "RDMA_READ_RESPONSE_LAST", OpReadResponse, Last | Payload | Response, ExtAETH},
	{0x10, "RDMA_READ_RESPONSE_ONLY", OpReadResponse, Only | Payload | Response, ExtAETH},
	{0x11, "ACKNOWLEDGE", OpAck, Only | Response, ExtAETH},
	{0x12, "ATOMIC_ACKNOWLEDGE", OpAtomicAck, Only | Response, ExtAETH | ExtAtomicAckETH},
	{0x13, "COMPARE_SWAP", OpCompareSwap, Only | Request, ExtAtomicETH},
	{0x14, "FETCH_ADD", OpFetchAdd, Only | Request, ExtAtomicETH},
	{0x16, "SEND_LAST_WITH_INVALIDATE", OpSend, Last | Payload | Request | Inv, ExtIETH},
	{0x17, "SEND_ONLY_WITH_INVALIDATE", OpSend, Only | Payload | Request | Inv, ExtIETH},
	{0x1c, "FLUSH", OpFlush, Only | Request, ExtFETH | ExtRETH},
	{0x1d, "ATOMIC_WRITE", OpAtomicWrite, Only | Payload | Request, ExtRETH},
}

func init() {
	for _, r := range family {
		add(Opcode(RC)<<classShift|r.low, "RC_"+r.name, RC, r)
		if r.low <= sendWriteFamilyLastOpcode {
			add(Opcode(UC)<<classShift|r.low, "UC_"+r.name, UC, r)
		}
		if r.low <= RCFetchAdd {
			rd := r
			if r.flags&Request != 0 {
				rd.ext |= ExtRDETH | ExtDETH
			} else {
				rd.ext |= ExtRDETH
			}
			add(Opcode(RD)<<classShift|r.low, "RD_"+r.name, RD, rd)
		}
		if r.low == udSendOnlyLow || r.low == udSendOnlyImmLow {
			ud := r
			ud.ext |= ExtDETH
			add(Opcode(UD)<<classShift|r.low, "UD_"+r.name, UD, ud)
		}
	}
	add(CNPOpcode, "CNP", CNP, row{op: OpCNP, flags: Only, ext: ExtCNP})
}

func add(op Opcode, name string, c Class, r row) {
	in := Info{Opcode: op, Name: name, Class: c, Op: r.op, Flags: r.flags, Ext: r.ext}
	off := Len
	for i := 0; i < numExt; i++ {
		if r.ext&(1<<i) != 0 {
			in.off[i] = uint8(off)
			off += extLens[i]
		}
	}
	in.HdrLen = off
	table[op] = in
	valid[op] = true
	p, w := shape(r.flags)
	byShape[c][r.op][p][w] = uint16(op) + 1
}
