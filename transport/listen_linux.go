package transport

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

const (
	defaultBatch      = 64
	defaultSockBuffer = 4 << 20
	groSlot           = 65535 // a GRO batch is at most one 64 KiB datagram
	plainSlot         = 9216  // a jumbo frame's payload
	rawSlot           = 65535 // raw mode reads whole IP datagrams, GSO batches of local senders included
)

// Listen opens a Conn on local, which must be a specific unicast address
// (the ICRC covers the source address, so it must be known); port 0 means
// Port. It fails with a wrapped syscall error when the port is in use
// (errors.Is(err, syscall.EADDRINUSE)) or, for RecvRaw, when the process
// lacks CAP_NET_RAW (syscall.EPERM).
func Listen(local netip.AddrPort, opts Options) (Conn, error) {
	return listenUDP(local, opts)
}

func listenUDP(local netip.AddrPort, opts Options) (*udpConn, error) {
	a := local.Addr().Unmap()
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() {
		return nil, fmt.Errorf("%w: %v", ErrAddress, local)
	}
	if local.Port() == 0 {
		local = netip.AddrPortFrom(a, Port)
	} else {
		local = netip.AddrPortFrom(a, local.Port())
	}
	if opts.Mode > RecvRaw {
		return nil, fmt.Errorf("transport: unknown receive mode %v", opts.Mode)
	}
	if opts.Mode == RecvRaw && a.Is6() {
		return nil, ErrRawIPv6
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = defaultBatch
	}
	if opts.SocketRecvBuffer <= 0 {
		opts.SocketRecvBuffer = defaultSockBuffer
	}
	if opts.SocketSendBuffer <= 0 {
		opts.SocketSendBuffer = defaultSockBuffer
	}
	var scope uint32
	if z := a.Zone(); z != "" {
		if ifi, err := net.InterfaceByName(z); err == nil {
			scope = uint32(ifi.Index)
		} else if n, err := strconv.ParseUint(z, 10, 32); err == nil {
			scope = uint32(n)
		} else {
			return nil, fmt.Errorf("transport: listen %v: unknown zone %q", local, z)
		}
	}
	fail := func(what string, err error) error {
		return fmt.Errorf("transport: listen %v: %w", local, os.NewSyscallError(what, err))
	}

	fd, gso, gro, err := openUDP(local, scope, &opts)
	if err != nil {
		return nil, err
	}
	c := &udpConn{ep: newEndpoint(local), scope: scope, mode: opts.Mode, tos: opts.TOS, gro: gro}
	if opts.Mode == RecvSocket {
		c.csum = openCsumCounter(local.Addr().Is6()) // now, in the socket's namespace
	}
	c.gso.Store(gso)
	c.file = os.NewFile(uintptr(fd), "udp "+local.String())
	if c.rc, err = c.file.SyscallConn(); err != nil {
		c.file.Close()
		return nil, fail("syscallconn", err)
	}
	if opts.Mode == RecvRaw {
		rfd, err := openRaw(local, &opts)
		if err != nil {
			c.file.Close()
			return nil, err
		}
		c.raw = os.NewFile(uintptr(rfd), "raw "+local.String())
		if c.rrc, err = c.raw.SyscallConn(); err != nil {
			c.file.Close()
			c.raw.Close()
			return nil, fail("syscallconn", err)
		}
	}
	slot := opts.RecvBufSize
	switch {
	case slot > 0:
	case opts.Mode == RecvRaw:
		slot = rawSlot
	case gro:
		slot = groSlot
	default:
		slot = plainSlot
	}
	if opts.Mode == RecvRaw {
		slot += 60 + 8 // room for the IP header (with options) and UDP header
	}
	c.s.init(max(opts.BatchSize, MaxSegments))
	c.r.init(opts.BatchSize, slot)
	return c, nil
}

// openUDP creates, configures and binds the UDP socket and reports which
// offloads are on.
func openUDP(local netip.AddrPort, scope uint32, opts *Options) (fd int, gso, gro bool, err error) {
	v6 := local.Addr().Is6()
	fam := unix.AF_INET
	if v6 {
		fam = unix.AF_INET6
	}
	fd, err = unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return -1, false, false, fmt.Errorf("transport: listen %v: %w", local, os.NewSyscallError("socket", err))
	}
	type opt struct {
		level, name, val int
		what             string
	}
	var set []opt
	if v6 {
		set = []opt{
			{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1, "IPV6_V6ONLY"},
			{unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO, "IPV6_MTU_DISCOVER"},
			{unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1, "IPV6_RECVTCLASS"},
			{unix.IPPROTO_IPV6, unix.IPV6_TCLASS, int(opts.TOS), "IPV6_TCLASS"},
			// rxe sends UDP checksum 0, which IPv6 rejects unless told not to.
			{unix.SOL_UDP, unix.UDP_NO_CHECK6_RX, 1, "UDP_NO_CHECK6_RX"},
		}
	} else {
		set = []opt{
			// rxe sends DF; with DF an unconnected socket's packets carry IP ID 0.
			{unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO, "IP_MTU_DISCOVER"},
			{unix.IPPROTO_IP, unix.IP_RECVTOS, 1, "IP_RECVTOS"},
			{unix.IPPROTO_IP, unix.IP_TOS, int(opts.TOS), "IP_TOS"},
		}
	}
	set = append(set, opt{unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1, "SO_RXQ_OVFL"})
	for _, o := range set {
		if err = unix.SetsockoptInt(fd, o.level, o.name, o.val); err != nil {
			unix.Close(fd)
			return -1, false, false, fmt.Errorf("transport: listen %v: %w", local, os.NewSyscallError("setsockopt "+o.what, err))
		}
	}
	recvFragSize(fd, v6)
	setBuffer(fd, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, opts.SocketRecvBuffer)
	setBuffer(fd, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, opts.SocketSendBuffer)

	// GSO is there when the kernel knows UDP_SEGMENT (4.18+).
	if !opts.NoGSO {
		_, e := unix.GetsockoptInt(fd, unix.SOL_UDP, unix.UDP_SEGMENT)
		gso = e == nil
	}
	if !gso {
		noChecksum(fd, v6)
	}
	if !opts.NoGRO && opts.Mode == RecvSocket {
		gro = unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1) == nil
	}
	// The raw socket reads; this one only holds the port (so the kernel
	// sends no ICMP port unreachable) and must not fill up. In socket mode
	// a filter that keeps everything makes the kernel check the UDP
	// checksum as a datagram is queued rather than as it is read: a bad
	// one is then counted in the socket's drops (SO_RXQ_OVFL) in time for
	// the datagrams after it to report it (see csum_linux.go).
	filter := acceptAll
	if opts.Mode == RecvRaw {
		filter = dropAll
	}
	if err = attachFilter(fd, filter); err != nil {
		unix.Close(fd)
		return -1, false, false, fmt.Errorf("transport: listen %v: %w", local, os.NewSyscallError("setsockopt SO_ATTACH_FILTER", err))
	}

	var sa unix.Sockaddr
	if v6 {
		sa = &unix.SockaddrInet6{Addr: local.Addr().As16(), Port: int(local.Port()), ZoneId: scope}
	} else {
		sa = &unix.SockaddrInet4{Addr: local.Addr().As4(), Port: int(local.Port())}
	}
	if err = unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, false, false, fmt.Errorf("transport: listen %v: %w", local, os.NewSyscallError("bind", err))
	}
	return fd, gso, gro, nil
}

// recvFragSize asks for IP(V6)_RECVFRAGSIZE control messages, which mark
// a datagram the kernel reassembled from fragments (DropFragment). Linux
// 4.14 and later; without it such datagrams are checked like any other.
func recvFragSize(fd int, v6 bool) {
	if v6 {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVFRAGSIZE, 1)
	} else {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVFRAGSIZE, 1)
	}
}

// noChecksum makes IPv4 sends carry UDP checksum 0, as rxe's do, saving
// the checksum where no NIC offload computes it. The kernel refuses GSO on
// such a socket (EINVAL), so it is only set while GSO is off. IPv6 keeps
// its checksums: a zero IPv6 UDP checksum is only allowed for tunnels
// (RFC 6935), and rxe accepts both.
func noChecksum(fd int, v6 bool) {
	if !v6 {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_NO_CHECK, 1)
	}
}

// setBuffer sets a socket buffer size, forcing past the sysctl limit when
// privileged. Failure is not fatal: the kernel default still works.
func setBuffer(fd, force, plain, size int) {
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, force, size) == nil {
		return
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, plain, size)
}

// mapClosed turns the errors of a closed file into net.ErrClosed.
func (c *udpConn) mapClosed(err error) error {
	if c.closed.Load() || errors.Is(err, os.ErrClosed) {
		return net.ErrClosed
	}
	return err
}
