package cm

import (
	"encoding/binary"
	"fmt"
)

// Private data room of each message (IB_CM_*_PRIVATE_DATA_SIZE).
const (
	REQPrivateDataSize  = 92
	MRAPrivateDataSize  = 222
	REJPrivateDataSize  = 148
	REPPrivateDataSize  = 196
	RTUPrivateDataSize  = 224
	DREQPrivateDataSize = 220
	DREPPrivateDataSize = 224
	REJARISize          = 72
)

// Transport service types of a REQ.
const (
	TransportRC = 0
	TransportUC = 1
)

// Values of MRA's Message MRAed and REJ's Message REJected.
const (
	MsgREQ   = 0
	MsgREP   = 1
	MsgOther = 2
)

// REJ reasons (IBA table 112, enum ib_cm_rej_reason).
const (
	RejNoQP                 uint16 = 1
	RejNoResources          uint16 = 3
	RejTimeout              uint16 = 4
	RejUnsupported          uint16 = 5
	RejInvalidCommID        uint16 = 6
	RejInvalidServiceID     uint16 = 8
	RejInvalidTransportType uint16 = 9
	RejStaleConn            uint16 = 10
	RejInvalidGID           uint16 = 12
	RejInvalidMTU           uint16 = 26
	RejConsumerDefined      uint16 = 28
	RejInvalidRNRRetry      uint16 = 29
	RejInvalidClassVersion  uint16 = 31
)

// Path is a REQ's primary or alternate path. On RoCE the GIDs are the
// ports' IP addresses (IPv4-mapped for IPv4) and the LIDs are the
// permissive LID 0xffff.
type Path struct {
	LocalLID        uint16
	RemoteLID       uint16
	LocalGID        [16]byte
	RemoteGID       [16]byte
	FlowLabel       uint32 // 20 bits
	PacketRate      uint8  // 6 bits
	TrafficClass    uint8
	HopLimit        uint8
	SL              uint8 // 4 bits
	SubnetLocal     bool
	LocalACKTimeout uint8 // 5 bits: 4.096 us * 2^n
}

const pathSize = 44

func (p *Path) check() error {
	return fits(fieldCheck{"flow label", uint64(p.FlowLabel), 20}, fieldCheck{"packet rate", uint64(p.PacketRate), 6},
		fieldCheck{"SL", uint64(p.SL), 4}, fieldCheck{"local ACK timeout", uint64(p.LocalACKTimeout), 5})
}

func (p *Path) put(b []byte) {
	binary.BigEndian.PutUint16(b[0:], p.LocalLID)
	binary.BigEndian.PutUint16(b[2:], p.RemoteLID)
	copy(b[4:20], p.LocalGID[:])
	copy(b[20:36], p.RemoteGID[:])
	binary.BigEndian.PutUint32(b[36:], p.FlowLabel<<12|uint32(p.PacketRate))
	b[40] = p.TrafficClass
	b[41] = p.HopLimit
	b[42] = p.SL<<4 | b2u(p.SubnetLocal)<<3
	b[43] = p.LocalACKTimeout << 3
}

func (p *Path) get(b []byte) {
	p.LocalLID = binary.BigEndian.Uint16(b[0:])
	p.RemoteLID = binary.BigEndian.Uint16(b[2:])
	copy(p.LocalGID[:], b[4:20])
	copy(p.RemoteGID[:], b[20:36])
	w := binary.BigEndian.Uint32(b[36:])
	p.FlowLabel, p.PacketRate = w>>12, uint8(w&0x3f)
	p.TrafficClass = b[40]
	p.HopLimit = b[41]
	p.SL, p.SubnetLocal = b[42]>>4, b[42]&0x08 != 0
	p.LocalACKTimeout = b[43] >> 3
}

// REQ is a ConnectRequest.
type REQ struct {
	LocalCommID             uint32
	ServiceID               uint64
	LocalCAGUID             uint64
	LocalQKey               uint32
	LocalQPN                uint32 // 24 bits
	ResponderResources      uint8
	LocalEECN               uint32 // 24 bits
	InitiatorDepth          uint8
	RemoteEECN              uint32 // 24 bits
	RemoteCMResponseTimeout uint8  // 5 bits
	TransportType           uint8  // 2 bits: TransportRC, TransportUC
	FlowControl             bool
	StartingPSN             uint32 // 24 bits
	LocalCMResponseTimeout  uint8  // 5 bits
	RetryCount              uint8  // 3 bits
	PKey                    uint16
	PathMTU                 uint8 // 4 bits, ibv_mtu encoding
	RDCExists               bool
	RNRRetryCount           uint8 // 3 bits
	MaxCMRetries            uint8 // 4 bits
	SRQ                     bool
	ExtendedTransport       uint8 // 3 bits
	Primary                 Path
	Alternate               Path
	PrivateData             []byte // up to REQPrivateDataSize bytes
}

// AttrID returns AttrREQ.
func (*REQ) AttrID() uint16 { return AttrREQ }

func (m *REQ) put(d []byte) error {
	if err := fits(fieldCheck{"local QPN", uint64(m.LocalQPN), 24}, fieldCheck{"local EECN", uint64(m.LocalEECN), 24},
		fieldCheck{"remote EECN", uint64(m.RemoteEECN), 24},
		fieldCheck{"remote CM response timeout", uint64(m.RemoteCMResponseTimeout), 5},
		fieldCheck{"transport type", uint64(m.TransportType), 2}, fieldCheck{"starting PSN", uint64(m.StartingPSN), 24},
		fieldCheck{"local CM response timeout", uint64(m.LocalCMResponseTimeout), 5},
		fieldCheck{"retry count", uint64(m.RetryCount), 3}, fieldCheck{"path MTU", uint64(m.PathMTU), 4},
		fieldCheck{"RNR retry count", uint64(m.RNRRetryCount), 3}, fieldCheck{"max CM retries", uint64(m.MaxCMRetries), 4},
		fieldCheck{"extended transport", uint64(m.ExtendedTransport), 3}); err != nil {
		return err
	}
	if err := m.Primary.check(); err != nil {
		return err
	}
	if err := m.Alternate.check(); err != nil {
		return err
	}
	if err := putPriv(d[140:232], m.PrivateData); err != nil {
		return err
	}
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint64(d[8:], m.ServiceID)
	binary.BigEndian.PutUint64(d[16:], m.LocalCAGUID)
	binary.BigEndian.PutUint32(d[28:], m.LocalQKey)
	putU24(d[32:], m.LocalQPN)
	d[35] = m.ResponderResources
	putU24(d[36:], m.LocalEECN)
	d[39] = m.InitiatorDepth
	putU24(d[40:], m.RemoteEECN)
	d[43] = m.RemoteCMResponseTimeout<<3 | m.TransportType<<1 | b2u(m.FlowControl)
	putU24(d[44:], m.StartingPSN)
	d[47] = m.LocalCMResponseTimeout<<3 | m.RetryCount
	binary.BigEndian.PutUint16(d[48:], m.PKey)
	d[50] = m.PathMTU<<4 | b2u(m.RDCExists)<<3 | m.RNRRetryCount
	d[51] = m.MaxCMRetries<<4 | b2u(m.SRQ)<<3 | m.ExtendedTransport
	m.Primary.put(d[52 : 52+pathSize])
	m.Alternate.put(d[96 : 96+pathSize])
	return nil
}

func (m *REQ) get(d []byte) {
	m.LocalCommID = binary.BigEndian.Uint32(d[0:])
	m.ServiceID = binary.BigEndian.Uint64(d[8:])
	m.LocalCAGUID = binary.BigEndian.Uint64(d[16:])
	m.LocalQKey = binary.BigEndian.Uint32(d[28:])
	m.LocalQPN, m.ResponderResources = u24(d[32:]), d[35]
	m.LocalEECN, m.InitiatorDepth = u24(d[36:]), d[39]
	m.RemoteEECN = u24(d[40:])
	m.RemoteCMResponseTimeout, m.TransportType, m.FlowControl = d[43]>>3, d[43]>>1&3, d[43]&1 != 0
	m.StartingPSN = u24(d[44:])
	m.LocalCMResponseTimeout, m.RetryCount = d[47]>>3, d[47]&7
	m.PKey = binary.BigEndian.Uint16(d[48:])
	m.PathMTU, m.RDCExists, m.RNRRetryCount = d[50]>>4, d[50]&0x08 != 0, d[50]&7
	m.MaxCMRetries, m.SRQ, m.ExtendedTransport = d[51]>>4, d[51]&0x08 != 0, d[51]&7
	m.Primary.get(d[52 : 52+pathSize])
	m.Alternate.get(d[96 : 96+pathSize])
	m.PrivateData = getPriv(d[140:232])
}

// MRA is a MessageReceiptAcknowledgement: "I need more time".
type MRA struct {
	LocalCommID    uint32
	RemoteCommID   uint32
	MessageMRAed   uint8 // 2 bits: MsgREQ, MsgREP, MsgOther
	ServiceTimeout uint8 // 5 bits: 4.096 us * 2^n more
	PrivateData    []byte
}

// AttrID returns AttrMRA.
func (*MRA) AttrID() uint16 { return AttrMRA }

func (m *MRA) put(d []byte) error {
	if err := fits(fieldCheck{"message MRAed", uint64(m.MessageMRAed), 2},
		fieldCheck{"service timeout", uint64(m.ServiceTimeout), 5}); err != nil {
		return err
	}
	if err := putPriv(d[10:232], m.PrivateData); err != nil {
		return err
	}
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	d[8] = m.MessageMRAed << 6
	d[9] = m.ServiceTimeout << 3
	return nil
}

func (m *MRA) get(d []byte) {
	m.LocalCommID = binary.BigEndian.Uint32(d[0:])
	m.RemoteCommID = binary.BigEndian.Uint32(d[4:])
	m.MessageMRAed = d[8] >> 6
	m.ServiceTimeout = d[9] >> 3
	m.PrivateData = getPriv(d[10:232])
}

// REJ is a ConnectReject.
type REJ struct {
	LocalCommID     uint32
	RemoteCommID    uint32
	MessageRejected uint8 // 2 bits: MsgREQ, MsgREP, MsgOther
	Reason          uint16
	// ARI is the additional rejection information, up to REJARISize bytes;
	// its length goes in the message's 7-bit length field.
	ARI         []byte
	PrivateData []byte
}

// AttrID returns AttrREJ.
func (*REJ) AttrID() uint16 { return AttrREJ }

func (m *REJ) put(d []byte) error {
	if err := fit("message rejected", uint64(m.MessageRejected), 2); err != nil {
		return err
	}
	if len(m.ARI) > REJARISize {
		return fmt.Errorf("%w: ARI of %d bytes exceeds %d", ErrField, len(m.ARI), REJARISize)
	}
	if err := putPriv(d[84:232], m.PrivateData); err != nil {
		return err
	}
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	d[8] = m.MessageRejected << 6
	d[9] = uint8(len(m.ARI)) << 1
	binary.BigEndian.PutUint16(d[10:], m.Reason)
	copy(d[12:84], m.ARI)
	return nil
}

func (m *REJ) get(d []byte) {
	m.LocalCommID = binary.BigEndian.Uint32(d[0:])
	m.RemoteCommID = binary.BigEndian.Uint32(d[4:])
	m.MessageRejected = d[8] >> 6
	n := min(int(d[9]>>1), REJARISize)
	m.Reason = binary.BigEndian.Uint16(d[10:])
	m.ARI = getPriv(d[12 : 12+n])
	m.PrivateData = getPriv(d[84:232])
}

// REP is a ConnectReply.
type REP struct {
	LocalCommID        uint32
	RemoteCommID       uint32
	LocalQKey          uint32
	LocalQPN           uint32 // 24 bits
	LocalEECN          uint32 // 24 bits
	StartingPSN        uint32 // 24 bits
	ResponderResources uint8
	InitiatorDepth     uint8
	TargetACKDelay     uint8 // 5 bits
	FailoverAccepted   uint8 // 2 bits
	FlowControl        bool
	RNRRetryCount      uint8 // 3 bits
	SRQ                bool
	LocalCAGUID        uint64
	PrivateData        []byte
}

// AttrID returns AttrREP.
func (*REP) AttrID() uint16 { return AttrREP }

func (m *REP) put(d []byte) error {
	if err := fits(fieldCheck{"local QPN", uint64(m.LocalQPN), 24}, fieldCheck{"local EECN", uint64(m.LocalEECN), 24},
		fieldCheck{"starting PSN", uint64(m.StartingPSN), 24}, fieldCheck{"target ACK delay", uint64(m.TargetACKDelay), 5},
		fieldCheck{"failover accepted", uint64(m.FailoverAccepted), 2},
		fieldCheck{"RNR retry count", uint64(m.RNRRetryCount), 3}); err != nil {
		return err
	}
	if err := putPriv(d[36:232], m.PrivateData); err != nil {
		return err
	}
	binary.BigEndian.PutUint32(d[0:], m.LocalCommID)
	binary.BigEndian.PutUint32(d[4:], m.RemoteCommID)
	binary.BigEndian.PutUint32(d[8:], m.LocalQKey)
	putU24(d[12:], m.LocalQPN)
	putU24(d[16:], m.LocalEECN)
	putU24(d[20:], m.StartingPSN)
	d[24] = m.ResponderResources
	d[25] = m.InitiatorDepth
	d[26] = m.TargetACKDelay<<3 | m.FailoverAccepted<<1 | b2u(m.FlowControl)
	d[27] = m.RNRRetryCount<<5 | b2u(m.SRQ)<<4
	binary.BigEndian.PutUint64(d[28:], m.LocalCAGUID)
	return nil
}

func (m *REP) get(d []byte) {
	m.LocalCommID = binary.BigEndian.Uint32(d[0:])
	m.RemoteCommID = binary.BigEndian.Uint32(d[4:])
	m.LocalQKey = binary.BigEndian.Uint32(d[8:])
	m.LocalQPN = u24(d[12:])
	m.LocalEECN = u24(d[16:])
	m.StartingPSN = u24(d[20:])
	m.ResponderResources = d[24]
	m.InitiatorDepth = d[25]
	m.TargetACKDelay, m.FailoverAccepted, m.FlowControl = d[26]>>3, d[26]>>1&3, d[26]&1 != 0
	m.RNRRetryCount, m.SRQ = d[27]>>5, d[27]&0x10 != 0
	m.LocalCAGUID = binary.BigEndian.Uint64(d[28:])
	m.PrivateData = getPriv(d[36:232])
}

// RTU is a ReadyToUse.
type RTU struct {
	LocalCommID  uint32
	RemoteCommID uint32
	PrivateData  []byte
}

// AttrID returns AttrRTU.
func (*RTU) AttrID() uint16 { return AttrRTU }

func (m *RTU) put(d []byte) error { return putIDs(d, m.LocalCommID, m.RemoteCommID, 8, m.PrivateData) }

func (m *RTU) get(d []byte) { m.LocalCommID, m.RemoteCommID, m.PrivateData = getIDs(d, 8) }

// DREQ is a DisconnectRequest.
type DREQ struct {
	LocalCommID  uint32
	RemoteCommID uint32
	RemoteQPN    uint32 // 24 bits: the receiver's QP
	PrivateData  []byte
}

// AttrID returns AttrDREQ.
func (*DREQ) AttrID() uint16 { return AttrDREQ }

func (m *DREQ) put(d []byte) error {
	if err := fit("remote QPN", uint64(m.RemoteQPN), 24); err != nil {
		return err
	}
	if err := putIDs(d, m.LocalCommID, m.RemoteCommID, 12, m.PrivateData); err != nil {
		return err
	}
	putU24(d[8:], m.RemoteQPN)
	return nil
}

func (m *DREQ) get(d []byte) {
	m.LocalCommID, m.RemoteCommID, m.PrivateData = getIDs(d, 12)
	m.RemoteQPN = u24(d[8:])
}

// DREP is a DisconnectReply.
type DREP struct {
	LocalCommID  uint32
	RemoteCommID uint32
	PrivateData  []byte
}

// AttrID returns AttrDREP.
func (*DREP) AttrID() uint16 { return AttrDREP }

func (m *DREP) put(d []byte) error { return putIDs(d, m.LocalCommID, m.RemoteCommID, 8, m.PrivateData) }

func (m *DREP) get(d []byte) { m.LocalCommID, m.RemoteCommID, m.PrivateData = getIDs(d, 8) }

// putIDs writes the two communication IDs every message but REQ starts
// with and private data from offset priv to the end.
func putIDs(d []byte, local, remote uint32, priv int, p []byte) error {
	if err := putPriv(d[priv:DataSize], p); err != nil {
		return err
	}
	binary.BigEndian.PutUint32(d[0:], local)
	binary.BigEndian.PutUint32(d[4:], remote)
	return nil
}

func getIDs(d []byte, priv int) (local, remote uint32, p []byte) {
	return binary.BigEndian.Uint32(d[0:]), binary.BigEndian.Uint32(d[4:]), getPriv(d[priv:DataSize])
}
