package rxego

import "github.com/rxego/rxego/qp"

// Stats are a device's engine counters, summed over its shards and read
// at one moment (Device.Stats). The names with an rxe name beside them
// count what rdma_rxe's hw_counters of that name count, so both ends of
// an interop run compare directly.
type Stats struct {
	SentPkts            uint64 // sent_pkts
	RcvdPkts            uint64 // rcvd_pkts
	DuplicateRequest    uint64 // duplicate_request
	OutOfSeqRequest     uint64 // out_of_seq_request
	RcvdRNRErr          uint64 // rcvd_rnr_err: RNR NAKs received
	SendRNRErr          uint64 // send_rnr_err: RNR NAKs sent
	RcvdSeqErr          uint64 // rcvd_seq_err: PSN sequence error NAKs received
	AckDeferred         uint64 // ack_deferred
	RetryExceededErr    uint64 // retry_exceeded_err
	RetryRNRExceededErr uint64 // retry_rnr_exceeded_err
	CompleterRetryErr   uint64 // completer_retry_err: retries started
	SendErr             uint64 // send_err
	RDMASends           uint64 // rdma_sends: RDMA WRITE/READ/atomic requests sent (each once; a long READ is several requests)
	RDMARecvs           uint64 // rdma_recvs: such requests received
	SentBytes           uint64 // payload bytes sent
	RcvdBytes           uint64 // payload bytes received
	Retransmits         uint64 // packets sent again
	WindowCuts          uint64 // congestion window cuts: retransmission timeouts and sequence error NAKs
	ReadBudgetWaits     uint64 // READ requests held back for the engine's READ budget
	NAKsSent            uint64 // NAKs sent (sequence, RNR, access, invalid request)
	RemoteAccessNAKs    uint64 // remote access error NAKs sent
	InvalidRequestNAKs  uint64 // invalid request NAKs sent
	// ContradictingResponse counts NAKs behind the requester's completed
	// PSN that answered a retransmission, each cutting the retries left
	// before RETRY_EXC_ERR (stall.go).
	ContradictingResponse uint64
	// Drops counts received packets dropped, by reason (DropUnknownQP, ...).
	Drops                 [NumDropReasons]uint64
	CompletionsGenerated  uint64 // work completions generated
	FlushedWorkRequests   uint64 // work requests completed with WR_FLUSH_ERR
	CNPsSent              uint64 // congestion notification packets sent
	CNPsReceived          uint64 // congestion notification packets received
	ECNMarkedPktsReceived uint64 // packets received marked Congestion Experienced
}

// add adds the engine counters c to s.
func (s *Stats) add(c *qp.Counters) {
	s.SentPkts += c.SentPkts.Load()
	s.RcvdPkts += c.RcvdPkts.Load()
	s.DuplicateRequest += c.DuplicateRequest.Load()
	s.OutOfSeqRequest += c.OutOfSeqRequest.Load()
	s.RcvdRNRErr += c.RcvdRNRErr.Load()
	s.SendRNRErr += c.SendRNRErr.Load()
	s.RcvdSeqErr += c.RcvdSeqErr.Load()
	s.AckDeferred += c.AckDeferred.Load()
	s.RetryExceededErr += c.RetryExceededErr.Load()
	s.RetryRNRExceededErr += c.RetryRNRExceededErr.Load()
	s.CompleterRetryErr += c.CompleterRetryErr.Load()
	s.SendErr += c.SendErr.Load()
	s.RDMASends += c.RDMASends.Load()
	s.RDMARecvs += c.RDMARecvs.Load()
	s.SentBytes += c.SentBytes.Load()
	s.RcvdBytes += c.RcvdBytes.Load()
	s.Retransmits += c.Retransmits.Load()
	s.WindowCuts += c.WindowCuts.Load()
	s.ReadBudgetWaits += c.ReadBudgetWaits.Load()
	s.NAKsSent += c.NAKsSent.Load()
	s.RemoteAccessNAKs += c.RemoteAccessNAKs.Load()
	s.InvalidRequestNAKs += c.InvalidRequestNAKs.Load()
	s.ContradictingResponse += c.ContradictingResponse.Load()
	for i := range s.Drops {
		s.Drops[i] += c.Drops[i].Load()
	}
	s.CompletionsGenerated += c.CompletionsGenerated.Load()
	s.FlushedWorkRequests += c.FlushedWorkRequests.Load()
	s.CNPsSent += c.CNPsSent.Load()
	s.CNPsReceived += c.CNPsReceived.Load()
	s.ECNMarkedPktsReceived += c.ECNMarkedPktsReceived.Load()
}

// Stats returns the device's engine counters, summed over the shards and
// read now. It allocates nothing, so a loop may poll it.
func (d *Device) Stats() Stats {
	var s Stats
	if d.dev == nil {
		return s
	}
	for i := range d.dev.Shards() {
		s.add(d.dev.ShardCounters(i))
	}
	return s
}
