package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// statsPrefix starts the one line --stats prints, so tests can find it in
// a tool's output.
const statsPrefix = "rxego-stats "

// How long printStats waits for the device to go quiet by default, and at
// most.
const (
	defaultStatsQuiet = 250 * time.Millisecond
	settleMax         = 5 * time.Second
)

// printStats writes dev's engine and transport counters as one line:
// statsPrefix then a JSON object of name to value. Engine counters keep
// rdma_rxe's hw_counters names (sent_pkts, rcvd_seq_err, ...) so the two
// sides of an interop run compare directly; transport counters start with
// "udp_", drop reasons with "drop_". It first waits until the device has
// neither sent nor received a packet for defaultStatsQuiet (at most
// settleMax): the ACK
// of the last message received goes out after the run ends, and a peer's
// last packets (a retry of one whose ACK was lost) may still be arriving.
func printStats(w io.Writer, dev *rxego.Device) error {
	return printStatsQuiet(w, dev, defaultStatsQuiet)
}

// printStatsQuiet is printStats with the quiet period given.
func printStatsQuiet(w io.Writer, dev *rxego.Device, quiet time.Duration) error {
	settle(dev, quiet)
	m := engineStats(&dev.Engine().Stats)
	for k, v := range transportStats(dev.Transport().Stats()) {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s%s\n", statsPrefix, b)
	return err
}

// settle waits until dev's packet counters stop moving for quiet.
func settle(dev *rxego.Device, quiet time.Duration) {
	moved := func() uint64 {
		s := dev.Transport().Stats()
		return s.SentPackets + s.RecvPackets + s.Dropped()
	}
	last := moved()
	for deadline := time.Now().Add(settleMax); time.Now().Before(deadline); {
		time.Sleep(quiet)
		now := moved()
		if now == last {
			return
		}
		last = now
	}
}

// engineStats names the engine's counters.
func engineStats(c *qp.Counters) map[string]uint64 {
	m := map[string]uint64{
		"sent_pkts":                c.SentPkts.Load(),
		"rcvd_pkts":                c.RcvdPkts.Load(),
		"duplicate_request":        c.DuplicateRequest.Load(),
		"out_of_seq_request":       c.OutOfSeqRequest.Load(),
		"rcvd_rnr_err":             c.RcvdRNRErr.Load(),
		"send_rnr_err":             c.SendRNRErr.Load(),
		"rcvd_seq_err":             c.RcvdSeqErr.Load(),
		"ack_deferred":             c.AckDeferred.Load(),
		"retry_exceeded_err":       c.RetryExceededErr.Load(),
		"retry_rnr_exceeded_err":   c.RetryRNRExceededErr.Load(),
		"completer_retry_err":      c.CompleterRetryErr.Load(),
		"send_err":                 c.SendErr.Load(),
		"rdma_sends":               c.RDMASends.Load(),
		"rdma_recvs":               c.RDMARecvs.Load(),
		"sent_bytes":               c.SentBytes.Load(),
		"rcvd_bytes":               c.RcvdBytes.Load(),
		"retransmits":              c.Retransmits.Load(),
		"naks_sent":                c.NAKsSent.Load(),
		"remote_access_naks":       c.RemoteAccessNAKs.Load(),
		"invalid_request_naks":     c.InvalidRequestNAKs.Load(),
		"completions_generated":    c.CompletionsGenerated.Load(),
		"flushed_work_requests":    c.FlushedWorkRequests.Load(),
		"cnps_sent":                c.CNPsSent.Load(),
		"cnps_received":            c.CNPsReceived.Load(),
		"ecn_marked_pkts_received": c.ECNMarkedPktsReceived.Load(),
	}
	for _, r := range qp.DropReasons() {
		m["drop_"+r.String()] = c.Drops[r].Load()
	}
	return m
}

// transportStats names the UDP transport's counters.
func transportStats(s transport.Stats) map[string]uint64 {
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
