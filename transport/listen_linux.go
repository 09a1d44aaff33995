package transport

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/net/bpf"
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
	local, scope, opts, err := resolve(local, opts)
	if err != nil {
		return nil, err
	}
	c, err := listenUDP(local, scope, opts, sockAlone)
	if err != nil {
		return nil, err
	}
	return withSourcePorts(c, scope, opts, 0, 1)
}

// MaxGroup is the most Conns ListenGroup opens on one address.
const MaxGroup = 64

// ListenGroup opens n Conns on local (as Listen does) that share its port
// in one SO_REUSEPORT group: each sends on its own socket, and the
// kernel hands each received datagram to Conn number GroupMember(destQPN,
// n), by a classic-BPF program (SO_ATTACH_REUSEPORT_CBPF) that reads the
// BTH's destination QP. A device that gives QP number q to the shard
// GroupMember(q, n) so receives every QP's packets on that QP's shard,
// with no hand-off.
//
// What the program cannot steer lands elsewhere and must be handed on by
// the caller: a GRO batch is steered by its first packet, so packets of
// another QP that the kernel coalesced with it (same addresses and
// ports) come along. The port is taken as Listen takes it: the group is
// formed only when no other socket holds the address and port
// (EADDRINUSE otherwise), so another process cannot be in the group.
// RecvRaw cannot be steered (its raw socket sees every packet) and is
// refused for n > 1 (ErrRawGroup).
func ListenGroup(local netip.AddrPort, opts Options, n int) ([]Conn, error) {
	if n < 1 || n > MaxGroup {
		return nil, fmt.Errorf("transport: group of %d Conns (1..%d)", n, MaxGroup)
	}
	if n == 1 {
		c, err := Listen(local, opts)
		if err != nil {
			return nil, err
		}
		return []Conn{c}, nil
	}
	if opts.Mode == RecvRaw {
		return nil, ErrRawGroup
	}
	local, scope, opts, err := resolve(local, opts)
	if err != nil {
		return nil, err
	}
	if err := checkFree(local, scope); err != nil {
		return nil, err
	}
	conns := make([]Conn, 0, n)
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	var c0 *udpConn
	for i := range n {
		c, err := listenUDP(local, scope, opts, sockGroup)
		if err != nil {
			closeAll()
			return nil, err
		}
		if i == 0 {
			c0 = c
		}
		pc, err := withSourcePorts(c, scope, opts, i, n)
		if err != nil {
			c.Close()
			closeAll()
			return nil, err
		}
		conns = append(conns, pc)
	}
	var ferr error
	if err := c0.rc.Control(func(fd uintptr) {
		ferr = attachFilterOpt(int(fd), unix.SO_ATTACH_REUSEPORT_CBPF, steerProgram(n))
	}); err != nil {
		ferr = err
	}
	if ferr != nil {
		closeAll()
		return nil, fmt.Errorf("transport: listen %v: %w", local, os.NewSyscallError("setsockopt SO_ATTACH_REUSEPORT_CBPF", ferr))
	}
	return conns, nil
}

// checkFree binds a socket without SO_REUSEPORT on local and closes it:
// it binds only where nobody is, so an address in use fails here as
// Listen fails, and a group already there (another device's) refuses to
// be joined.
//
// It holds syscall.ForkLock for reading from the socket's creation to
// its close, which keeps out every fork of this process (syscall.forkExec
// holds it for writing while it clones): a child forked meanwhile (an
// os/exec in another goroutine) gets a copy of the socket that keeps the
// port bound until the child's exec closes it, and the group's first
// bind, right after, fails with EADDRINUSE though nobody holds the
// address.
func checkFree(local netip.AddrPort, scope uint32) error {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	fd, err := openUDP(local, scope, &Options{NoGSO: true, NoGRO: true}, sockAlone)
	if err != nil {
		return err
	}
	if testHookFreeChecked != nil {
		testHookFreeChecked(fd)
	}
	unix.Close(fd)
	return nil
}

// testHookFreeChecked, when set (by a test), is called with checkFree's
// socket while it is bound, where a fork would copy it.
var testHookFreeChecked func(fd int)

// steerProgram picks the socket of a reuseport group of n: the kernel
// runs it with the packet's data starting at the UDP payload, the BTH,
// whose bytes 5-7 are the destination QP. A datagram too short to load
// from ends the program with 0 (socket 0).
func steerProgram(n int) []bpf.Instruction {
	return []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // reserved byte and destination QP
		bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xffffff},
		bpf.ALUOpConstant{Op: bpf.ALUOpShiftRight, Val: QPNBlockShift}, // GroupMember
		bpf.ALUOpConstant{Op: bpf.ALUOpMod, Val: uint32(n)},
		bpf.RetA{},
	}
}

// resolve checks local and fills in the defaults: port 0 is Port, and a
// zone names the scope of a link-local IPv6 address.
func resolve(local netip.AddrPort, opts Options) (netip.AddrPort, uint32, Options, error) {
	a := local.Addr().Unmap()
	if !a.IsValid() || a.IsUnspecified() || a.IsMulticast() {
		return local, 0, opts, fmt.Errorf("%w: %v", ErrAddress, local)
	}
	if local.Port() == 0 {
		local = netip.AddrPortFrom(a, Port)
	} else {
		local = netip.AddrPortFrom(a, local.Port())
	}
	if opts.Mode > RecvRaw {
		return local, 0, opts, fmt.Errorf("transport: unknown receive mode %v", opts.Mode)
	}
	if opts.Mode == RecvRaw && a.Is6() {
		return local, 0, opts, ErrRawIPv6
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
			return local, 0, opts, fmt.Errorf("transport: listen %v: unknown zone %q", local, z)
		}
	}
	return local, scope, opts, nil
}

// sockRole is what a socket of listenUDP is for.
type sockRole uint8

const (
	sockAlone sockRole = iota // the address's one socket
	sockGroup                 // a member of the address's SO_REUSEPORT group
	sockSend                  // sends only, from a source port (see withSourcePorts)
	sockMcast                 // receives a multicast group (ListenMulticast)
)

// listenUDP opens a Conn on a resolved address in the given role.
func listenUDP(local netip.AddrPort, scope uint32, opts Options, role sockRole) (*udpConn, error) {
	fail := func(what string, err error) error {
		return fmt.Errorf("transport: listen %v: %w", local, os.NewSyscallError(what, err))
	}
	if role == sockSend {
		// Nothing is read from it: no raw socket, no GRO, a small buffer
		// and a filter that drops all (in openUDP).
		opts.Mode, opts.NoGRO, opts.SocketRecvBuffer = RecvSocket, true, 4096
	}
	fd, err := openUDP(local, scope, &opts, role)
	if err != nil {
		return nil, err
	}
	gso, gro := offloads(fd, local.Addr().Is6(), &opts)
	c := &udpConn{ep: newEndpoint(local), scope: scope, mode: opts.Mode, tos: opts.TOS, gro: gro}
	if opts.Mode == RecvSocket && role != sockSend {
		c.csum = openCsumCounter(local.Addr().Is6()) // now, in the socket's namespace
	}
	c.gso.Store(gso)
	c.file = os.NewFile(uintptr(fd), "udp "+local.String())
	if c.rc, err = c.file.SyscallConn(); err != nil {
		c.file.Close()
		return nil, fail("syscallconn", err)
	}
	rfd := -1
	if opts.Mode == RecvRaw {
		rfd, err = openRaw(local, &opts)
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
	c.s.sockTOS = opts.TOS // openUDP set it
	if c.wp, err = newArmedPoll(fd, unix.EPOLLOUT, 1, "send wait "+local.String(), nil); err != nil {
		c.closeFiles()
		return nil, fmt.Errorf("transport: listen %v: %w", local, err)
	}
	c.s.wait = c.wp.waiter(c.s.fn, nil)
	if role != sockSend {
		readFD := fd
		if c.raw != nil {
			readFD = rfd
		}
		if c.rp, err = newArmedPoll(readFD, unix.EPOLLIN, 2, "recv wait "+local.String(), c.ctr.traffic); err != nil {
			c.closeFiles()
			return nil, fmt.Errorf("transport: listen %v: %w", local, err)
		}
		c.r.init(opts.BatchSize, slot)
		c.r.wait, c.r.readyWait = c.rp.waiter(c.r.fn, c.r.fnWaits), c.rp.waiter(c.r.ready, c.r.readyWaits)
		receivers.add(c)
	}
	return c, nil
}

// openUDP creates, configures and binds the UDP socket and reports which
// offloads are on.
func openUDP(local netip.AddrPort, scope uint32, opts *Options, role sockRole) (fd int, err error) {
	v6 := local.Addr().Is6()
	fam := unix.AF_INET
	if v6 {
		fam = unix.AF_INET6
	}
	fd, err = unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return -1, fmt.Errorf("transport: listen %v: %w", local, os.NewSyscallError("socket", err))
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
	if role == sockGroup {
		set = append(set, opt{unix.SOL_SOCKET, unix.SO_REUSEPORT, 1, "SO_REUSEPORT"})
	}
	if role == sockMcast {
		set = append(set, opt{unix.SOL_SOCKET, unix.SO_REUSEADDR, 1, "SO_REUSEADDR"})
	}
	for _, o := range set {
		if err = unix.SetsockoptInt(fd, o.level, o.name, o.val); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("transport: listen %v: %w", local, os.NewSyscallError("setsockopt "+o.what, err))
		}
	}
	recvFragSize(fd, v6)
	setBuffer(fd, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, opts.SocketRecvBuffer)
	setBuffer(fd, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, opts.SocketSendBuffer)
	// The raw socket reads, or (a source-port socket) nothing does: this
	// one only holds the port (so the kernel sends no ICMP port
	// unreachable) and must not fill up. In socket mode a filter that
	// keeps everything makes the kernel check the UDP checksum as a
	// datagram is queued rather than as it is read: a bad one is then
	// counted in the socket's drops (SO_RXQ_OVFL) in time for the
	// datagrams after it to report it (see csum_linux.go).
	filter := acceptAll
	if opts.Mode == RecvRaw || role == sockSend {
		filter = dropAll
	}
	if err = attachFilter(fd, filter); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("transport: listen %v: %w", local, os.NewSyscallError("setsockopt SO_ATTACH_FILTER", err))
	}

	var sa unix.Sockaddr
	if v6 {
		sa = &unix.SockaddrInet6{Addr: local.Addr().As16(), Port: int(local.Port()), ZoneId: scope}
	} else {
		sa = &unix.SockaddrInet4{Addr: local.Addr().As4(), Port: int(local.Port())}
	}
	if err = unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("transport: listen %v: %w", local, os.NewSyscallError("bind", err))
	}
	return fd, nil
}

// offloads turns on the offloads opts allows where the kernel has them
// and reports which are on.
func offloads(fd int, v6 bool, opts *Options) (gso, gro bool) {
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
	return gso, gro
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

// ListenMulticast opens a receive-only Conn for the multicast group
// (port 0 means Port), joined on the interface that holds iface (a local
// address of the group's family): the socket binds the group's address
// with SO_REUSEADDR, so every device and process on the host that joins
// gets its own copy of each datagram, as every rxe device on a joined
// netdev does. The ICRC of what it receives is checked against the group
// as destination address. Sending through it is not meant: a device sends
// to a group from its own address.
func ListenMulticast(group netip.AddrPort, iface netip.Addr, opts Options) (Conn, error) {
	g := group.Addr().Unmap()
	if !g.IsMulticast() {
		return nil, fmt.Errorf("%w: %v is not a multicast group", ErrAddress, g)
	}
	if g.Is4() != iface.Unmap().Is4() {
		return nil, fmt.Errorf("%w: group %v joined on %v, another address family", ErrAddress, g, iface)
	}
	// No GRO: the kernel's multicast delivery hands a coalesced batch on
	// without its segment size, so the datagrams after the first would be
	// lost (seen with rxe 6.12's back-to-back sends).
	opts.Mode, opts.NoGRO = RecvSocket, true
	ifa, scope, opts, err := resolve(netip.AddrPortFrom(iface, group.Port()), opts)
	if err != nil {
		return nil, err
	}
	ifindex, err := interfaceIndex(ifa.Addr())
	if err != nil {
		return nil, err
	}
	local := netip.AddrPortFrom(g, ifa.Port())
	c, err := listenUDP(local, scope, opts, sockMcast)
	if err != nil {
		return nil, err
	}
	var jerr error
	cerr := c.rc.Control(func(fd uintptr) {
		if g.Is4() {
			jerr = unix.SetsockoptIPMreqn(int(fd), unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP,
				&unix.IPMreqn{Multiaddr: g.As4(), Address: ifa.Addr().As4(), Ifindex: int32(ifindex)})
			if jerr == nil {
				// Only this group's datagrams, not every group some socket
				// on the host joined.
				jerr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MULTICAST_ALL, 0)
			}
			return
		}
		jerr = unix.SetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IPV6, unix.IPV6_JOIN_GROUP,
			&unix.IPv6Mreq{Multiaddr: g.As16(), Interface: uint32(ifindex)})
		if jerr == nil {
			jerr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_ALL, 0)
		}
	})
	if err := errors.Join(cerr, jerr); err != nil {
		c.Close()
		return nil, fmt.Errorf("transport: join %v on %v: %w", g, iface, os.NewSyscallError("setsockopt", err))
	}
	return c, nil
}

// interfaceIndex returns the index of the interface holding address a.
// A loopback address not assigned anywhere (127.0.50.1) belongs to the
// loopback interface, as the kernel routes it there (see InterfaceMTU).
func interfaceIndex(a netip.Addr) (int, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return 0, err
	}
	loop := 0
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 && loop == 0 {
			loop = ifc.Index
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, ad := range addrs {
			if p, err := netip.ParsePrefix(ad.String()); err == nil && p.Addr().Unmap() == a.WithZone("") {
				return ifc.Index, nil
			}
		}
	}
	if a.Unmap().IsLoopback() && loop > 0 {
		return loop, nil
	}
	return 0, fmt.Errorf("transport: no interface holds %v", a)
}
