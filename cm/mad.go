package cm

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// MAD layout constants.
const (
	MADSize    = 256 // every MAD on QP1
	HeaderSize = 24  // the common MAD header
	DataSize   = MADSize - HeaderSize

	BaseVersion  = 0x01 // IB_MGMT_BASE_VERSION
	ClassCM      = 0x07 // IB_MGMT_CLASS_CM
	ClassVersion = 0x02 // IB_CM_CLASS_VERSION
	MethodSend   = 0x03 // IB_MGMT_METHOD_SEND: every CM message
)

// Attribute IDs of the CM messages.
const (
	AttrREQ     uint16 = 0x0010
	AttrMRA     uint16 = 0x0011
	AttrREJ     uint16 = 0x0012
	AttrREP     uint16 = 0x0013
	AttrRTU     uint16 = 0x0014
	AttrDREQ    uint16 = 0x0015
	AttrDREP    uint16 = 0x0016
	AttrSIDRREQ uint16 = 0x0017
	AttrSIDRREP uint16 = 0x0018
	AttrLAP     uint16 = 0x0019
	AttrAPR     uint16 = 0x001a
)

var attrNames = map[uint16]string{
	AttrREQ: "REQ", AttrMRA: "MRA", AttrREJ: "REJ", AttrREP: "REP", AttrRTU: "RTU",
	AttrDREQ: "DREQ", AttrDREP: "DREP", AttrSIDRREQ: "SIDR_REQ", AttrSIDRREP: "SIDR_REP",
	AttrLAP: "LAP", AttrAPR: "APR",
}

// AttrName returns the message name of a CM attribute ID ("REQ", ...).
func AttrName(id uint16) string {
	if s, ok := attrNames[id]; ok {
		return s
	}
	return fmt.Sprintf("attr %#04x", id)
}

// Header is the common MAD header.
type Header struct {
	BaseVersion   uint8
	MgmtClass     uint8
	ClassVersion  uint8
	Method        uint8
	Status        uint16
	ClassSpecific uint16
	TID           uint64 // transaction ID
	AttrID        uint16
	AttrMod       uint32
}

// put writes h into b[:HeaderSize].
func (h *Header) put(b []byte) {
	b[0], b[1], b[2], b[3] = h.BaseVersion, h.MgmtClass, h.ClassVersion, h.Method
	binary.BigEndian.PutUint16(b[4:], h.Status)
	binary.BigEndian.PutUint16(b[6:], h.ClassSpecific)
	binary.BigEndian.PutUint64(b[8:], h.TID)
	binary.BigEndian.PutUint16(b[16:], h.AttrID)
	b[18], b[19] = 0, 0
	binary.BigEndian.PutUint32(b[20:], h.AttrMod)
}

// ParseHeader decodes the MAD header at the start of b.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: %d bytes, a MAD header has %d", ErrShort, len(b), HeaderSize)
	}
	return Header{
		BaseVersion: b[0], MgmtClass: b[1], ClassVersion: b[2], Method: b[3],
		Status:        binary.BigEndian.Uint16(b[4:]),
		ClassSpecific: binary.BigEndian.Uint16(b[6:]),
		TID:           binary.BigEndian.Uint64(b[8:]),
		AttrID:        binary.BigEndian.Uint16(b[16:]),
		AttrMod:       binary.BigEndian.Uint32(b[20:]),
	}, nil
}

// Errors of Unmarshal and Marshal.
var (
	ErrShort    = errors.New("cm: MAD too short")
	ErrNotCM    = errors.New("cm: not a CM MAD (base version 1, class 0x07, class version 2, method Send)")
	ErrUnknown  = errors.New("cm: CM attribute not supported")
	ErrField    = errors.New("cm: field out of range")
	ErrPrivData = errors.New("cm: private data too long")
)

// Message is one CM message: REQ, MRA, REJ, REP, RTU, DREQ, DREP,
// SIDR_REQ or SIDR_REP.
type Message interface {
	// AttrID returns the message's attribute ID.
	AttrID() uint16
	// put encodes the message into d, the zeroed 232-byte data area.
	put(d []byte) error
	// get decodes the message from d.
	get(d []byte)
}

// Marshal encodes m as a complete 256-byte CM MAD with transaction ID tid.
// Fields too wide for their bits, or private data longer than the
// message's room, are an error and nothing is written.
func Marshal(tid uint64, m Message) ([MADSize]byte, error) {
	var b [MADSize]byte
	if err := m.put(b[HeaderSize:]); err != nil {
		return [MADSize]byte{}, fmt.Errorf("cm: %s: %w", AttrName(m.AttrID()), err)
	}
	h := Header{BaseVersion: BaseVersion, MgmtClass: ClassCM, ClassVersion: ClassVersion, Method: MethodSend,
		TID: tid, AttrID: m.AttrID()}
	h.put(b[:])
	return b, nil
}

// Unmarshal decodes a CM MAD. It accepts only class 0x07, class version 2,
// method Send and the connection messages; anything else is an error.
func Unmarshal(b []byte) (Header, Message, error) {
	if len(b) < MADSize {
		return Header{}, nil, fmt.Errorf("%w: %d bytes, want %d", ErrShort, len(b), MADSize)
	}
	h, _ := ParseHeader(b)
	if h.BaseVersion != BaseVersion || h.MgmtClass != ClassCM || h.ClassVersion != ClassVersion || h.Method != MethodSend {
		return h, nil, fmt.Errorf("%w: got %d/%#02x/%d/%#02x", ErrNotCM, h.BaseVersion, h.MgmtClass, h.ClassVersion, h.Method)
	}
	var m Message
	switch h.AttrID {
	case AttrREQ:
		m = new(REQ)
	case AttrMRA:
		m = new(MRA)
	case AttrREJ:
		m = new(REJ)
	case AttrREP:
		m = new(REP)
	case AttrRTU:
		m = new(RTU)
	case AttrDREQ:
		m = new(DREQ)
	case AttrDREP:
		m = new(DREP)
	case AttrSIDRREQ:
		m = new(SIDRREQ)
	case AttrSIDRREP:
		m = new(SIDRREP)
	default:
		return h, nil, fmt.Errorf("%w: %s", ErrUnknown, AttrName(h.AttrID))
	}
	m.get(b[HeaderSize:MADSize])
	return h, m, nil
}

// Bit-field helpers over the data area. Offsets are those of the IBA
// message tables minus the 24-byte MAD header.

func u24(b []byte) uint32       { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }
func putU24(b []byte, v uint32) { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }

// fit reports an error when v does not fit in bits bits.
func fit(name string, v uint64, bits uint) error {
	if v>>bits != 0 {
		return fmt.Errorf("%w: %s = %#x exceeds %d bits", ErrField, name, v, bits)
	}
	return nil
}

// fits checks several fields at once: name, value, bits triples.
func fits(fs ...fieldCheck) error {
	for _, f := range fs {
		if err := fit(f.name, f.v, f.bits); err != nil {
			return err
		}
	}
	return nil
}

type fieldCheck struct {
	name string
	v    uint64
	bits uint
}

// putPriv copies private data p into the field f, checking its room.
func putPriv(f, p []byte) error {
	if len(p) > len(f) {
		return fmt.Errorf("%w: %d bytes, room for %d", ErrPrivData, len(p), len(f))
	}
	copy(f, p)
	return nil
}

// getPriv returns a copy of a private data field.
func getPriv(f []byte) []byte { return append([]byte(nil), f...) }

func b2u(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}
