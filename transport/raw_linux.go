package transport

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/icrc"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// dropAll is the classic BPF program "ret #0": the socket accepts nothing.
var dropAll = []bpf.Instruction{bpf.RetConstant{Val: 0}}

// acceptAll keeps every datagram whole.
var acceptAll = []bpf.Instruction{bpf.RetConstant{Val: 0xffffffff}}

// udpPortFilter accepts IPv4 datagrams (as a raw socket sees them, from
// the IP header on) that are not fragments and go to UDP port port.
func udpPortFilter(port uint16) []bpf.Instruction {
	return []bpf.Instruction{
		bpf.LoadAbsolute{Off: 6, Size: 2},                                // flags and fragment offset
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: 4},      // a fragment
		bpf.LoadMemShift{Off: 0},                                         // X = IP header length
		bpf.LoadIndirect{Off: 2, Size: 2},                                // UDP destination port
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(port), SkipFalse: 1}, // ours?
		bpf.RetConstant{Val: 1 << 18},                                    // the whole datagram
		bpf.RetConstant{Val: 0},
	}
}

func attachFilter(fd int, prog []bpf.Instruction) error {
	return attachFilterOpt(fd, unix.SO_ATTACH_FILTER, prog)
}

// attachFilterOpt assembles prog and attaches it with socket option opt
// (SO_ATTACH_FILTER, SO_ATTACH_REUSEPORT_CBPF).
func attachFilterOpt(fd, opt int, prog []bpf.Instruction) error {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return err
	}
	f := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		f[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, opt, &unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]})
}

// openRaw opens the raw IPv4 socket of RecvRaw: it sees a copy of every
// UDP datagram delivered to the local address, IP header included; the
// filter keeps only those to our port, before they are queued.
func openRaw(local netip.AddrPort, opts *Options) (int, error) {
	fail := func(what string, err error) (int, error) {
		hint := ""
		if err == unix.EPERM || err == unix.EACCES {
			hint = " (raw receive mode needs CAP_NET_RAW)"
		}
		return -1, fmt.Errorf("transport: listen %v%s: %w", local, hint, os.NewSyscallError(what, err))
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return fail("socket", err)
	}
	if err = attachFilter(fd, udpPortFilter(local.Port())); err != nil {
		unix.Close(fd)
		return fail("setsockopt SO_ATTACH_FILTER", err)
	}
	setBuffer(fd, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, opts.SocketRecvBuffer)
	recvFragSize(fd, false)
	if err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1); err != nil {
		unix.Close(fd)
		return fail("setsockopt SO_RXQ_OVFL", err)
	}
	// Binding a raw socket to an address keeps only datagrams to it.
	if err = unix.Bind(fd, &unix.SockaddrInet4{Addr: local.Addr().As4()}); err != nil {
		unix.Close(fd)
		return fail("bind", err)
	}
	return fd, nil
}

// maxRoCEPacket is the longest RoCE packet: the largest IB MTU (4096)
// of payload plus generous room for headers, pad and ICRC.
const maxRoCEPacket = 4096 + 128

// maxSplitTries bounds the ICRC checks spent looking for the segment size
// of a GSO batch read whole through the raw socket.
const maxSplitTries = 8

// startRaw sets up the walk through a datagram read by the raw socket.
func (c *udpConn) startRaw(b []byte) (DropReason, []byte, bool) {
	r := &c.r
	if len(b) < 20 || b[0]>>4 != 4 {
		return DropShort, b, true
	}
	ihl := int(b[0]&0xf) * 4
	if ihl < 20 || len(b) < ihl+8 {
		return DropShort, b, true
	}
	u := b[ihl:]
	ulen := int(binary.BigEndian.Uint16(u[4:]))
	dst := netip.AddrFrom4([4]byte(b[16:20]))
	if b[9] != unix.IPPROTO_UDP || binary.BigEndian.Uint16(u[2:]) != c.ep.local.Port() || dst != c.ep.local.Addr() {
		return 0, nil, false // not ours: the filter and bind() should not let it through
	}
	if ulen < 8 || ulen > len(u) {
		return DropShort, b, true
	}
	p := u[8:ulen]
	sport := binary.BigEndian.Uint16(u[0:])
	r.peer = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[12:16])), sport)
	r.tos = b[1]
	r.id = binary.BigEndian.Uint16(b[4:])
	v := icrc.V4{Src: [4]byte(b[12:16]), Dst: [4]byte(b[16:20]), SrcPort: sport, DstPort: c.ep.local.Port(), DF: b[6]&0x40 != 0}
	r.flow, r.flowPeer = v.Flow(), r.peer
	r.first = false
	if len(p) == 0 {
		return DropShort, p, true
	}
	// The raw socket sees a datagram before UDP does, so what the kernel
	// would drop for its checksum is dropped here, and the IP header shows
	// what socket mode must infer: a reassembled datagram, a missing DF.
	switch {
	case r.frag:
		return DropFragment, p, true
	case !v.DF:
		return DropNoDF, p, true
	case !udpChecksumOK(b[12:20], u[:ulen]):
		return DropBadUDPChecksum, p, true
	}
	r.data = p
	// A datagram longer than any one RoCE packet must be a GSO batch: skip
	// the whole-datagram check, which could only fail.
	if len(p) <= maxRoCEPacket {
		if pk, _, ok := classify(p); ok && r.flow.Check(r.id, p) {
			r.first, r.firstPkt = true, pk
			return 0, nil, false
		}
	}
	// A GSO batch from a sender on this host arrives unsegmented (lo and
	// veth pass GSO packets through) and the raw socket sees it whole, with
	// the first segment's ID. Find the segment size: the size at which the
	// first packet's ICRC checks.
	if s, pk := findSegment(r.flow, r.id, p); s > 0 {
		r.seg, r.first, r.firstPkt = s, true, pk
		c.ctr.groBatches.Add(1)
		c.ctr.groSegments.Add(uint64((len(p) + s - 1) / s))
	}
	return 0, nil, false
}

// findSegment returns the length of the first packet of p, a run of
// packets with IDs id, id+1, ..., and that packet parsed, or 0. Candidates are 4-byte multiples
// (every RoCE packet is one) where a plausible BTH starts: a known opcode,
// TVer 0 and the first packet's P_Key.
func findSegment(flow icrc.Flow, id uint16, p []byte) (int, bth.Packet) {
	tries := 0
	for s := minPacket; s+minPacket <= len(p) && tries < maxSplitTries; s += 4 {
		q := p[s:]
		if q[1]&0x0f != 0 || q[2] != p[2] || q[3] != p[3] {
			continue
		}
		if _, ok := bth.Lookup(bth.Opcode(q[0])); !ok {
			continue
		}
		tries++
		if pk, _, ok := classify(p[:s]); ok && flow.Check(id, p[:s]) {
			return s, pk
		}
	}
	return 0, bth.Packet{}
}

// verifyRaw checks one packet read through the raw socket with its real ID.
func (c *udpConn) verifyRaw(pkt []byte) (bth.Packet, uint16, DropReason, bool) {
	r := &c.r
	id := r.id
	r.id++
	if r.first {
		r.first = false
		return r.firstPkt, id, 0, true
	}
	p, reason, ok := classify(pkt)
	if !ok {
		return p, 0, reason, false
	}
	if !r.flow.Check(id, pkt) {
		return p, 0, DropBadICRC, false
	}
	return p, id, 0, true
}
