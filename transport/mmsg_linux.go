package transport

import (
	"encoding/binary"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mmsghdr is struct mmsghdr of sendmmsg(2)/recvmmsg(2), which x/sys/unix
// does not define. Go pads it like C on every architecture.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// sockaddr is storage for a struct sockaddr_in or sockaddr_in6.
type sockaddr = unix.RawSockaddrInet6

// putSockaddr writes ap into sa and returns the length to pass the kernel.
// scope is the IPv6 scope ID to use for link-local peers.
func putSockaddr(sa *sockaddr, ap netip.AddrPort, scope uint32) uint32 {
	if ap.Addr().Is4() {
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		s4.Family = unix.AF_INET
		putPort(&s4.Port, ap.Port())
		s4.Addr = ap.Addr().As4()
		return unix.SizeofSockaddrInet4
	}
	sa.Family = unix.AF_INET6
	putPort(&sa.Port, ap.Port())
	sa.Flowinfo = 0
	sa.Addr = ap.Addr().As16()
	sa.Scope_id = 0
	if ap.Addr().IsLinkLocalUnicast() {
		sa.Scope_id = scope
	}
	return unix.SizeofSockaddrInet6
}

// getSockaddr reads the address the kernel wrote into sa.
func getSockaddr(sa *sockaddr) netip.AddrPort {
	switch sa.Family {
	case unix.AF_INET:
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), getPort(&s4.Port))
	case unix.AF_INET6:
		// The zone is left out: it would allocate, and the ICRC does not cover it.
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), getPort(&sa.Port))
	}
	return netip.AddrPort{}
}

// Ports are stored in network byte order in the uint16 field.
func putPort(p *uint16, port uint16) {
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(p))[:], port)
}

func getPort(p *uint16) uint16 { return binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(p))[:]) }

// putCmsg writes a control message carrying the size-byte native-endian
// integer v at the start of b and returns the space it took.
func putCmsg(b []byte, level, typ int32, v uint32, size int) int {
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level = level
	h.Type = typ
	h.SetLen(unix.CmsgLen(size))
	d := b[unix.CmsgLen(0):]
	switch size {
	case 1:
		d[0] = byte(v)
	case 2:
		binary.NativeEndian.PutUint16(d, uint16(v))
	default:
		binary.NativeEndian.PutUint32(d, v)
	}
	return unix.CmsgSpace(size)
}

// cmsgInt reads the integer a control message carries: one byte (IP_TOS
// on receive), or a native-endian 16- or 32-bit int.
func cmsgInt(d []byte) uint32 {
	switch {
	case len(d) >= 4:
		return binary.NativeEndian.Uint32(d)
	case len(d) >= 2:
		return uint32(binary.NativeEndian.Uint16(d))
	case len(d) == 1:
		return uint32(d[0])
	}
	return 0
}

// recvInfo is what the control messages of one received datagram say.
type recvInfo struct {
	tos      uint8
	gso      int    // UDP_GRO segment size, 0 if not coalesced
	drops    uint32 // SO_RXQ_OVFL: the socket's cumulative drop count
	hasDrops bool
	frag     bool // IP(V6)_RECVFRAGSIZE: the datagram was reassembled from fragments
}

func parseCmsgs(b []byte) (ri recvInfo) {
	for i := 0; len(b) >= unix.SizeofCmsghdr && i < 16; i++ {
		h, d, rest, err := unix.ParseOneSocketControlMessage(b)
		if err != nil {
			return ri
		}
		b = rest
		switch {
		case h.Level == unix.IPPROTO_IP && (h.Type == unix.IP_TOS || h.Type == unix.IP_RECVTOS):
			ri.tos = uint8(cmsgInt(d))
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_TCLASS:
			ri.tos = uint8(cmsgInt(d))
		case h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO:
			ri.gso = int(cmsgInt(d))
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SO_RXQ_OVFL:
			ri.drops, ri.hasDrops = cmsgInt(d), true
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_RECVFRAGSIZE,
			h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_RECVFRAGSIZE:
			ri.frag = cmsgInt(d) > 0
		}
	}
	return ri
}

// mmsgSyscall runs sendmmsg or recvmmsg once, with MSG_DONTWAIT (the
// sockets are blocking descriptors, kept out of the runtime's poller: see
// armedPoll). It is a raw system call (no entersyscall/exitsyscall):
// with MSG_DONTWAIT neither call waits, and a large GSO send (tens to hundreds of
// microseconds of kernel work, loopback delivery included) would otherwise
// cost a P hand-off by sysmon and a thread switch when it returns; as
// gVisor's rawfile does for its non-blocking sends. A signal still
// interrupts it (EINTR, retried by the callers).
func mmsgSyscall(trap, fd uintptr, hdrs []mmsghdr) (int, unix.Errno) {
	n, _, e := unix.RawSyscall6(trap, fd, uintptr(unsafe.Pointer(&hdrs[0])), uintptr(len(hdrs)), unix.MSG_DONTWAIT, 0, 0)
	return int(n), e
}

// pollNow runs ppoll(2) on fds with a zero timeout, as a raw system call
// for the same reason as mmsgSyscall, and returns how many are ready (-1
// on an error). fds must not be empty.
func pollNow(fds []unix.PollFd) int {
	var zero unix.Timespec
	n, _, e := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(len(fds)),
		uintptr(unsafe.Pointer(&zero)), 0, 0, 0)
	if e != 0 {
		return -1
	}
	return int(n)
}
