// Package transport is rxego's UDP port 4791 I/O layer: it sends RoCEv2
// packets (BTH through ICRC) built by the engine, filling in their ICRCs,
// and hands back received packets whose ICRC checked.
//
// # Conns
//
// [Listen] opens a [Conn] on one local address (the GID). Send and Recv move
// batches of [Message] values with sendmmsg(2) and recvmmsg(2) through
// preallocated slots, so the steady state allocates nothing; Recv returns
// views into the Conn's buffers, valid until its next call. One goroutine
// may Send while another Recvs. The sockets are not in the Go runtime's
// poller: a Recv or Send that must wait parks on an epoll instance of the
// Conn's own that holds the socket armed only while someone waits, so a
// busy socket's traffic wakes no idle thread (armed_linux.go); a reader
// in a round trip waits in the kernel on an instance of its own, so the
// datagram's wake-up reaches it directly (directwait_linux.go). UDP GSO (UDP_SEGMENT) sends a Seg run of
// equal-size packets in one datagram, and UDP GRO (UDP_GRO) receives
// coalesced datagrams that Recv splits again; both are probed at Listen and
// on by default. A scattered Message (Message.Payload set; see
// [Scatterer]) keeps its payloads where they lie, in registered memory:
// each packet goes to the kernel as three iovecs (header, payload and
// trailer), a GSO run as one datagram of all of them, and the ICRC is
// computed over the pieces, so the payload is never copied in user space.
// [NewPipeNetwork] is an in-memory fabric with the same
// ICRC rules for tests without sockets; package transport/impair wraps any
// Conn with seeded loss, bursts, duplication, reordering, delay,
// corruption and CE marking. A [Tap] sees every packet sent, received and dropped.
//
// # IPv4 Identification and the ICRC
//
// The IPv4 ICRC covers the IP ID, so a sender must know the ID the kernel
// will write. Measured on Linux 6.18 by capturing on veth pairs and lo in
// private namespaces (TestWireIPID, TestWireKernelIDs, TestLoopbackWire):
//
//   - An unconnected UDP socket with IP_MTU_DISCOVER=IP_PMTUDISC_DO (DF),
//     which is what Listen opens, writes ID 0 on every packet.
//   - A GSO datagram from it is numbered 0, 1, 2, ... per segment: on the
//     wire when software GSO segments it before a device without UDP
//     segmentation offload, and likewise when it travels whole (lo and veth
//     pass GSO datagrams through) and the receiving socket segments it.
//     NICs doing UDP segmentation offload increment the ID per segment the
//     same way (not measured here: no such NIC).
//   - The default path-MTU mode (IP_PMTUDISC_WANT, which also sets DF)
//     and connected sockets take the ID from a counter (hashed per
//     destination, or per socket) starting at an unknowable value: rxego
//     never uses them.
//
// Send therefore computes single packets' ICRCs for ID 0 and segment i of a
// GSO run for ID i; every packet captured in the tests checks against its
// real headers.
//
// A receiver reading a UDP socket does not see the ID. In [RecvSocket] mode
// (the default, unprivileged) IPv4 packets are checked with
// icrc.V4.Recover, which finds the one ID that makes the ICRC match and so
// misses a random corruption with probability 2^-16; IPv6 has no ID and is
// checked in full. [RecvRaw] mode (CAP_NET_RAW) reads IPv4 datagrams with
// their headers through a raw socket with a classic BPF filter for the
// port, and checks the full CRC against the real ID; the UDP socket stays
// bound, with a drop-everything filter, so the kernel sends no ICMP port
// unreachable. A GSO datagram from a sender on the same host reaches the
// raw socket whole; raw mode finds its segment size from the first
// packet's ICRC. Packets that fail are dropped and counted by
// [DropReason].
//
// # Wire details
//
//   - DF is set (IP_PMTUDISC_DO, IPV6_PMTUDISC_DO) as rxe does; a packet
//     over the path MTU fails Send with EMSGSIZE.
//   - UDP checksum: rxe sends 0. Without GSO, IPv4 sends do the same
//     (SO_NO_CHECK), saving the sum where no NIC computes it. The kernel
//     refuses GSO on such a socket (EINVAL), so with GSO the checksum is
//     left to the device (CHECKSUM_PARTIAL: free on lo and veth, offloaded
//     on NICs). IPv6 sockets accept zero checksums (UDP_NO_CHECK6_RX) and
//     send real ones: RFC 6935 allows zero only for tunnels; rxe accepts
//     both.
//   - Source port: packets leave from the bound port, 4791. rxe picks
//     0xC000 | hash(QPN) for ECMP entropy and accepts any source port, so
//     this interoperates, but all of a host pair's QPs hash onto one path.
//   - TOS / traffic class: per message through IP_TOS / IPV6_TCLASS
//     control messages in the same sendmmsg (0 means the Conn's default),
//     read back per datagram with IP_RECVTOS / IPV6_RECVTCLASS. The
//     segments of a GSO run share its TOS, and GRO never coalesces packets
//     of different TOS (the IPv4 and IPv6 GRO layers end a batch on any
//     TOS or traffic class difference; measured in TestGROVeth), so every
//     packet of a GRO batch truly had the batch's TOS.
//
// # Privileges
//
// Everything works unprivileged except: RecvRaw (CAP_NET_RAW; Listen fails
// with EPERM and says so), socket buffers beyond net.core.rmem_max /
// wmem_max (SO_RCVBUFFORCE / SO_SNDBUFFORCE need CAP_NET_ADMIN; Listen
// falls back to SO_RCVBUF / SO_SNDBUF quietly), and the tests that create
// network namespaces or capture packets (they skip).
//
// See docs/transport.md for measurements.
package transport
