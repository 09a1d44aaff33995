package harness

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rxego/rxego/icrc"
)

func init() {
	runners[UDPBW] = udpBW
	runners[UDPPing] = udpPing
}

// The raw UDP yardstick: what the kernel's UDP path carries between two
// processes in each I/O mode, with a CRC-32 computed over every datagram
// (or GSO segment) on send and checked on receive, as rxego's ICRC is.

// udpBatch is datagrams per sendmmsg/recvmmsg call (as rxego's transport).
const udpBatch = 64

// gsoMax is the most payload bytes in one GSO datagram over IPv4.
const gsoMax = 65535 - 20 - 8

type udpHello struct{ Addr netip.AddrPort }

// udpSock is a UDP socket on 127.0.0.1 with 4 MiB buffers.
type udpSock struct {
	conn *net.UDPConn
	rc   syscall.RawConn
	fd   int
}

func newUDPSock() (*udpSock, error) {
	conn, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		return nil, err
	}
	s := &udpSock{conn: conn}
	s.rc, _ = conn.SyscallConn()
	_ = s.rc.Control(func(fd uintptr) {
		s.fd = int(fd)
		for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], 4<<20) != nil {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], 4<<20)
			}
		}
	})
	return s, nil
}

func (s *udpSock) addr() netip.AddrPort { return s.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// mmsghdr is struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// mmsg runs sendmmsg or recvmmsg through the runtime poller, as raw
// system calls on the non-blocking socket, as rxego's transport does (no P
// hand-off around a long GSO send): the yardstick gets the same I/O
// technique as the stack it measures.
func (s *udpSock) mmsg(trap uintptr, hdrs []mmsghdr, write bool) (int, error) {
	var n int
	var errno unix.Errno
	fn := func(fd uintptr) bool {
		var r uintptr
		var e unix.Errno
		for range 64 { // a signal (the runtime's preemption) may interrupt it
			if r, _, e = unix.RawSyscall6(trap, fd, uintptr(unsafe.Pointer(&hdrs[0])), uintptr(len(hdrs)), 0, 0, 0); e != unix.EINTR {
				break
			}
		}
		if e == unix.EAGAIN {
			return false
		}
		n, errno = int(r), e
		return true
	}
	var err error
	if write {
		err = s.rc.Write(fn)
	} else {
		err = s.rc.Read(fn)
	}
	if err != nil {
		return 0, err
	}
	if errno != 0 {
		return n, errno
	}
	return n, nil
}

// putCRC stores the CRC-32 of a datagram's bytes but the last four in them.
// The yardsticks compute it with the kernel rxego's ICRC uses
// (icrc.ChecksumIEEE), so that a ratio to them weighs the stacks, not two
// CRC implementations (hash/crc32 folds at about half its rate where the
// CPU has 256-bit VPCLMULQDQ but no AVX-512).
func putCRC(b []byte) {
	binary.LittleEndian.PutUint32(b[len(b)-4:], icrc.ChecksumIEEE(b[:len(b)-4]))
}

// crcOK reports whether a datagram's last four bytes are the CRC-32 of
// the rest, as putCRC stored it.
func crcOK(b []byte) bool {
	return len(b) >= 4 && binary.LittleEndian.Uint32(b[len(b)-4:]) == icrc.ChecksumIEEE(b[:len(b)-4])
}

// udpBW: the client sends Size-byte datagrams (with GSO: runs of them) as
// fast as it can; the server counts what arrives intact in the measured
// interval.
func udpBW(p *peer) (Result, error) {
	if p.c.QPs > 1 {
		return udpBWN(p)
	}
	s, err := newUDPSock()
	if err != nil {
		return Result{}, err
	}
	defer s.conn.Close()
	if p.server {
		if err := p.ctl.send(udpHello{s.addr()}); err != nil {
			return Result{}, err
		}
		return udpReceive(p, s)
	}
	var h udpHello
	if err := p.ctl.recv(&h); err != nil {
		return Result{}, err
	}
	cpu, err := udpSend(p, s, h.Addr)
	return Result{CPU: cpu}, err
}

// udpSend sends until the receiver says stop and returns its CPU time over
// the receiver's measurement.
func udpSend(p *peer, s *udpSock, dst netip.AddrPort) (time.Duration, error) {
	stop := p.ctl.watch()
	if err := udpSendLoop(p.c, s, dst, stop.stop.Load); err != nil {
		return 0, err
	}
	<-stop.ended
	return stop.cpu(), nil
}

// udpSendLoop sends c.Size-byte datagrams (in c.Mode) to dst until
// stopped reports true.
func udpSendLoop(c Case, s *udpSock, dst netip.AddrPort, stopped func() bool) error {
	var sa unix.RawSockaddrInet4
	sa.Family = unix.AF_INET
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], dst.Port())
	sa.Addr = dst.Addr().As4()
	switch c.Mode {
	case UDPSingle:
		buf := make([]byte, c.Size)
		for !stopped() {
			putCRC(buf)
			if _, err := s.conn.WriteToUDPAddrPort(buf, dst); err != nil && !stopped() {
				return err
			}
		}
	case UDPMmsg, UDPGSO, UDPGSORuns:
		per, k := 1, udpBatch
		if c.gso() {
			per, k = gsoMax/c.Size, 8
		}
		dgram := per * c.Size
		bufs := make([]byte, k*dgram)
		hdrs := make([]mmsghdr, k)
		iovs := make([]unix.Iovec, k)
		var oob []byte
		if c.gso() {
			oob = make([]byte, unix.CmsgSpace(2))
			h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
			h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
			h.SetLen(unix.CmsgLen(2))
			binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], uint16(c.Size))
		}
		for i := range hdrs {
			iovs[i].Base = &bufs[i*dgram]
			iovs[i].SetLen(dgram)
			if c.Mode == UDPGSORuns {
				// A message of 16: one segment, then 15 (per is 15
				// for 4 KiB).
				iovs[i].SetLen(c.Size)
				if i%2 == 1 {
					iovs[i].SetLen(min(15, per) * c.Size)
				}
			}
			m := &hdrs[i].hdr
			m.Name = (*byte)(unsafe.Pointer(&sa))
			m.Namelen = unix.SizeofSockaddrInet4
			m.Iov = &iovs[i]
			m.SetIovlen(1)
			if oob != nil {
				m.Control = &oob[0]
				m.SetControllen(len(oob))
			}
		}
		for !stopped() {
			for i := range iovs {
				// What each datagram sends (gso-runs sends less than
				// its slot).
				d := bufs[i*dgram : i*dgram+int(iovs[i].Len)]
				for off := 0; off < len(d); off += c.Size {
					putCRC(d[off : off+c.Size])
				}
			}
			if _, err := s.mmsg(unix.SYS_SENDMMSG, hdrs, true); err != nil && !stopped() {
				if errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) {
					continue
				}
				return fmt.Errorf("sendmmsg: %w", err)
			}
		}
	default:
		return fmt.Errorf("unknown UDP mode %q", c.Mode)
	}
	return nil
}

func udpReceive(p *peer, s *udpSock) (Result, error) {
	c := p.c
	var res Result
	s.conn.SetReadDeadline(time.Now().Add(caseTimeout(c)))
	w := p.newWindow()
	count := func(b []byte) {
		if crcOK(b) && w.on {
			res.Msgs++
			res.Bytes += uint64(len(b))
		}
	}
	finish := func() (Result, error) {
		if err := p.ctl.send(signal{"stop"}); err != nil {
			return res, err
		}
		if res.Msgs == 0 {
			return res, errors.New("no datagram arrived")
		}
		return res, nil
	}
	switch c.Mode {
	case UDPSingle:
		buf := make([]byte, 65536)
		for {
			n, _, err := s.conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return res, err
			}
			count(buf[:n])
			if _, done := w.tick(time.Now()); done {
				res.Elapsed = w.elapsed(time.Now())
				res.CPU = p.cpu()
				return finish()
			}
		}
	case UDPMmsg, UDPGSO, UDPGSORuns:
		err := udpRecvLoop(c, s, count, func() bool {
			if _, done := w.tick(time.Now()); done {
				res.Elapsed = w.elapsed(time.Now())
				res.CPU = p.cpu()
				return true
			}
			return false
		})
		if err != nil {
			return res, err
		}
		return finish()
	}
	return res, fmt.Errorf("unknown UDP mode %q", c.Mode)
}

// udpRecvLoop receives in c.Mode (mmsg, or gso with GRO on), handing every
// datagram or GRO segment to count, until done, asked after each
// recvmmsg, reports true.
func udpRecvLoop(c Case, s *udpSock, count func([]byte), done func() bool) error {
	slot, k := c.Size, udpBatch
	if c.gso() {
		slot, k = 65536, 16
		var gerr error
		if err := s.rc.Control(func(fd uintptr) {
			gerr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_GRO, 1)
		}); err != nil {
			return err
		}
		if gerr != nil {
			return fmt.Errorf("no UDP GRO: %w", gerr)
		}
	}
	bufs := make([]byte, k*slot)
	hdrs := make([]mmsghdr, k)
	iovs := make([]unix.Iovec, k)
	ctrlSpace := unix.CmsgSpace(4)
	oob := make([]byte, k*ctrlSpace)
	for i := range hdrs {
		iovs[i].Base = &bufs[i*slot]
		iovs[i].SetLen(slot)
		hdrs[i].hdr.Iov = &iovs[i]
		hdrs[i].hdr.SetIovlen(1)
	}
	for {
		for i := range hdrs {
			hdrs[i].hdr.Control = &oob[i*ctrlSpace]
			hdrs[i].hdr.SetControllen(ctrlSpace)
		}
		n, err := s.mmsg(unix.SYS_RECVMMSG, hdrs, false)
		if err != nil {
			return fmt.Errorf("recvmmsg: %w", err)
		}
		for i := range n {
			b := bufs[i*slot : i*slot+int(hdrs[i].n)]
			seg := groSize(oob[i*ctrlSpace : i*ctrlSpace+int(hdrs[i].hdr.Controllen)])
			if seg <= 0 {
				seg = len(b)
			}
			for off := 0; off < len(b); off += seg {
				count(b[off:min(off+seg, len(b))])
			}
		}
		if done() {
			return nil
		}
	}
}

// groSize returns the UDP_GRO segment size in a datagram's control
// messages, or 0.
func groSize(b []byte) int {
	for len(b) >= unix.SizeofCmsghdr {
		h, d, rest, err := unix.ParseOneSocketControlMessage(b)
		if err != nil {
			return 0
		}
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && len(d) >= 2 {
			if len(d) >= 4 {
				return int(binary.NativeEndian.Uint32(d))
			}
			return int(binary.NativeEndian.Uint16(d))
		}
		b = rest
	}
	return 0
}

// udpPing: the client sends a 64-byte datagram and waits for the server
// to send it back; blocking waits go through the Go runtime's poller,
// busy-polling spins on non-blocking reads. Both sockets are connected,
// so each side makes exactly one read and one write system call per
// message.
func udpPing(p *peer) (Result, error) {
	c := p.c
	s, err := newUDPSock()
	if err != nil {
		return Result{}, err
	}
	defer s.conn.Close()
	if err := p.ctl.send(udpHello{s.addr()}); err != nil {
		return Result{}, err
	}
	var h udpHello
	if err := p.ctl.recv(&h); err != nil {
		return Result{}, err
	}
	var sa unix.RawSockaddrInet4
	sa.Family = unix.AF_INET
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], h.Addr.Port())
	sa.Addr = h.Addr.Addr().As4()
	if _, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(s.fd), uintptr(unsafe.Pointer(&sa)), unix.SizeofSockaddrInet4); e != 0 {
		return Result{}, fmt.Errorf("connect: %w", e)
	}
	buf := make([]byte, 64)
	read := func() error {
		if !c.Busy {
			_, err := s.conn.Read(buf)
			return err
		}
		for {
			_, err := unix.Read(s.fd, buf)
			if err != unix.EAGAIN {
				return err
			}
		}
	}
	write := func() error {
		if !c.Busy {
			_, err := s.conn.Write(buf)
			return err
		}
		_, err := unix.Write(s.fd, buf)
		return err
	}
	if p.server {
		stop := p.ctl.watch()
		for !stop.stop.Load() {
			if !c.Busy {
				s.conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
				if err := read(); err != nil {
					continue // a timeout: look at the stop flag
				}
			} else {
				_, err := unix.Read(s.fd, buf)
				if err == unix.EAGAIN {
					continue
				}
				if err != nil {
					return Result{}, err
				}
			}
			if err := write(); err != nil {
				return Result{}, err
			}
		}
		return Result{}, nil
	}
	s.conn.SetReadDeadline(time.Now().Add(caseTimeout(c)))
	res, err := p.roundTrips(func() error {
		if err := write(); err != nil {
			return err
		}
		if err := read(); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	return res, p.ctl.send(signal{"done"})
}
