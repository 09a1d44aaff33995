package qp

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/rxego/rxego/bth"
)

// WROpcode is the operation of a send work request (ibv_wr_opcode values).
type WROpcode uint8

// Send work request opcodes, numbered as ibv_wr_opcode.
const (
	WRWrite       WROpcode = 0
	WRWriteImm    WROpcode = 1
	WRSend        WROpcode = 2
	WRSendImm     WROpcode = 3
	WRRead        WROpcode = 4
	WRCompareSwap WROpcode = 5
	WRFetchAdd    WROpcode = 6
	WRLocalInv    WROpcode = 7
	WRBindMW      WROpcode = 8
	WRSendInv     WROpcode = 9
	WRFlush       WROpcode = 14
	WRAtomicWrite WROpcode = 15
	wrOpcodeLimit WROpcode = 16
)

// wrNames names the opcodes rxego knows; the others have no name. An
// array, not a map: PostSend checks every WR's opcode against it.
var wrNames = [wrOpcodeLimit]string{
	WRWrite: "RDMA_WRITE", WRWriteImm: "RDMA_WRITE_WITH_IMM", WRSend: "SEND", WRSendImm: "SEND_WITH_IMM",
	WRRead: "RDMA_READ", WRCompareSwap: "ATOMIC_CMP_AND_SWP", WRFetchAdd: "ATOMIC_FETCH_AND_ADD",
	WRLocalInv: "LOCAL_INV", WRBindMW: "BIND_MW", WRSendInv: "SEND_WITH_INV", WRFlush: "FLUSH", WRAtomicWrite: "ATOMIC_WRITE",
}

// wrWire gives each send opcode its operation on the wire and what the
// last packet of its message carries besides (immediate data, an rkey to
// invalidate); the requester finds its opcodes in bth's table with them.
var wrWire = [wrOpcodeLimit]struct {
	op   bth.Op
	with bth.Flags
}{
	WRWrite: {bth.OpWrite, 0}, WRWriteImm: {bth.OpWrite, bth.Imm},
	WRSend: {bth.OpSend, 0}, WRSendImm: {bth.OpSend, bth.Imm}, WRSendInv: {bth.OpSend, bth.Inv},
	WRRead: {bth.OpReadRequest, 0}, WRCompareSwap: {bth.OpCompareSwap, 0}, WRFetchAdd: {bth.OpFetchAdd, 0},
	WRFlush: {bth.OpFlush, 0}, WRAtomicWrite: {bth.OpAtomicWrite, 0},
}

// known reports whether rxego knows the opcode.
func (o WROpcode) known() bool { return o < wrOpcodeLimit && wrNames[o] != "" }

// String names the opcode as ibv_wr_opcode_str does.
func (o WROpcode) String() string {
	if o.known() {
		return wrNames[o]
	}
	return "WR_OPCODE_" + strconv.Itoa(int(o))
}

// SendFlags are ibv_send_flags.
type SendFlags uint32

// Send flags.
const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 2
	SendSolicited SendFlags = 4
	SendInline    SendFlags = 8
)

// SGE is one scatter/gather element: a range of a registered MR named by
// its lkey and virtual address.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send work request, as ibv_send_wr.
type SendWR struct {
	ID     uint64
	Opcode WROpcode
	Flags  SendFlags
	SGL    []SGE
	// Inline carries the payload of an inline send (Flags&SendInline): the
	// bytes are copied at post time, no lkey is needed.
	Inline []byte
	Imm    uint32 // immediate data (host order; big-endian on the wire)
	// InvalidateRKey is the rkey a SEND with invalidate asks the responder
	// to invalidate, or the key a LOCAL_INV invalidates.
	InvalidateRKey uint32
	RemoteAddr     uint64 // RDMA and atomic target
	RKey           uint32
	CompareAdd     uint64 // CompareSwap compare value, FetchAdd addend
	Swap           uint64 // CompareSwap swap value
	// AtomicValue is the 8-byte value of an ATOMIC WRITE, written
	// big-endian as verbs does (rxe copies the payload bytes as given).
	AtomicValue [8]byte
	// FlushType and FlushLevel are the FETH placement type (1 global
	// visibility, 2 persistence) and selectivity (0 range, 1 whole MR).
	FlushType  uint8
	FlushLevel uint8
	// FlushLength is the number of bytes a FLUSH covers from RemoteAddr.
	FlushLength uint32
	// Bind is what a BIND_MW work request binds.
	Bind MWBind
	// UD only: the address handle, remote QPN and Q_Key.
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
}

// RecvWR is a receive work request, as ibv_recv_wr.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// AH is an address handle for UD sends: where the remote port is.
type AH struct {
	Dest         netip.AddrPort // remote GID as an IP address, and UDP port (4791)
	TrafficClass uint8
	HopLimit     uint8
}

// WCStatus is a work completion status (ibv_wc_status values).
type WCStatus uint8

// Completion statuses.
const (
	WCSuccess            WCStatus = 0
	WCLocLenErr          WCStatus = 1
	WCLocQPOpErr         WCStatus = 2
	WCLocEECOpErr        WCStatus = 3
	WCLocProtErr         WCStatus = 4
	WCWRFlushErr         WCStatus = 5
	WCMWBindErr          WCStatus = 6
	WCBadRespErr         WCStatus = 7
	WCLocAccessErr       WCStatus = 8
	WCRemInvReqErr       WCStatus = 9
	WCRemAccessErr       WCStatus = 10
	WCRemOpErr           WCStatus = 11
	WCRetryExcErr        WCStatus = 12
	WCRNRRetryExcErr     WCStatus = 13
	WCLocRDDViolErr      WCStatus = 14
	WCRemInvRDReqErr     WCStatus = 15
	WCRemAbortErr        WCStatus = 16
	WCInvEECNErr         WCStatus = 17
	WCInvEECStateErr     WCStatus = 18
	WCFatalErr           WCStatus = 19
	WCRespTimeoutErr     WCStatus = 20
	WCGeneralErr         WCStatus = 21
	wcStatusLimit        WCStatus = 22
	wcStatusNameFallback          = "WC_STATUS_"
)

var wcNames = [wcStatusLimit]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "Work Request Flushed Error", "memory management operation error",
	"bad response error", "local access error", "remote invalid request error", "remote access error",
	"remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
	"local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout error", "general error",
}

// String returns the text ibv_wc_status_str gives.
func (s WCStatus) String() string {
	if s < wcStatusLimit {
		return wcNames[s]
	}
	return wcStatusNameFallback + strconv.Itoa(int(s))
}

// WCOpcode is the opcode of a work completion (ibv_wc_opcode values).
type WCOpcode uint8

// Completion opcodes.
const (
	WCSend        WCOpcode = 0
	WCWrite       WCOpcode = 1
	WCRead        WCOpcode = 2
	WCCompareSwap WCOpcode = 3
	WCFetchAdd    WCOpcode = 4
	WCBindMW      WCOpcode = 5
	WCLocalInv    WCOpcode = 6
	WCAtomicWrite WCOpcode = 9
	WCFlush       WCOpcode = 8
	WCRecv        WCOpcode = 128
	WCRecvRDMAImm WCOpcode = 129
)

var wcOpNames = map[WCOpcode]string{
	WCSend: "SEND", WCWrite: "RDMA_WRITE", WCRead: "RDMA_READ", WCCompareSwap: "COMP_SWAP",
	WCFetchAdd: "FETCH_ADD", WCBindMW: "BIND_MW", WCLocalInv: "LOCAL_INV", WCAtomicWrite: "ATOMIC_WRITE",
	WCFlush: "FLUSH", WCRecv: "RECV", WCRecvRDMAImm: "RECV_RDMA_WITH_IMM",
}

// String names the completion opcode.
func (o WCOpcode) String() string {
	if s, ok := wcOpNames[o]; ok {
		return s
	}
	return "WC_OPCODE_" + strconv.Itoa(int(o))
}

// WCFlags are ibv_wc_flags.
type WCFlags uint32

// Completion flags.
const (
	// WCWithGRH is set on every successful receive completion, RC and UC
	// included, as rxe sets it on RoCE; UD receives also find the GRH in
	// the first 40 bytes of their buffer.
	WCWithGRH WCFlags = 1
	WCWithImm WCFlags = 2
	WCWithInv WCFlags = 8
)

// String names the flags as ibv_wc_flags does ("IBV_WC_GRH|IBV_WC_WITH_IMM"),
// "0" for none; a bit verbs does not define shows as a number.
func (f WCFlags) String() string {
	if f == 0 {
		return "0"
	}
	var names []string
	for _, n := range []struct {
		bit  WCFlags
		name string
	}{{WCWithGRH, "IBV_WC_GRH"}, {WCWithImm, "IBV_WC_WITH_IMM"}, {WCWithInv, "IBV_WC_WITH_INV"}} {
		if f&n.bit != 0 {
			names = append(names, n.name)
			f &^= n.bit
		}
	}
	if f != 0 {
		names = append(names, fmt.Sprintf("%#x", uint32(f)))
	}
	return strings.Join(names, "|")
}

// WC is a work completion, as ibv_wc.
type WC struct {
	ID      uint64
	Status  WCStatus
	Opcode  WCOpcode
	VendErr uint32
	ByteLen uint32
	Imm     uint32 // immediate data (WCWithImm) in host order
	// InvalidatedRKey is the rkey the peer invalidated (WCWithInv).
	InvalidatedRKey uint32
	QPN             uint32
	SrcQP           uint32 // UD: the sender's QPN
	Flags           WCFlags
	PKeyIndex       uint16
	// Src is the UD sender's address (the GID, as an IP address, and port).
	Src netip.AddrPort
}
