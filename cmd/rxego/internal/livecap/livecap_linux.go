// Package livecap captures RoCEv2 frames live from a network interface
// through an AF_PACKET socket (Linux; needs CAP_NET_RAW), for `rxego
// trace -i`. A classic BPF filter in the kernel passes only UDP to or
// from port 4791, so a busy interface costs little.
//
// A UDP socket on port 4791 cannot capture passively: binding it would
// take packets away from the endpoint they are for. AF_PACKET sees them
// whatever receives them, in both directions, with the real IP and UDP
// headers (so the ICRC is checked against the ID on the wire).
//
// A packet socket sees a UDP GSO datagram before the kernel cuts it into
// its segments (always on loopback). On kernels from 6.2, which can
// describe UDP GSO in a virtio_net_hdr, the socket asks for one
// (PACKET_VNET_HDR) and Next reports the segment size; earlier kernels
// would fail the read of such a datagram, so there the header is not
// asked for and Frame.GSOSize stays 0 (the caller infers it).
package livecap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/gopacket/gopacket/layers"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// ErrTimeout is returned by Next when no frame came within its timeout.
var ErrTimeout = errors.New("livecap: no frame before the timeout")

// Capture is an open live capture on one interface.
type Capture struct {
	fd       int
	loopback bool
	vnet     bool // frames start with a virtio_net_hdr
	buf      []byte
	timeout  time.Duration
	stats    Stats // the kernel's counters read so far
}

// Frame is one captured frame.
type Frame struct {
	Data []byte    // the frame, valid until the next call of Next
	Time time.Time // when it was read
	// GSOSize is, for a UDP GSO datagram not yet cut into its segments,
	// the UDP payload bytes of each segment (the last may be shorter); 0
	// for a frame that is one packet, or when KnowsGSO is false.
	GSOSize int
}

// vnetHdrLen is the size of struct virtio_net_hdr, which precedes each
// frame read with PACKET_VNET_HDR.
const vnetHdrLen = 10

// gsoUDPL4 is VIRTIO_NET_HDR_GSO_UDP_L4, the gso_type of a UDP GSO
// (UDP_SEGMENT) datagram.
const gsoUDPL4 = 5

// RoCEFilter is the kernel filter "udp port 4791" for Ethernet frames
// (IPv4 without fragments, IPv6 with UDP as the next header), what
// tcpdump compiles for that expression. Its last instruction rejects.
var RoCEFilter = []bpf.Instruction{
	bpf.LoadAbsolute{Off: 12, Size: 2},                         // EtherType
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x86dd, SkipFalse: 6}, // IPv6?
	bpf.LoadAbsolute{Off: 20, Size: 1},                         // next header
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 17, SkipFalse: 15},
	bpf.LoadAbsolute{Off: 54, Size: 2}, // source port
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 4791, SkipTrue: 12},
	bpf.LoadAbsolute{Off: 56, Size: 2}, // destination port
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 4791, SkipTrue: 10, SkipFalse: 11},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0x0800, SkipFalse: 10}, // IPv4?
	bpf.LoadAbsolute{Off: 23, Size: 1},                          // protocol
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 17, SkipFalse: 8},
	bpf.LoadAbsolute{Off: 20, Size: 2}, // flags and fragment offset
	bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: 6},
	bpf.LoadMemShift{Off: 14}, // X = IP header length
	bpf.LoadIndirect{Off: 14, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 4791, SkipTrue: 2},
	bpf.LoadIndirect{Off: 16, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: 4791, SkipFalse: 1},
	bpf.RetConstant{Val: 262144},
	bpf.RetConstant{Val: 0},
}

// DefaultBuffer is the socket receive buffer a capture asks for when
// Options.Buffer is 0: tcpdump's 2 MB is a few milliseconds of a busy
// loopback, and a capture that falls behind loses frames for good.
const DefaultBuffer = 8 << 20

// Options are a capture's settings.
type Options struct {
	// Host, when valid, keeps only frames to or from this address, in
	// the kernel filter: other hosts' traffic then never fills the
	// socket's buffer.
	Host netip.Addr
	// Buffer is the socket receive buffer in bytes (0: DefaultBuffer).
	// As root it is set beyond net.core.rmem_max (SO_RCVBUFFORCE);
	// otherwise rmem_max caps it.
	Buffer int
}

// Stats are a capture's kernel counters since it opened.
type Stats struct {
	// Frames is what passed the filter, Dropped included (on loopback
	// each packet twice: sent and received).
	Frames uint64
	// Dropped is what passed the filter but found the socket's buffer
	// full: frames the capture never saw.
	Dropped uint64
}

// Filter returns the kernel filter for "udp port 4791", and when host is
// valid "and host HOST" (source or destination), for Ethernet frames.
func Filter(host netip.Addr) []bpf.Instruction {
	if !host.IsValid() {
		return RoCEFilter
	}
	host = host.Unmap()
	etherType, src, dst := uint32(0x0800), uint32(14+12), uint32(14+16)
	if host.Is6() {
		etherType, src, dst = 0x86dd, 14+8, 14+24
	}
	raw := host.AsSlice()
	words := make([]uint32, len(raw)/4)
	for i := range words {
		words[i] = binary.BigEndian.Uint32(raw[4*i:])
	}
	// The host check comes first and falls through to RoCEFilter. Jumps
	// are built with absolute targets, then made relative.
	n := len(words)
	prefix := 2 + 2*n + 1 + 2*n // EtherType, source, jump to the ports, destination
	ports, reject := prefix, prefix+len(RoCEFilter)-1
	dstCheck := 2 + 2*n + 1
	type jump struct {
		at   int
		val  uint32
		t, f int // absolute targets
	}
	var prog []bpf.Instruction
	var jumps []jump
	add := func(in bpf.Instruction) { prog = append(prog, in) }
	cond := func(val uint32, t, f int) {
		jumps = append(jumps, jump{at: len(prog), val: val, t: t, f: f})
		add(nil)
	}
	add(bpf.LoadAbsolute{Off: 12, Size: 2})
	cond(etherType, len(prog)+1, reject)
	for i, w := range words { // source
		add(bpf.LoadAbsolute{Off: src + uint32(4*i), Size: 4})
		cond(w, len(prog)+1, dstCheck)
	}
	add(bpf.Jump{Skip: uint32(ports - len(prog) - 1)})
	for i, w := range words { // destination
		add(bpf.LoadAbsolute{Off: dst + uint32(4*i), Size: 4})
		cond(w, len(prog)+1, reject)
	}
	for _, j := range jumps {
		prog[j.at] = bpf.JumpIf{Cond: bpf.JumpEqual, Val: j.val, SkipTrue: uint8(j.t - j.at - 1), SkipFalse: uint8(j.f - j.at - 1)}
	}
	return append(prog, RoCEFilter...)
}

// Open starts capturing on the named interface. Frames are Ethernet
// frames (the loopback interface has an all-zero Ethernet header). Next
// waits at most timeout per call.
func Open(iface string, timeout time.Duration, o Options) (*Capture, error) {
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, noInterface(iface)
	}
	prog, err := bpf.Assemble(Filter(o.Host))
	if err != nil {
		return nil, err
	}
	if o.Buffer == 0 {
		o.Buffer = DefaultBuffer
	}
	proto := htons(unix.ETH_P_ALL)
	// Protocol 0: the socket takes in nothing until bind names the
	// protocol and the interface. Opened with ETH_P_ALL it would take in
	// every interface's frames at once, unfiltered, and bind would then
	// unhook it and hook it again, missing what passed meanwhile (an RCU
	// grace period: 10 ms lost mid-capture on a loaded machine, ci65).
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("livecap: AF_PACKET socket (needs CAP_NET_RAW, e.g. root): %w", err)
	}
	c := &Capture{fd: fd, loopback: ifi.Flags&net.FlagLoopback != 0, vnet: kernelAtLeast(6, 2), buf: make([]byte, 65536+64), timeout: timeout}
	filter := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		filter[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	switch {
	case unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fprog) != nil:
		err = errors.New("attaching the filter failed")
	case unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, o.Buffer) != nil &&
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, o.Buffer) != nil:
		err = fmt.Errorf("setting the receive buffer to %d bytes failed", o.Buffer)
	case unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv) != nil:
		err = errors.New("setting the receive timeout failed")
	case kernelAtLeast(6, 2) && unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1) != nil:
		err = errors.New("asking for the virtio_net_hdr (PACKET_VNET_HDR) failed")
	default:
		err = unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index})
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("livecap: %s: %w", iface, err)
	}
	return c, nil
}

// Stats returns the kernel's counters since the capture opened.
func (c *Capture) Stats() (Stats, error) {
	// PACKET_STATISTICS returns the counts since the last read and
	// clears them, so the capture keeps the sum.
	s, err := unix.GetsockoptTpacketStats(c.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
	if err != nil {
		return c.stats, fmt.Errorf("livecap: PACKET_STATISTICS: %w", err)
	}
	c.stats.Frames += uint64(s.Packets)
	c.stats.Dropped += uint64(s.Drops)
	return c.stats, nil
}

// LinkType is the link type of the frames Next returns.
func (c *Capture) LinkType() layers.LinkType { return layers.LinkTypeEthernet }

// KnowsGSO reports whether Next reports the segment size of GSO
// datagrams (kernel 6.2 or later).
func (c *Capture) KnowsGSO() bool { return c.vnet }

// Next returns the next frame. On the loopback interface each packet
// passes twice (sent, then received); only the received copy is returned.
func (c *Capture) Next() (Frame, error) {
	deadline := time.Now().Add(c.timeout)
	for {
		n, from, err := unix.Recvfrom(c.fd, c.buf, 0)
		now := time.Now()
		switch {
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			if now.After(deadline) {
				return Frame{Time: now}, ErrTimeout
			}
			continue
		case errors.Is(err, unix.EINVAL) && c.vnet:
			// A GSO frame the kernel cannot put in a virtio_net_hdr
			// (another GSO type): it dropped it; go on with the next.
			continue
		case err != nil:
			return Frame{Time: now}, err
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && c.loopback && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		f := Frame{Data: c.buf[:n], Time: now}
		if c.vnet {
			if n < vnetHdrLen {
				continue
			}
			// virtio_net_hdr: flags, gso_type, hdr_len, gso_size, ... in
			// the host's byte order (little-endian virtio).
			if c.buf[1]&^0x80 == gsoUDPL4 {
				f.GSOSize = int(binary.LittleEndian.Uint16(c.buf[4:6]))
			}
			f.Data = c.buf[vnetHdrLen:n]
		}
		return f, nil
	}
}

// kernelAtLeast reports whether the running kernel's release is at least
// major.minor.
func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// Close stops the capture.
func (c *Capture) Close() error { return unix.Close(c.fd) }

// noInterface is the error for an interface name that does not exist,
// listing the ones that do.
func noInterface(name string) error {
	var names []string
	if ifs, err := net.Interfaces(); err == nil {
		for _, i := range ifs {
			names = append(names, i.Name)
		}
	}
	return fmt.Errorf("livecap: no such interface %q (interfaces: %s)", name, strings.Join(names, ", "))
}

// htons converts a 16-bit value to network byte order.
func htons(v uint16) uint16 { return v<<8 | v>>8 }
