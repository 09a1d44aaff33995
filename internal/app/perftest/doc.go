// Package perftest is rxego's peer for perftest's ib_send_bw, ib_write_bw,
// ib_read_bw, ib_atomic_bw and the four latency tests: perftest's
// exchange (TCP by default; with Config.RDMACM, perftest's -R, SENDs on an
// rdma_cm-connected QP and every data QP connected by the CM), its loops,
// defaults and printed tables, as server or client.
//
// Besides measuring, a run checks what it can of the data: bytes the peer
// sent or wrote into rxego's buffer, READ and atomic results against
// rxego's fill pattern, and that nothing outside the targeted slots
// changed (Result.Checked, Result.Mismatches). Config.Hold hands a test
// the ranges of the peer's memory whose content rxego knows at the final
// handshake, so the test can read the peer's memory there. docs/perftest.md
// describes the flags and the exchange, docs/cm.md the -R mode.
package perftest
