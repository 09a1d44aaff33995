// Package harness is rxego's side-by-side benchmark: it measures rxego
// between two processes (RC WRITE, READ and SEND bandwidth, small-message
// latency, message rate, 10,000 QPs) and, in the same sitting, the
// yardsticks a user would otherwise pick: raw UDP in each I/O mode
// (a datagram per system call, sendmmsg/recvmmsg batches, GSO and GRO) and
// a TCP stream, then prints a markdown table with the ratios.
//
// Every measurement runs in two fresh child processes (the harness binary
// started again with the "peer" subcommand): a server, which prints the
// address of its control socket, and a client, which connects to it. The
// two exchange set-up data (QP numbers, keys, addresses) and start/stop
// signals as JSON lines over that socket, then each prints its result as
// one JSON line. The orchestrator runs the cases one after another,
// showing progress on stderr.
//
// cmd/rxego-bench is the command; docs/performance.md has the figures.
package harness

import (
	"fmt"
	"time"
)

// Kind is what a case measures.
type Kind string

// Case kinds.
const (
	RxegoBW    Kind = "rxego-bw"    // RC bandwidth: Op, Size, MTU, Depth
	RxegoLat   Kind = "rxego-lat"   // RC latency of 64-byte Op: Busy
	RxegoRate  Kind = "rxego-rate"  // 64-byte WRITE message rate at Depth
	RxegoScale Kind = "rxego-scale" // QPs connected RC QPs, all carrying WRITEs
	UDPBW      Kind = "udp-bw"      // UDP receive rate: Mode, Size
	UDPPing    Kind = "udp-pp"      // 64-byte UDP ping-pong: Busy
	TCPBW      Kind = "tcp-bw"      // one TCP stream
	TCPPing    Kind = "tcp-pp"      // 64-byte TCP ping-pong
	RsocketBW  Kind = "rsocket-bw"  // one rsocket stream over rxego (package rsocket)
	RsocketPP  Kind = "rsocket-pp"  // 64-byte rsocket ping-pong over rxego
)

// UDP I/O modes.
const (
	UDPSingle = "single" // one datagram per sendto/recvfrom
	UDPMmsg   = "mmsg"   // sendmmsg/recvmmsg, 64 datagrams per call
	UDPGSO    = "gso"    // GSO sends of 64 KiB, GRO receive
	// UDPGSORuns is gso with the datagrams cut as rxego's 64 KiB WRITEs
	// at MTU 4096 must be: per 16 segments, one alone (the WRITE First,
	// whose RETH makes it longer than the rest, and GSO cuts a datagram
	// into equal segments) and one of 15 (Middle and Last). A diagnostic
	// yardstick: how much of the gap to gso the packet format forces
	// (docs/performance.md, "Why a WRITE costs more than a UDP GSO send").
	UDPGSORuns = "gso-runs"
)

// gso reports whether the UDP mode sends with GSO and receives with GRO.
func (c Case) gso() bool { return c.Mode == UDPGSO || c.Mode == UDPGSORuns }

// Case is one measurement.
type Case struct {
	Kind  Kind
	Op    string `json:",omitempty"` // rxego: write, read, send, atomic
	Mode  string `json:",omitempty"` // UDP I/O mode
	Size  int    `json:",omitempty"` // message (rxego, TCP) or datagram payload (UDP) bytes
	MTU   int    `json:",omitempty"` // rxego path MTU
	Depth int    `json:",omitempty"` // work requests kept outstanding
	Batch int    `json:",omitempty"` // message rate: WRITEs per PostSend, the last signaled
	QPs   int    `json:",omitempty"` // scale: QPs; bandwidth and rate: QPs (TCP streams, UDP flows) at once
	Busy  bool   `json:",omitempty"` // busy-poll instead of blocking waits
	// Warmup runs before the measurement, Duration is measured.
	Warmup, Duration time.Duration
	// Sched is where and at what priority the two peers run (-nice, -pin).
	Sched Sched `json:",omitzero"`
}

// Name is a short label for progress lines and the report.
func (c Case) Name() string {
	if c.QPs > 1 && c.Kind != RxegoScale {
		unit := "QPs"
		switch c.Kind {
		case TCPBW:
			unit = "streams"
		case UDPBW:
			unit = "flows"
		}
		one := c
		one.QPs = 0
		return fmt.Sprintf("%s, %d %s", one.Name(), c.QPs, unit)
	}
	wait := "blocking"
	if c.Busy {
		wait = "busy-poll"
	}
	switch c.Kind {
	case RxegoBW:
		return fmt.Sprintf("rxego %s %s mtu %d", c.Op, sizeName(c.Size), c.MTU)
	case RxegoLat:
		return fmt.Sprintf("rxego %s 64 B latency, %s", c.Op, wait)
	case RxegoRate:
		return fmt.Sprintf("rxego WRITE 64 B rate, depth %d, %d per post, %s", c.Depth, c.rateBatch(), wait)
	case RxegoScale:
		return fmt.Sprintf("rxego %d RC QPs", c.QPs)
	case UDPBW:
		return fmt.Sprintf("UDP %s %s", c.Mode, sizeName(c.Size))
	case UDPPing:
		return fmt.Sprintf("UDP 64 B ping-pong, %s", wait)
	case TCPBW:
		return "TCP stream"
	case TCPPing:
		return "TCP 64 B ping-pong"
	case RsocketBW:
		return "rsocket stream (rxego)"
	case RsocketPP:
		return "rsocket 64 B ping-pong (rxego)"
	}
	return string(c.Kind)
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// Result is what one side of a case measured. Zero fields were not
// measured by that side.
type Result struct {
	Case    Case
	Role    string
	Elapsed time.Duration `json:",omitempty"`
	Bytes   uint64        `json:",omitempty"` // payload bytes moved in Elapsed
	Msgs    uint64        `json:",omitempty"` // messages (or datagrams) in Elapsed
	// Latency percentiles of round trips.
	P50, P99 time.Duration `json:",omitempty"`
	Samples  int           `json:",omitempty"`
	// Rounds counts every round trip, the warm-up's too: the divisor of
	// whole-process counts (bench/roundtrips.sh).
	Rounds int `json:",omitempty"` // message rate: every WRITE completed
	// AllocsPerPkt is heap allocations per packet over the measurement,
	// both directions of this process's traffic counted.
	AllocsPerPkt float64 `json:",omitempty"`
	Packets      uint64  `json:",omitempty"`
	// CPU is the user and system time this side used in the measured
	// interval; merged results hold both sides' sum.
	CPU time.Duration `json:",omitempty"`
	// ClientCPU is the client's share of CPU in a merged result: in the
	// UDP, TCP, WRITE and SEND bandwidth cases, the sender's.
	ClientCPU time.Duration `json:",omitempty"`
	// CPUs is how many CPUs the machine had (runtime.NumCPU) when the
	// case ran; 0 in runs written before it was recorded.
	CPUs int `json:",omitempty"`
	// MemPerQP is heap bytes per idle connected QP; MemTotal for all.
	MemPerQP float64 `json:",omitempty"`
	MemTotal uint64  `json:",omitempty"`
	// Low and High are the lowest and highest figure (see figure) of the
	// Runs successful runs a median result was taken from.
	Low, High float64 `json:",omitempty"`
	Runs      int     `json:",omitempty"`
	// Counters worth a look: retransmissions, drops, GSO use.
	Counters map[string]uint64 `json:",omitempty"`
	Err      string            `json:",omitempty"`
}

// Gbps returns the measured payload rate in Gbit/s.
func (r Result) Gbps() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) * 8 / r.Elapsed.Seconds() / 1e9
}

// Cores returns how many CPUs both sides kept busy on average.
func (r Result) Cores() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return r.CPU.Seconds() / r.Elapsed.Seconds()
}

// figure is what a result is ranked by: latency p50 in microseconds,
// messages per second for the message rate, Gbit/s otherwise.
func (r Result) figure() float64 {
	switch {
	case r.Samples > 0:
		return float64(r.P50) / 1e3
	case r.Case.Kind == RxegoRate:
		return r.Rate()
	case r.Bytes > 0:
		return r.Gbps()
	}
	return r.Rate()
}

// span formats the range of a median result's runs as "lo-hi", scaled
// by div, or the single figure when there was one run.
func (r Result) span(div float64, format string) string {
	if r.Runs < 2 {
		return fmt.Sprintf(format, r.figure()/div)
	}
	return fmt.Sprintf(format+"-"+format, r.Low/div, r.High/div)
}

// Rate returns messages per second.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Msgs) / r.Elapsed.Seconds()
}

// merge combines the two sides' results: measured fields from whichever
// side measured them, counters from both.
func merge(a, b Result) Result {
	out := a
	out.CPU = a.CPU + b.CPU
	out.ClientCPU = a.CPU
	if b.Role == "client" {
		out.ClientCPU = b.CPU
	}
	if out.Elapsed == 0 {
		out.Elapsed, out.Bytes, out.Msgs = b.Elapsed, b.Bytes, b.Msgs
	}
	if out.Samples == 0 {
		out.P50, out.P99, out.Samples = b.P50, b.P99, b.Samples
	}
	if out.MemPerQP == 0 {
		out.MemPerQP, out.MemTotal = b.MemPerQP, b.MemTotal
	}
	if out.Packets == 0 {
		out.AllocsPerPkt, out.Packets = b.AllocsPerPkt, b.Packets
	}
	if out.Err == "" {
		out.Err = b.Err
	}
	out.Counters = nil
	for _, r := range []Result{a, b} {
		for k, v := range r.Counters {
			if out.Counters == nil {
				out.Counters = map[string]uint64{}
			}
			out.Counters[r.Role+"."+k] = v
		}
	}
	return out
}

// rateBatch is how many WRITEs one PostSend of the message-rate case
// carries (default 64); only the last of each is signaled, as perftest's
// completion moderation (-Q) does.
func (c Case) rateBatch() int {
	if c.Batch > 0 {
		return c.Batch
	}
	return 64
}
