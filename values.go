package rxego

import (
	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/qp"
)

// The values below are those of verbs (ibv_qp_state, ibv_qp_attr_mask,
// ibv_mtu, ibv_wc_status, ibv_wc_opcode, ibv_access_flags, ibv_wr_opcode,
// ibv_send_flags, ...), all in this one file, so code and intuition carry
// over. Their types are the engine's (see the type list in rxego.go), so
// the engine and the API agree without conversions.

// QP states (ibv_qp_state).
const (
	StateReset = qp.Reset // RESET: as created, and after Modify to RESET
	StateInit  = qp.Init  // INIT: receives may be posted
	StateRTR   = qp.RTR   // RTR: ready to receive
	StateRTS   = qp.RTS   // RTS: ready to send
	StateSQD   = qp.SQD   // SQD: send queue drained
	StateSQE   = qp.SQE   // SQE: send queue error (UC, UD)
	StateErr   = qp.Err   // ERR: work requests complete with WR_FLUSH_ERR
)

// QP attribute mask bits (ibv_qp_attr_mask): which QPAttr fields a
// Modify sets.
const (
	AttrState           = qp.AttrState           // State
	AttrCurState        = qp.AttrCurState        // CurState
	AttrEnSQDAsyncNotif = qp.AttrEnSQDAsyncNotif // en_sqd_async_notify
	AttrAccessFlags     = qp.AttrAccessFlags     // AccessFlags
	AttrPKeyIndex       = qp.AttrPKeyIndex       // pkey_index (0 only)
	AttrPort            = qp.AttrPort            // Port (1 only)
	AttrQKey            = qp.AttrQKey            // QKey (UD)
	AttrAV              = qp.AttrAV              // Dest, TrafficClass, HopLimit: the address vector
	AttrPathMTU         = qp.AttrPathMTU         // PathMTU
	AttrTimeout         = qp.AttrTimeout         // Timeout
	AttrRetryCnt        = qp.AttrRetryCnt        // RetryCnt
	AttrRNRRetry        = qp.AttrRNRRetry        // RNRRetry
	AttrRQPSN           = qp.AttrRQPSN           // RQPSN
	AttrMaxQPRdAtomic   = qp.AttrMaxQPRdAtomic   // MaxRdAtomic
	AttrAltPath         = qp.AttrAltPath         // alternate path (not supported)
	AttrMinRNRTimer     = qp.AttrMinRNRTimer     // MinRNRTimer
	AttrSQPSN           = qp.AttrSQPSN           // SQPSN
	AttrMaxDestRdAtomic = qp.AttrMaxDestRdAtomic // MaxDestRdAtomic
	AttrPathMigState    = qp.AttrPathMigState    // path migration state (not supported)
	AttrCap             = qp.AttrCap             // Caps
	AttrDestQPN         = qp.AttrDestQPN         // DestQPN
)

// Path MTUs (ibv_mtu).
const (
	MTU256  = qp.MTU256
	MTU512  = qp.MTU512
	MTU1024 = qp.MTU1024
	MTU2048 = qp.MTU2048
	MTU4096 = qp.MTU4096
)

// Completion statuses (ibv_wc_status); WCStatus.String gives
// ibv_wc_status_str's text.
const (
	WCSuccess        = qp.WCSuccess        // the work request completed
	WCLocLenErr      = qp.WCLocLenErr      // a message longer than the receive buffers
	WCLocQPOpErr     = qp.WCLocQPOpErr     // the QP could not execute it (e.g. a packet the link refused)
	WCLocEECOpErr    = qp.WCLocEECOpErr    // RD only; never
	WCLocProtErr     = qp.WCLocProtErr     // a local key, PD or access check failed
	WCWRFlushErr     = qp.WCWRFlushErr     // flushed: the QP was in or moved to the error state
	WCMWBindErr      = qp.WCMWBindErr      // a memory window bind failed
	WCBadRespErr     = qp.WCBadRespErr     // the peer's response made no sense
	WCLocAccessErr   = qp.WCLocAccessErr   // a local access violation
	WCRemInvReqErr   = qp.WCRemInvReqErr   // the peer NAKed an invalid request
	WCRemAccessErr   = qp.WCRemAccessErr   // the peer NAKed a remote access error (rkey, bounds, rights)
	WCRemOpErr       = qp.WCRemOpErr       // the peer NAKed an operational error
	WCRetryExcErr    = qp.WCRetryExcErr    // the transport retried retry_cnt times without an answer
	WCRNRRetryExcErr = qp.WCRNRRetryExcErr // the peer was not ready (RNR) rnr_retry times
	WCLocRDDViolErr  = qp.WCLocRDDViolErr  // RD only; never
	WCRemInvRDReqErr = qp.WCRemInvRDReqErr // RD only; never
	WCRemAbortErr    = qp.WCRemAbortErr    // the peer aborted the operation
	WCInvEECNErr     = qp.WCInvEECNErr     // RD only; never
	WCInvEECStateErr = qp.WCInvEECStateErr // RD only; never
	WCFatalErr       = qp.WCFatalErr       // a fatal error
	WCRespTimeoutErr = qp.WCRespTimeoutErr // a response timed out
	WCGeneralErr     = qp.WCGeneralErr     // any other error
)

// Completion opcodes (ibv_wc_opcode): what the completed work request
// did.
const (
	WCSend        = qp.WCSend
	WCWrite       = qp.WCWrite
	WCRead        = qp.WCRead
	WCCompareSwap = qp.WCCompareSwap
	WCFetchAdd    = qp.WCFetchAdd
	WCBindMW      = qp.WCBindMW
	WCLocalInv    = qp.WCLocalInv
	WCAtomicWrite = qp.WCAtomicWrite
	WCFlush       = qp.WCFlush
	WCRecv        = qp.WCRecv        // a SEND arrived
	WCRecvRDMAImm = qp.WCRecvRDMAImm // a WRITE with immediate arrived
)

// Reasons a device dropped a received packet: the index of Stats.Drops.
const (
	DropUnknownQP     = qp.DropUnknownQP     // no QP with that number
	DropBadState      = qp.DropBadState      // QP not in a state that receives
	DropWrongOpcode   = qp.DropWrongOpcode   // opcode not of the QP's type, or not expected now
	DropWrongSource   = qp.DropWrongSource   // connected QP, packet from another address
	DropBadQKey       = qp.DropBadQKey       // UD Q_Key mismatch
	DropBadPKey       = qp.DropBadPKey       // P_Key not the default
	DropBadLength     = qp.DropBadLength     // payload longer than the path MTU or message
	DropNoRecvWQE     = qp.DropNoRecvWQE     // UD/UC message with no receive posted
	DropDuplicate     = qp.DropDuplicate     // duplicate the responder need not answer
	DropOutOfSequence = qp.DropOutOfSequence // PSN ahead of expected (NAKed once per gap)
	DropStaleResponse = qp.DropStaleResponse // response or ACK for nothing outstanding
	DropBadAccess     = qp.DropBadAccess     // rkey, PD or access rights check failed (NAKed)
	DropOutOfBounds   = qp.DropOutOfBounds   // range outside the MR, or wrapping (NAKed)
	DropMisaligned    = qp.DropMisaligned    // atomic on an address not 8-byte aligned (NAKed)
	DropBusy          = qp.DropBusy          // new request while a long READ response goes out
	DropOther         = qp.DropOther         // anything else
)

// NumDropReasons is how many drop reasons there are (len(Stats.Drops)).
const NumDropReasons = qp.NumDropReasons

// DropReasons lists every drop reason, in index order.
func DropReasons() []DropReason { return qp.DropReasons() }

// GRHLen is the space a UD receive buffer reserves for the GRH: the first
// 40 bytes of every UD receive (WCWithGRH).
const GRHLen = qp.GRHLen

// MaxRdAtomicLimit is the largest max_rd_atomic and max_dest_rd_atomic a
// QP accepts (rxe advertises 128).
const MaxRdAtomicLimit = qp.MaxRdAtomicLimit

// MTUFromBytes returns the ibv_mtu for 256, 512, 1024, 2048 or 4096; ok
// is false for any other size.
func MTUFromBytes(n int) (m MTU, ok bool) { return qp.MTUFromBytes(n) }

// Access flags (ibv_access_flags).
const (
	AccessLocalWrite   = mr.LocalWrite
	AccessRemoteWrite  = mr.RemoteWrite
	AccessRemoteRead   = mr.RemoteRead
	AccessRemoteAtomic = mr.RemoteAtomic
	AccessZeroBased    = mr.ZeroBased
	AccessMWBind       = mr.MWBind
)

// Memory window types (ibv_mw_type).
const (
	MWType1 = mr.MWType1
	MWType2 = mr.MWType2
)

// QP types.
const (
	RC = qp.RC
	UC = qp.UC
	UD = qp.UD
)

// Work request opcodes.
const (
	WRWrite       = qp.WRWrite
	WRWriteImm    = qp.WRWriteImm
	WRSend        = qp.WRSend
	WRSendImm     = qp.WRSendImm
	WRRead        = qp.WRRead
	WRCompareSwap = qp.WRCompareSwap
	WRFetchAdd    = qp.WRFetchAdd
	WRLocalInv    = qp.WRLocalInv
	WRBindMW      = qp.WRBindMW
	WRSendInv     = qp.WRSendInv
	WRFlush       = qp.WRFlush
	WRAtomicWrite = qp.WRAtomicWrite
)

// Completion flags (WC.Flags): the GRH is in the receive buffer's first
// 40 bytes (UD), an immediate (WC.Imm) or an invalidated rkey came.
const (
	WCWithGRH = qp.WCWithGRH
	WCWithImm = qp.WCWithImm
	WCWithInv = qp.WCWithInv
)

// Send flags.
const (
	SendFence     = qp.SendFence
	SendSignaled  = qp.SendSignaled
	SendSolicited = qp.SendSolicited
	SendInline    = qp.SendInline
)
