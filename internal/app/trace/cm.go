package trace

import (
	"strconv"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/cm"
)

// CM is the connection manager message (IBA chapter 12) that a UD SEND to
// QP1 carries: what rping, rdma_cm and perftest -R exchange to connect.
// Fields a message does not carry are left out (nil).
type CM struct {
	Msg          string `json:"msg"` // REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP
	AttrID       uint16 `json:"attr_id"`
	TID          uint64 `json:"tid"` // MAD transaction ID
	LocalCommID  uint32 `json:"local_comm_id"`
	RemoteCommID uint32 `json:"remote_comm_id"` // 0 in a REQ, which has none yet
	// LocalQPN is the sender's QP (REQ, REP): the QP the connection will
	// use. StartingPSN is the first PSN the sender expects: its peer's
	// requests start there (so rping's server sends from the REQ's PSN,
	// its client from the REP's, as rxe and rxego's cm do).
	LocalQPN    *uint32 `json:"local_qpn,omitempty"`
	StartingPSN *uint32 `json:"starting_psn,omitempty"`
	// RemoteQPN is the receiver's QP (DREQ).
	RemoteQPN *uint32 `json:"remote_qpn,omitempty"`
	ServiceID *uint64 `json:"service_id,omitempty"` // REQ, SIDR_REQ, SIDR_REP
	Reason    *uint16 `json:"reason,omitempty"`     // REJ
	// Error says why a MAD to QP1 did not decode as a CM connection
	// message (another management class, a LAP, a short MAD).
	Error string `json:"error,omitempty"`
}

// decodeCM decodes the CM message of a UD SEND Only to QP1, or returns
// nil for any other packet.
func decodeCM(op bth.Opcode, dqpn uint32, payload []byte) *CM {
	if op != bth.UDSendOnly || dqpn != 1 {
		return nil
	}
	h, m, err := cm.Unmarshal(payload)
	c := &CM{Msg: cm.AttrName(h.AttrID), AttrID: h.AttrID, TID: h.TID}
	if err != nil {
		c.Error = err.Error()
		return c
	}
	switch m := m.(type) {
	case *cm.REQ:
		c.LocalCommID, c.LocalQPN, c.StartingPSN, c.ServiceID = m.LocalCommID, ptr(m.LocalQPN), ptr(m.StartingPSN), ptr(m.ServiceID)
	case *cm.REP:
		c.LocalCommID, c.RemoteCommID, c.LocalQPN, c.StartingPSN = m.LocalCommID, m.RemoteCommID, ptr(m.LocalQPN), ptr(m.StartingPSN)
	case *cm.REJ:
		c.LocalCommID, c.RemoteCommID, c.Reason = m.LocalCommID, m.RemoteCommID, ptr(m.Reason)
	case *cm.MRA:
		c.LocalCommID, c.RemoteCommID = m.LocalCommID, m.RemoteCommID
	case *cm.RTU:
		c.LocalCommID, c.RemoteCommID = m.LocalCommID, m.RemoteCommID
	case *cm.DREQ:
		c.LocalCommID, c.RemoteCommID, c.RemoteQPN = m.LocalCommID, m.RemoteCommID, ptr(m.RemoteQPN)
	case *cm.DREP:
		c.LocalCommID, c.RemoteCommID = m.LocalCommID, m.RemoteCommID
	case *cm.SIDRREQ: // UD (udaddy): the request ID stands for the IDs
		c.LocalCommID, c.ServiceID = m.RequestID, ptr(m.ServiceID)
	case *cm.SIDRREP:
		c.LocalCommID, c.LocalQPN, c.ServiceID = m.RequestID, ptr(m.QPN), ptr(m.ServiceID)
	}
	return c
}

// String formats the message as the text form shows it:
//
//	CM REQ local_id=0x1c2d3e4f qpn=0x000011 start_psn=7730981 service_id=0x0000000001061c06
func (c *CM) String() string {
	b := append(make([]byte, 0, 96), "CM "...)
	b = append(b, c.Msg...)
	if c.Error != "" {
		return string(append(append(b, " error: "...), c.Error...))
	}
	b = hex(append(b, " local_id=0x"...), uint64(c.LocalCommID), 8)
	if c.Msg != "REQ" && c.Msg != "SIDR_REQ" && c.Msg != "SIDR_REP" {
		b = hex(append(b, " remote_id=0x"...), uint64(c.RemoteCommID), 8)
	}
	if c.LocalQPN != nil {
		b = hex(append(b, " qpn=0x"...), uint64(*c.LocalQPN), 6)
	}
	if c.RemoteQPN != nil {
		b = hex(append(b, " remote_qpn=0x"...), uint64(*c.RemoteQPN), 6)
	}
	if c.StartingPSN != nil {
		b = strconv.AppendUint(append(b, " start_psn="...), uint64(*c.StartingPSN), 10)
	}
	if c.ServiceID != nil {
		b = hex(append(b, " service_id=0x"...), *c.ServiceID, 16)
	}
	if c.Reason != nil {
		b = strconv.AppendUint(append(b, " reason="...), uint64(*c.Reason), 10)
	}
	return string(b)
}
