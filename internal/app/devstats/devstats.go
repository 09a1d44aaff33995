// Package devstats names an rxego Device's counters, for tools and tests
// that print or compare them: the engine's counters under rdma_rxe's
// hw_counters names (sent_pkts, rcvd_seq_err, ...), so the two sides of an
// interop run compare directly, drop reasons as "drop_<reason>", and the
// UDP transport's counters as "udp_<name>".
package devstats

import (
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/transport"
)

// Map returns a snapshot of dev's counters by name.
func Map(dev *rxego.Device) map[string]uint64 {
	m := Engine(dev.Stats())
	for k, v := range Transport(dev.Transport().Stats()) {
		m[k] = v
	}
	return m
}

// Engine names an engine's counters.
func Engine(c rxego.Stats) map[string]uint64 {
	m := map[string]uint64{
		"sent_pkts":                c.SentPkts,
		"rcvd_pkts":                c.RcvdPkts,
		"duplicate_request":        c.DuplicateRequest,
		"out_of_seq_request":       c.OutOfSeqRequest,
		"rcvd_rnr_err":             c.RcvdRNRErr,
		"send_rnr_err":             c.SendRNRErr,
		"rcvd_seq_err":             c.RcvdSeqErr,
		"ack_deferred":             c.AckDeferred,
		"retry_exceeded_err":       c.RetryExceededErr,
		"retry_rnr_exceeded_err":   c.RetryRNRExceededErr,
		"completer_retry_err":      c.CompleterRetryErr,
		"contradicting_responses":  c.ContradictingResponse,
		"send_err":                 c.SendErr,
		"rdma_sends":               c.RDMASends,
		"rdma_recvs":               c.RDMARecvs,
		"sent_bytes":               c.SentBytes,
		"rcvd_bytes":               c.RcvdBytes,
		"retransmits":              c.Retransmits,
		"window_cuts":              c.WindowCuts,
		"read_budget_waits":        c.ReadBudgetWaits,
		"naks_sent":                c.NAKsSent,
		"remote_access_naks":       c.RemoteAccessNAKs,
		"invalid_request_naks":     c.InvalidRequestNAKs,
		"completions_generated":    c.CompletionsGenerated,
		"flushed_work_requests":    c.FlushedWorkRequests,
		"cnps_sent":                c.CNPsSent,
		"cnps_received":            c.CNPsReceived,
		"ecn_marked_pkts_received": c.ECNMarkedPktsReceived,
	}
	for _, r := range rxego.DropReasons() {
		m["drop_"+r.String()] = c.Drops[r]
	}
	return m
}

// Transport names a UDP transport's counters.
func Transport(s transport.Stats) map[string]uint64 {
	m := map[string]uint64{
		"udp_sent_packets": s.SentPackets,
		"udp_sent_bytes":   s.SentBytes,
		"udp_recv_packets": s.RecvPackets,
		"udp_recv_bytes":   s.RecvBytes,
		"udp_gso_segments": s.GSOSegments,
		"udp_gro_segments": s.GROSegments,
	}
	for r := range transport.NumDropReasons {
		m["udp_drop_"+r.String()] = s.Drops[r]
	}
	return m
}

// Settle waits until dev has neither sent nor received a packet for quiet,
// or until max has passed: the ACK of the last message received goes out
// after an application is done, and a peer's last packets (a retry of one
// whose ACK was lost) may still be arriving. It reports whether dev went
// quiet.
func Settle(dev *rxego.Device, quiet, max time.Duration) bool {
	moved := func() uint64 {
		s := dev.Transport().Stats()
		return s.SentPackets + s.RecvPackets + s.Dropped()
	}
	last := moved()
	for deadline := time.Now().Add(max); time.Now().Before(deadline); {
		time.Sleep(quiet)
		now := moved()
		if now == last {
			return true
		}
		last = now
	}
	return false
}
