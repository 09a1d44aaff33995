// Package ladder turns a RoCEv2 trace into what a person can read at a
// glance: packets grouped by QP pair and by message, each QP pair drawn as
// a ladder (sequence) diagram with the requester and responder as
// columns, and what went wrong marked on the packets where it happened:
// NAKs, retransmissions and the packet that was lost, RNR waits, duplicate
// ACKs, congestion marks (CE), CNPs and rate changes. Per-direction
// statistics (messages, bytes, retransmissions, RTT estimates) close each
// QP pair.
//
// A Builder collects trace.Records (from a file, a live capture or a
// device's tap) and Finish analyses them into a Trace. WriteText draws it
// for a terminal and WriteHTML as a self-contained page with SVG. Both
// renderers draw the same rows (see Rows), so the page and the terminal
// show the same ladder.
//
// The analysis reads the packets as one capture point saw them, usually
// one of the two hosts. Times are relative to the first packet of the
// trace. An RTT sample is the time from a request packet (sent once, not
// retransmitted) to the first response that covers it, as seen at the
// capture point: the true round trip when the capture was taken at the
// requester.
package ladder

import (
	"net/netip"
	"strconv"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/app/trace"
)

// Endpoint is one side of a QP pair: an address and a QP number. QPNKnown
// is false when no packet to that QP was captured (a one-way flow).
type Endpoint struct {
	Addr     netip.Addr
	QPN      uint32
	QPNKnown bool
}

// String formats the endpoint as "127.0.0.1 QP 0x000011" (or "QP ?").
func (e Endpoint) String() string {
	s := e.Addr.String() + " QP "
	if !e.QPNKnown {
		return s + "?"
	}
	return s + qpn(e.QPN)
}

// qpn formats a QP number as rxe and tshark users see it.
func qpn(n uint32) string {
	h := strconv.FormatUint(uint64(n), 16)
	for len(h) < 6 {
		h = "0" + h
	}
	return "0x" + h
}

// Kind is what a packet is in its conversation.
type Kind uint8

// Packet kinds.
const (
	KindRequest   Kind = iota // SEND, WRITE, READ request, atomic, ...
	KindAck                   // ACKNOWLEDGE with an ACK syndrome
	KindNAK                   // ACKNOWLEDGE with a NAK syndrome
	KindRNR                   // ACKNOWLEDGE with an RNR NAK syndrome
	KindReadResp              // RDMA READ response
	KindAtomicAck             // ATOMIC ACKNOWLEDGE
	KindCNP                   // congestion notification
	KindBad                   // not a valid RoCEv2 packet
)

// Mark is a set of things worth a reader's attention on one packet.
type Mark uint16

// Marks. The first group are problems; the rest are notable events.
const (
	MarkLost       Mark = 1 << iota // a copy the peer never got: a NAK named it, or it timed out
	MarkNAK                         // a NAK: PSN sequence error or a fatal error
	MarkRetransmit                  // sent again
	MarkRNR                         // Receiver Not Ready NAK
	MarkDupACK                      // an ACK for PSNs already acknowledged
	MarkDuplicate                   // a response sent again (READ replay)
	MarkBadICRC                     // the ICRC does not check: the receiver drops it
	MarkMalformed                   // not a RoCEv2 packet
	MarkGap                         // PSNs skipped: packets missing from the capture
	MarkCE                          // arrived marked Congestion Experienced
	MarkCNP                         // a congestion notification
	MarkCoalesced                   // one ACK for several requests that asked for one
	MarkNote                        // an annotation (Trace.Annotate), not a packet
)

// problems are the marks that mean something went wrong.
const problems = MarkLost | MarkNAK | MarkRetransmit | MarkRNR | MarkDupACK | MarkDuplicate | MarkBadICRC | MarkMalformed | MarkGap

// markNames are the short tags of the marks, in bit order.
var markNames = [...]string{"LOST", "NAK", "RETX", "RNR", "DUP-ACK", "REPLAY", "BAD-ICRC", "MALFORMED", "GAP", "CE", "CNP", "COALESCED", "NOTE"}

// Tags returns the short tags of the marks set, e.g. ["NAK", "RETX"].
func (m Mark) Tags() []string {
	var t []string
	for i, n := range markNames {
		if m&(1<<i) != 0 {
			t = append(t, n)
		}
	}
	return t
}

// Problem reports whether any mark says something went wrong.
func (m Mark) Problem() bool { return m&problems != 0 }

// Packet is the part of a trace.Record the ladder needs, kept small so a
// large capture fits in memory.
type Packet struct {
	Frame    int
	Time     time.Time
	Src, Dst netip.Addr
	ECN      uint8
	Err      string // set for a malformed packet; the fields below are zero
	Opcode   bth.Opcode
	DestQP   uint32
	PSN      bth.PSN
	AckReq   bool
	FECN     bool
	BECN     bool
	Len      int  // payload bytes
	ICRCOK   bool // the ICRC checked
	Syndrome uint8
	HasAETH  bool
	MSN      uint32
	DMALen   uint32 // RETH DMA length
	HasRETH  bool
	SrcQP    uint32 // DETH source QP
	HasDETH  bool
	Imm      uint32
	HasImm   bool
	Atomic   *AtomicFields // atomic request or ACK values
	CM       *trace.CM     // the CM message of a UD SEND to QP1
}

// AtomicFields are an atomic request's operands or an atomic ACK's result.
type AtomicFields struct {
	SwapAdd, Compare, Orig uint64
}

// Message is one message of a conversation: a SEND, WRITE, READ or
// atomic, from its first request packet to the response that completes it.
type Message struct {
	N        int  // 1-based number in its conversation, in order of first packet
	FromA    bool // sent by the conversation's A side
	Op       string
	FirstPSN bth.PSN
	LastPSN  bth.PSN
	Bytes    int // payload bytes (the DMA length for READ)
	Packets  int // request and response packets, first transmissions only
	Start    time.Time
	End      time.Time // when the response completing it was seen; zero if none
	Done     bool
	Retx     int    // packets of it sent again
	Status   string // why it did not complete normally, if it did not
	// answered is set for READs and atomics, which complete with their
	// responses rather than with an ACK.
	answered bool
}

// Event is one row of a conversation: a packet, or an annotation.
type Event struct {
	Pkt   *Packet // nil for an annotation
	Time  time.Time
	FromA bool
	Kind  Kind
	Msg   *Message // the message a request or response belongs to
	Marks Mark
	Label string // what the arrow says, e.g. "WRITE_FIRST psn 1000 1024B"
	Notes []string
}

// DirStats are the statistics of one direction of a conversation: the
// requests one side sent and the responses it got.
type DirStats struct {
	Messages     int
	Bytes        int64 // request payload bytes (READ: bytes read)
	Packets      int   // request packets, retransmissions included
	Retransmits  int
	Lost         int
	NAKs         int // NAKs received (sequence and fatal)
	RNRNAKs      int
	CNPs         int // CNPs received
	CEMarks      int // CE-marked request packets
	DupACKs      int
	RTT          []time.Duration // samples
	Acks         int
	Coalesced    int // ACKs covering several requests
	ResponseSeen int // response packets
}

// RTTStats summarises the RTT samples: count, min, mean, max.
func (s *DirStats) RTTStats() (n int, lo, mean, hi time.Duration) {
	n = len(s.RTT)
	if n == 0 {
		return 0, 0, 0, 0
	}
	lo, hi = s.RTT[0], s.RTT[0]
	var sum time.Duration
	for _, d := range s.RTT {
		lo, hi = min(lo, d), max(hi, d)
		sum += d
	}
	return n, lo, sum / time.Duration(n), hi
}

// Conversation is a QP pair (or a flow whose peer was not captured) with
// its events in capture order.
type Conversation struct {
	N        int // 1-based
	A, B     Endpoint
	Class    bth.Class
	Events   []Event
	Messages []*Message
	// Stats[0] is A's requests (A -> B), Stats[1] B's (B -> A).
	Stats [2]DirStats
}

// Trace is an analysed capture.
type Trace struct {
	Start         time.Time // first packet
	End           time.Time // last packet
	Packets       int
	Conversations []*Conversation
}
