package transport

import (
	"errors"
	"net/netip"
	"strconv"
	"time"

	"github.com/rxego/rxego/bth"
)

// Port is the IANA UDP port of RoCEv2.
const Port = 4791

// MaxSegments is the most packets one GSO send (one [Message] with Seg set)
// may carry. The kernel's limit is higher on recent kernels; 64 is what
// every kernel with UDP GSO accepts and what GRO coalesces at most.
const MaxSegments = 64

// minPacket is the shortest RoCE packet: a BTH and an ICRC.
const minPacket = 12 + 4

// Message is one RoCE packet (or, with Seg, a run of packets for one GSO
// send) in a batch.
type Message struct {
	// Buf is, on send, the packet from the BTH through the ICRC, with the
	// four ICRC bytes present: Send computes and writes them. On receive it
	// is a view into the Conn's buffers, valid until the next Recv call.
	Buf []byte
	// Pkt is, on receive, Buf parsed against the opcode table (bth.Parse,
	// which every received packet passed): the engine takes it as it is,
	// so a packet is parsed once. Ignored on send.
	Pkt bth.Packet
	// Peer is the destination on send and the source on receive.
	Peer netip.AddrPort
	// TOS is the IPv4 TOS or IPv6 traffic class (DSCP<<2 | ECN). On send, 0
	// means the Conn's default (Options.TOS); on receive it is what arrived.
	TOS uint8
	// Seg, on send, when > 0, says Buf holds consecutive complete packets of
	// Seg bytes each (the last may be shorter), sent as one UDP GSO datagram
	// where the kernel supports it and as separate datagrams otherwise.
	// Ignored on receive (set to 0).
	Seg int
	// Payload, on send, when not nil, makes the message scattered: the
	// packets' payloads lie back to back in Payload (registered memory,
	// sent from where it lies) and Buf holds only each packet's header
	// (BTH through its extension headers) and trailer (pad and ICRC),
	// packet after packet. A packet on the wire is its header, its
	// payload and its trailer; Seg counts those wire bytes. Send computes
	// each ICRC over the pieces (Listen's Conns write it into the
	// trailer; a pipe into the copy it delivers). Only a Conn that is a
	// Scatterer accepts it (others return ErrScattered). Nil on receive.
	Payload []byte
	// IPID is, on receive, the IPv4 Identification the packet carried: read
	// from the IP header in raw mode, recovered from the ICRC in socket mode.
	// 0 for IPv6. Ignored on send.
	IPID uint16
}

// Conn moves RoCE packets over UDP. One goroutine may call Send while
// another calls Recv; Stats, SetTap, LocalAddr and Close are safe from any
// goroutine.
type Conn interface {
	// Send computes the ICRC of every packet in msgs (for the IP ID each one
	// will carry on the wire) and sends them in as few system calls as it
	// can. It returns how many messages were sent completely; when that is
	// less than len(msgs), err says why msgs[n] was not sent (a malformed
	// message is rejected before anything of it is sent). Send does not keep
	// msgs or their buffers after it returns.
	Send(msgs []Message) (n int, err error)
	// Recv blocks until at least one packet that passed the ICRC check has
	// arrived, fills msgs[:n] with packets and returns n. Packets that fail a
	// check are dropped and counted in Stats. After Close it returns
	// net.ErrClosed.
	Recv(msgs []Message) (n int, err error)
	// LocalAddr returns the address and port the Conn is bound to.
	LocalAddr() netip.AddrPort
	// Stats returns a snapshot of the Conn's counters.
	Stats() Stats
	// SetTap installs an observer of every packet sent, received and
	// dropped; nil removes it.
	SetTap(Tap)
	// Close releases the Conn's sockets and unblocks Recv. A Conn of
	// Listen or ListenGroup dropped without Close is closed when the
	// garbage collector finds it unreachable, as an *os.File is; Close
	// releases it at once.
	Close() error
}

// RecvMode selects how received IPv4 packets are read and checked.
type RecvMode uint8

const (
	// RecvSocket reads through the UDP socket, which hides the IPv4 ID:
	// the ICRC is checked by recovering the one ID that makes it match
	// (icrc.V4.Recover), which misses a random corruption with probability
	// 2^-16. IPv6 packets are always checked in full. Needs no privileges.
	RecvSocket RecvMode = iota
	// RecvRaw reads IPv4 packets with their IP header through a raw socket
	// and checks the full ICRC with the real ID. Needs CAP_NET_RAW. IPv4
	// only: IPv6 has no ID, so socket mode already checks it in full.
	RecvRaw
)

// String returns "socket" or "raw".
func (m RecvMode) String() string {
	switch m {
	case RecvSocket:
		return "socket"
	case RecvRaw:
		return "raw"
	}
	return "RecvMode(" + strconv.Itoa(int(m)) + ")"
}

// Options configure Listen. The zero value is the default everywhere.
type Options struct {
	// NoGSO turns UDP segmentation offload off for sends. GSO is on by
	// default where the kernel supports it (probed at Listen).
	NoGSO bool
	// NoGRO turns UDP receive coalescing off. GRO is on by default where
	// the kernel supports it. Raw mode never uses it.
	NoGRO bool
	// BatchSize is the number of datagrams per sendmmsg/recvmmsg call;
	// default 64.
	BatchSize int
	// RecvBufSize is the size of each receive slot in bytes: the largest
	// datagram (or GRO batch) accepted. Default 65535 with GRO, 9216
	// without (jumbo frames); longer datagrams are dropped and counted.
	RecvBufSize int
	// SocketRecvBuffer and SocketSendBuffer are the kernel socket buffer
	// sizes in bytes; default 4 MiB each. SO_RCVBUFFORCE / SO_SNDBUFFORCE
	// are tried first (they need CAP_NET_ADMIN and pass the sysctl limits),
	// then SO_RCVBUF / SO_SNDBUF, which the kernel caps at
	// net.core.rmem_max / wmem_max.
	SocketRecvBuffer, SocketSendBuffer int
	// Mode selects how received packets are checked; see RecvMode.
	Mode RecvMode
	// TOS is the TOS / traffic class of messages sent with TOS 0.
	TOS uint8
	// SourcePorts, when positive, makes the Conn send from that many
	// extra sockets bound to UDP source ports in 0xC000-0xFFFF (as rxe
	// and RNICs send from, for ECMP and RSS entropy) instead of from its
	// own port: each packet leaves from the one its destination QP hashes
	// to (FlowHash), so one connection keeps one port and connections
	// spread. The Conn still receives on its own port. 0 sends from it.
	// Send then regroups msgs in place by source socket (each QP's
	// messages keep their order) and its n counts them in that order.
	SourcePorts int
}

// SourcePorter is implemented by Conns that send from a pool of source
// ports (Options.SourcePorts): their ports, in the order FlowPort numbers
// them. Pass len(SourcePorts()) to Coalesce.
type SourcePorter interface {
	SourcePorts() []uint16
}

// RecvBufferer is implemented by Conns that know the receive buffer the
// kernel gave their reading socket: SO_RCVBUF read back after Listen set
// it, in the kernel's accounting (twice what was asked, bounded by
// net.core.rmem_max unless SO_RCVBUFFORCE passed). A device sizes the
// READ responses it lets be in flight from it, so that a burst of them
// cannot overflow its own socket.
type RecvBufferer interface {
	RecvBuffer() int
}

// Poller is implemented by Conns that can receive without blocking, for
// receive loops that let other goroutines (an application polling for
// completions) take in packets too. The Conns of Listen implement it.
type Poller interface {
	// TryRecv is Recv that never waits: it returns 0 at once when no
	// packet is queued, or when another goroutine is receiving.
	TryRecv(msgs []Message) (n int, err error)
	// WaitReadable blocks until a packet may be queued (it reads
	// nothing, so another goroutine's TryRecv may take it first) or the
	// Conn is closed (net.ErrClosed).
	WaitReadable() error
}

// Quieter is implemented by Conns whose sockets can leave the kernel's
// wait queues while a goroutine busy-polls them (the Conns of Listen on
// Linux). A socket that may be waited on has entries there, which the
// kernel runs, with interrupts off, for every datagram the socket is
// given and every one it frees, on the sending CPU: on loopback that
// cost busy-polled round trips 2-18% and busy-polled 64-byte rates up
// to half (docs/performance.md, "Busy-polled sockets out of the wait
// queues"), and nobody waits on a socket a goroutine spins on.
type Quieter interface {
	// Quiet takes the Conn's sockets out of its wait instances until a
	// Recv, RecvWait, WaitReadable or Send has to block, which puts them
	// back before it blocks (so no datagram is missed: one queued
	// meanwhile ends that wait at once). A socket a goroutine waits on
	// now stays as it is. Call it from any goroutine; it is cheap when
	// the sockets are already out.
	Quiet()
}

// Waker is implemented by Conns whose blocking receive another goroutine
// can cut short, for receive loops that let an application goroutine
// waiting for a completion read the socket itself (so that the goroutine
// the packet wakes is the one that wanted it, with no hand-off between
// goroutines) and still stop when the application must look elsewhere.
// The Conns of Listen implement it.
type Waker interface {
	// WakeSeq returns how many times Wake has been called. A caller reads
	// it before checking whatever it is waiting for and passes it to
	// RecvWait, so that a Wake in between is not lost.
	WakeSeq() uint64
	// RecvWait is Recv that also returns (0, nil) when Wake has been
	// called since WakeSeq returned seq, and when until (if not zero)
	// passes. It may also return (0, nil) for no reason; callers loop.
	// One goroutine at a time may call it; a Recv or WaitReadable meeting
	// a Wake meant for it ignores it.
	RecvWait(msgs []Message, seq uint64, until time.Time) (n int, err error)
	// Wake makes the RecvWait blocked now, or else the next to start,
	// return. It never blocks; call it from any goroutine.
	Wake()
}

// Errors returned by Listen and Send. Listen wraps system errors (address
// in use, permission) with what it was doing.
var (
	ErrAddress    = errors.New("transport: local address must be a specific IPv4 or IPv6 unicast address")
	ErrPeer       = errors.New("transport: peer must be a unicast address of the local family with a nonzero port")
	ErrPacketSize = errors.New("transport: packet shorter than BTH+ICRC or longer than a UDP datagram")
	ErrSegments   = errors.New("transport: Seg run invalid (segment shorter than BTH+ICRC, over MaxSegments or over 64 KiB)")
	ErrRawIPv6    = errors.New("transport: raw receive mode is IPv4 only (IPv6 ICRCs are checked in full in socket mode)")
	ErrScattered  = errors.New("transport: scattered message (Payload set) not taken by this Conn, or its Buf and Payload do not split into packets as their BTHs say")
	ErrRawGroup   = errors.New("transport: raw receive mode cannot be steered to a group of Conns (its raw socket sees every packet)")
)

// Dir is the direction of a packet seen by a Tap.
type Dir uint8

// Directions.
const (
	Out Dir = iota // sent
	In             // received and verified
)

// String returns "out" or "in".
func (d Dir) String() string {
	if d == Out {
		return "out"
	}
	return "in"
}

// DropReason says why a received datagram or packet was dropped.
type DropReason uint8

// Drop reasons, indexes into Stats.Drops.
const (
	DropShort          DropReason = iota // shorter than BTH+ICRC, or headers cut short
	DropNotRoCE                          // bth.Parse rejects it: unknown opcode, TVer, payload rules
	DropBadICRC                          // ICRC does not match
	DropTruncated                        // datagram longer than the receive slot
	DropOverflow                         // receive queue full (kernel socket buffer or pipe queue); no packet to show
	DropBadUDPChecksum                   // UDP checksum wrong (the kernel drops it in socket mode; no packet to show then)
	DropFragment                         // an IP datagram that arrived in fragments (RoCEv2 packets carry DF)
	DropNoDF                             // an IPv4 packet sent without DF (RoCEv2 requires it; its ICRC was computed so); in socket mode from the second such packet in a row of a peer on (see noDFWitness)
	NumDropReasons
)

// dropNames are the reasons' names: metric label values (rxego_transport_dropped_pkts_total),
// pcapng comments and stats keys, so snake_case as Prometheus labels are.
var dropNames = [NumDropReasons]string{"short", "not_roce", "bad_icrc", "truncated", "overflow", "bad_udp_csum", "fragment", "no_df"}

// String returns the reason's snake_case name.
func (r DropReason) String() string {
	if r < NumDropReasons {
		return dropNames[r]
	}
	return "DropReason(" + strconv.Itoa(int(r)) + ")"
}

// Tap observes a Conn's traffic: for pcap writing, live tracing and
// metrics. Its methods are called from the goroutine calling Send or Recv,
// after the Conn's locks are released, with a timestamp taken once per
// batch; pkt is only valid during the call. Keep them fast.
type Tap interface {
	// Packet is called for every packet sent (after its ICRC is filled in,
	// once per GSO segment, with the IP ID it will carry) and every packet
	// received that passed the checks.
	Packet(dir Dir, at time.Time, local, remote netip.AddrPort, tos uint8, ipID uint16, pkt []byte)
	// Drop is called for every received packet that was dropped, except
	// for DropOverflow and, in socket mode, DropBadUDPChecksum, which the
	// kernel dropped: they have no packet.
	Drop(reason DropReason, at time.Time, local, remote netip.AddrPort, tos uint8, pkt []byte)
}

// FilledSender is implemented by this package's Conns: Send without
// computing the ICRCs, for packets that carry theirs already (the
// impairment shim, transport/impair, sends corrupted ones).
type FilledSender interface {
	// SendFilled sends msgs as Send does, leaving their ICRCs as they are.
	SendFilled(msgs []Message) (int, error)
}
