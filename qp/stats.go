package qp

import (
	"reflect"
	"sync/atomic"
)

// Counters are an engine's counters. The first group has the names and
// meanings of rdma_rxe's hw_counters, so numbers from both sides of an
// interop run can be compared directly.
type Counters struct {
	SentPkts            atomic.Uint64 // sent_pkts
	RcvdPkts            atomic.Uint64 // rcvd_pkts
	DuplicateRequest    atomic.Uint64 // duplicate_request
	OutOfSeqRequest     atomic.Uint64 // out_of_seq_request
	RcvdRNRErr          atomic.Uint64 // rcvd_rnr_err: RNR NAKs received
	SendRNRErr          atomic.Uint64 // send_rnr_err: RNR NAKs sent
	RcvdSeqErr          atomic.Uint64 // rcvd_seq_err: PSN sequence error NAKs received
	AckDeferred         atomic.Uint64 // ack_deferred
	RetryExceededErr    atomic.Uint64 // retry_exceeded_err
	RetryRNRExceededErr atomic.Uint64 // retry_rnr_exceeded_err
	CompleterRetryErr   atomic.Uint64 // completer_retry_err: retries started
	SendErr             atomic.Uint64 // send_err
	RDMASends           atomic.Uint64 // rdma_sends: RDMA WRITE/READ/atomic requests sent (each once; a long READ is several requests)
	RDMARecvs           atomic.Uint64 // rdma_recvs: such requests received
	SentBytes           atomic.Uint64
	RcvdBytes           atomic.Uint64
	Retransmits         atomic.Uint64 // packets sent again
	WindowCuts          atomic.Uint64 // congestion window cuts: retransmission timeouts and sequence error NAKs
	ReadBudgetWaits     atomic.Uint64 // READ requests held back for the engine's READ budget
	NAKsSent            atomic.Uint64
	RemoteAccessNAKs    atomic.Uint64 // remote access error NAKs sent
	InvalidRequestNAKs  atomic.Uint64 // invalid request NAKs sent
	// ContradictingResponse counts NAKs behind the requester's completed
	// PSN that answered a retransmission, each cutting the retries left
	// before RETRY_EXC_ERR (stall.go).
	ContradictingResponse atomic.Uint64
	Drops                 [numDropReasons]atomic.Uint64
	CompletionsGenerated  atomic.Uint64
	FlushedWorkRequests   atomic.Uint64
	CNPsSent              atomic.Uint64
	CNPsReceived          atomic.Uint64
	ECNMarkedPktsReceived atomic.Uint64
}

// Add adds o's counts to c: a device with several engines sums them.
// Every field of Counters is an atomic.Uint64 or an array of them.
func (c *Counters) Add(o *Counters) {
	addCounters(reflect.ValueOf(c).Elem(), reflect.ValueOf(o).Elem())
}

var uint64Counter = reflect.TypeFor[atomic.Uint64]()

func addCounters(dst, src reflect.Value) {
	switch {
	case dst.Type() == uint64Counter:
		dst.Addr().Interface().(*atomic.Uint64).Add(src.Addr().Interface().(*atomic.Uint64).Load())
	case dst.Kind() == reflect.Struct:
		for i := range dst.NumField() {
			addCounters(dst.Field(i), src.Field(i))
		}
	case dst.Kind() == reflect.Array:
		for i := range dst.Len() {
			addCounters(dst.Index(i), src.Index(i))
		}
	default:
		panic("qp: Counters field of type " + dst.Type().String())
	}
}

// DropReason says why a received packet was discarded.
type DropReason uint8

// Drop reasons.
const (
	DropUnknownQP     DropReason = iota // no QP with that number
	DropBadState                        // QP not in a state that receives
	DropWrongOpcode                     // opcode not of the QP's type, or not expected now
	DropWrongSource                     // connected QP, packet from another address
	DropBadQKey                         // UD Q_Key mismatch
	DropBadPKey                         // P_Key not the default
	DropBadLength                       // payload longer than the path MTU or message
	DropNoRecvWQE                       // UD/UC message with no receive posted
	DropDuplicate                       // duplicate the responder need not answer
	DropOutOfSequence                   // PSN ahead of expected (NAKed once per gap)
	DropStaleResponse                   // response or ACK for nothing outstanding
	DropBadAccess                       // rkey, PD or access rights check failed (NAKed)
	DropOutOfBounds                     // range outside the MR, or wrapping (NAKed)
	DropMisaligned                      // atomic on an address not 8-byte aligned (NAKed)
	DropBusy                            // new request while a long READ response goes out (NAKed after it)
	DropClosedQP                        // for a QP destroyed moments ago (closedQPHold): its peer had not heard yet
	DropOther
	// DropMcastNoRecvWQE is a multicast UD datagram that found no
	// receive posted on a QP attached to its group: UD accepts any
	// sender's datagrams, so a flood of forged ones uses up the receives
	// and legit ones are lost; counted apart from DropNoRecvWQE (and per
	// group by rxego's Device.McastNoRecvDrops) so that loss shows.
	DropMcastNoRecvWQE
	numDropReasons
)

// NumDropReasons is how many drop reasons there are: the length of
// Counters.Drops.
const NumDropReasons = int(numDropReasons)

var dropNames = [numDropReasons]string{
	"unknown_qp", "bad_state", "wrong_opcode", "wrong_source", "bad_qkey", "bad_pkey", "bad_length",
	"no_recv_wqe", "duplicate", "out_of_sequence", "stale_response", "bad_access", "out_of_bounds",
	"misaligned", "busy", "closed_qp", "other", "mcast_no_recv_wqe",
}

// String names the reason as the metrics label does.
func (r DropReason) String() string {
	if r < numDropReasons {
		return dropNames[r]
	}
	return "unknown"
}

// DropReasons lists every reason, for metrics.
func DropReasons() []DropReason {
	out := make([]DropReason, numDropReasons)
	for i := range out {
		out[i] = DropReason(i)
	}
	return out
}

func (e *Engine) drop(r DropReason) { e.Stats.Drops[r].Add(1) }
