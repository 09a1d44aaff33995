package transport

import (
	"net/netip"
	"testing"
	"unsafe"

	"github.com/rxego/rxego/internal/testenv/pingpong"
	"golang.org/x/sys/unix"
)

// BenchmarkRoundTrip splits a busy-polled 64-byte round trip on loopback
// into what each layer below the engine adds (docs/performance.md,
// "Round trips by layer"):
//
//   - udp: two connected UDP sockets, write and a non-blocking recvfrom,
//     as raw system calls (the harness's UDP yardstick makes the same
//     calls through the runtime's system call entry, on a socket its
//     poller watches);
//   - sockets: the Conns' own sockets (unconnected, with their options,
//     filter and epoll registrations), driven with the same raw calls
//     but sendto an address: what RoCE's socket costs the kernel;
//   - conn: Conn.Send and Poller.TryRecv: the ICRC both ways, the
//     batch's headers and control messages, the runtime poller's wrapper;
//   - quiet: conn with both Conns quieted (Quieter), as a busy-polling
//     device's are while its application polls: the sockets out of the
//     kernel's wait queues.
//
// Each side spins on a locked OS thread (pingpong.Run, which reports the
// median round trip and the median send call). Compare the rows within
// one run: their differences are the layers' costs; bench's
// BenchmarkRoundTrip adds the engine and the verbs on top.
func BenchmarkRoundTrip(b *testing.B) {
	b.Run("udp", func(b *testing.B) {
		a, r := plainSocket(b, "127.0.0.1"), plainSocket(b, "127.0.0.2")
		for _, c := range [][2]int{{a, r}, {r, a}} {
			sa, err := unix.Getsockname(c[1])
			if err != nil {
				b.Fatal(err)
			}
			if err := unix.Connect(c[0], sa); err != nil {
				b.Fatal(err)
			}
		}
		rawRoundTrips(b, a, r, nil, nil)
	})
	b.Run("sockets", func(b *testing.B) {
		a, r := listenAny(b, "127.0.0.1", Options{}), listenAny(b, "127.0.0.2", Options{})
		ra, rr := rawSockaddr(a.LocalAddr()), rawSockaddr(r.LocalAddr())
		rawRoundTrips(b, connFD(b, a), connFD(b, r), &rr, &ra)
	})
	for _, quiet := range []bool{false, true} {
		name := "conn"
		if quiet {
			name = "quiet"
		}
		b.Run(name, func(b *testing.B) { connRoundTrips(b, quiet) })
	}
}

// connRoundTrips ping-pongs a 64-byte packet between two Conns with
// Send and TryRecv, quieted first if quiet is set.
func connRoundTrips(b *testing.B, quiet bool) {
	a, r := listenAny(b, "127.0.0.1", Options{}), listenAny(b, "127.0.0.2", Options{})
	if quiet {
		a.(Quieter).Quiet()
		r.(Quieter).Quiet()
	}
	in, echoIn := make([]Message, 64), make([]Message, 64)
	out := []Message{{Buf: rocePacket(64, 1), Peer: r.LocalAddr()}}
	back := []Message{{Buf: rocePacket(64, 2), Peer: a.LocalAddr()}}
	send := func() error { _, err := a.Send(out); return err }
	recv := func() (bool, error) { n, err := a.(Poller).TryRecv(in); return n > 0, err }
	echo := func() error {
		n, err := r.(Poller).TryRecv(echoIn)
		if n > 0 && err == nil {
			_, err = r.Send(back)
		}
		return err
	}
	pingpong.Run(b, send, recv, echo)
}

// plainSocket is a non-blocking UDP socket bound to addr, closed with b.
func plainSocket(b *testing.B, addr string) int {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: netip.MustParseAddr(addr).As4()}); err != nil {
		b.Fatal(err)
	}
	return fd
}

// connFD is the receiving socket of a Conn of Listen.
func connFD(b *testing.B, c Conn) (fd int) {
	if err := c.(*udpConn).rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		b.Fatal(err)
	}
	return fd
}

func rawSockaddr(ap netip.AddrPort) unix.RawSockaddrInet4 {
	sa := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ap.Addr().As4()}
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	p[0], p[1] = byte(ap.Port()>>8), byte(ap.Port())
	return sa
}

// rawRoundTrips ping-pongs a 64-byte packet between sockets a and r with
// raw system calls: write on a connected socket where to is nil, sendto
// to otherwise; a non-blocking recvfrom on both.
func rawRoundTrips(b *testing.B, a, r int, toR, toA *unix.RawSockaddrInet4) {
	pkt := rocePacket(64, 1)
	send := func(fd int, p []byte, to *unix.RawSockaddrInet4) error {
		var e unix.Errno
		if to == nil {
			_, _, e = unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		} else {
			_, _, e = unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)),
				0, uintptr(unsafe.Pointer(to)), unix.SizeofSockaddrInet4)
		}
		if e != 0 {
			return e
		}
		return nil
	}
	recv := func(fd int, p []byte) (int, error) {
		n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			return int(n), nil
		case unix.EAGAIN, unix.EINTR:
			return 0, nil
		}
		return 0, e
	}
	in, echoIn := make([]byte, 2048), make([]byte, 2048)
	pingpong.Run(b,
		func() error { return send(a, pkt, toR) },
		func() (bool, error) { n, err := recv(a, in); return n > 0, err },
		func() error {
			n, err := recv(r, echoIn)
			if n > 0 && err == nil {
				err = send(r, echoIn[:n], toA)
			}
			return err
		})
}

// BenchmarkEmptyPoll is what one look at an empty socket costs a busy
// poller, the interval at which it can notice a datagram: raw recvfrom
// and recvmmsg (one message, with room for control messages) on a Conn's
// socket, and TryRecv. bench's BenchmarkEmptyPoll adds the device and
// the CQ.
func BenchmarkEmptyPoll(b *testing.B) {
	c := listenAny(b, "127.0.0.1", Options{})
	fd := connFD(b, c)
	buf := make([]byte, 2048)
	b.Run("recvfrom", func(b *testing.B) {
		for range b.N {
			unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), unix.MSG_DONTWAIT, 0, 0)
		}
	})
	b.Run("recvmmsg", func(b *testing.B) {
		r := &c.(*udpConn).r
		for range b.N {
			mmsgSyscall(unix.SYS_RECVMMSG, uintptr(fd), r.hdrs[:1])
		}
	})
	b.Run("tryrecv", func(b *testing.B) {
		msgs := make([]Message, 64)
		for range b.N {
			if n, err := c.(Poller).TryRecv(msgs); n != 0 || err != nil {
				b.Fatalf("TryRecv = %d, %v on a socket nobody sends to", n, err)
			}
		}
	})
}
