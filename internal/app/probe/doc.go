// Package probe is `rxego probe`: a protocol report of a RoCEv2 device
// seen from outside, riding an unmodified C tool on the peer.
//
// In responder mode the peer runs a perftest server (ib_write_bw,
// ib_read_bw, ib_atomic_bw or ib_send_bw with -q N) or ibv_rc_pingpong's;
// the probe does the tool's client handshake over TCP (package perftest's
// Exchange, or ibv_rc_pingpong's through PingpongSwap), learns the peer's QP
// numbers, PSNs, rkey and address, and then, instead of the tool's
// traffic, sends scripted packets on those QPs, one scenario per QP, from
// a UDP port 4791 of its own, built from the one opcode table (package
// bth) with correct ICRCs (package icrc). It records every packet (pcapng
// and trace records), checks what came back against the rule each
// scenario names, and reports a verdict per scenario with the ladder of
// its exchange (package ladder).
//
// The probe is safe by construction: it sends only to the address the user
// names (the handshake's QPs must be there), only on the QPs the
// handshake gave it, at most MaxPackets packets at least Gap apart.
//
// Scenarios are data (ParseScenarios, Builtin); the format is documented
// in docs/probe.md.
package probe
