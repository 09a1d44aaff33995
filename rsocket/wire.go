package rsocket

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Message operations: the top 3 bits of every immediate (rsocket.c's
// RS_OP_*). The lower 29 bits are the operation's datum.
const (
	opData     = 0 // bytes written into the receive buffer
	opWrite    = 2 // direct placement (riowrite); never on the wire, marks local completions
	opSGL      = 4 // credit update, possibly with a target SGE written
	opIOMapSGL = 6 // an iomap entry was written
	opCtrl     = 7 // a control message (ctrl*)
)

// Control messages (RS_CTRL_*).
const (
	ctrlDisconnect = 0
	ctrlKeepalive  = 1
	ctrlShutdown   = 2
)

func msgSet(op, data uint32) uint32 { return op<<29 | data&0x1fffffff }
func msgOp(m uint32) uint32         { return m >> 29 }
func msgData(m uint32) uint32       { return m & 0x1fffffff }

// Protocol sizes and limits.
const (
	connDataSize  = 40 // struct rs_conn_data
	sgeSize       = 16 // struct rs_sge
	iomapSize     = 24 // struct rs_iomap
	sglEntries    = 2  // RS_SGL_SIZE: the receive buffer's two halves
	ctrlSlots     = 4  // RS_QP_CTRL_SIZE: control messages in flight
	maxTransfer   = 65536
	sendLowWater  = 2048 // RS_SNDLOWAT
	minQueue      = 16   // RS_QP_MIN_SIZE
	maxQueue      = 0xfffe
	protoVersion  = 1
	flagNet       = 1 << 0 // RS_CONN_FLAG_NET: the host is big-endian
	flagIOMap     = 1 << 1 // RS_CONN_FLAG_IOMAP: the target iomap size is valid
	recvWRFlag    = 1 << 63
	defaultBuffer = 1 << 17 // def_mem, def_wmem
	defaultQueue  = 384     // def_sqsize, def_rqsize
	defaultInline = 64
)

// sge is struct rs_sge: a region of the peer's memory.
type sge struct {
	addr   uint64
	key    uint32
	length uint32
}

func getSGE(o binary.ByteOrder, b []byte) sge {
	return sge{addr: o.Uint64(b), key: o.Uint32(b[8:]), length: o.Uint32(b[12:])}
}

func (s sge) put(o binary.ByteOrder, b []byte) {
	o.PutUint64(b, s.addr)
	o.PutUint32(b[8:], s.key)
	o.PutUint32(b[12:], s.length)
}

// connData is struct rs_conn_data, the private data of the REQ and REP.
// On the wire every field is big-endian.
type connData struct {
	version   uint8
	flags     uint8
	credits   uint16
	iomapSize uint8 // target iomap entries, scaled (rs_value_to_scale)
	targetSGL sge   // the target SGL: address, rkey, entries
	dataBuf   sge   // the first half of the receive buffer
}

func (d connData) marshal() []byte {
	b := make([]byte, connDataSize)
	b[0], b[1] = d.version, d.flags
	binary.BigEndian.PutUint16(b[2:], d.credits)
	b[7] = d.iomapSize
	d.targetSGL.put(binary.BigEndian, b[8:])
	d.dataBuf.put(binary.BigEndian, b[24:])
	return b
}

// errBadConnData reports a peer whose private data is no rsocket's.
var errBadConnData = errors.New("rsocket: peer's connection data is not rsocket v1")

func parseConnData(b []byte) (connData, error) {
	if len(b) < connDataSize {
		return connData{}, fmt.Errorf("%w: %d bytes, want %d", errBadConnData, len(b), connDataSize)
	}
	d := connData{version: b[0], flags: b[1], credits: binary.BigEndian.Uint16(b[2:]), iomapSize: b[7],
		targetSGL: getSGE(binary.BigEndian, b[8:]), dataBuf: getSGE(binary.BigEndian, b[24:])}
	if d.version != protoVersion {
		return d, fmt.Errorf("%w: version %d", errBadConnData, d.version)
	}
	if d.targetSGL.length == 0 || d.targetSGL.length > 64 || d.dataBuf.length == 0 || d.credits == 0 {
		return d, fmt.Errorf("%w: target SGL of %d entries, data buffer of %d bytes, %d credits",
			errBadConnData, d.targetSGL.length, d.dataBuf.length, d.credits)
	}
	return d, nil
}

// scaleOf and valueOf are rsocket's 8-bit encoding of the iomap size
// (rs_value_to_scale, rs_scale_to_value): values up to 128 as they are,
// larger ones as a multiple of 256 with the top bit set.
func scaleOf(v int) uint8 {
	if v <= 128 {
		return uint8(v)
	}
	return uint8(128 | v>>8)
}

func valueOf(s uint8) int {
	if s <= 128 {
		return int(s)
	}
	return int(s&^128) << 8
}

// hostIsNet tells whether this host is big-endian, rsocket's NET flag.
var hostIsNet = binary.NativeEndian.Uint16([]byte{0, 1}) == 1

// orderOf is the byte order of a peer with the given connection flags:
// SGEs and iomap entries are written into it in its own order.
func orderOf(flags uint8) binary.ByteOrder {
	if flags&flagNet != 0 {
		return binary.BigEndian
	}
	return binary.LittleEndian
}
