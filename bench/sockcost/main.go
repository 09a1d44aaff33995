// Command sockcost measures what the socket calls of a 64-byte UDP
// round trip cost on loopback, apart from any stack: two threads pinned
// to CPUs 0 and 1 ping-pong a datagram, spinning on non-blocking
// receives, and the p50 and p99 round trip are printed. Flags add, one at
// a time, what rxego's transport does differently from a connected
// read/write pair (sendmmsg to an address, recvmmsg of up to 64 with
// control messages, its socket options, a TOS control message per send,
// 4 MiB buffers, its socket filter, an epoll registration; -sendmsg and
// -recvmsg swap the vector calls for one-message ones), so the
// share of a busy-poll round trip that is the socket API's can be told
// from rxego's own (bench/RESULTS.md, session 10; docs/performance.md,
// "Round trips by layer"). Linux, two CPUs or more; the 4 MiB buffers need root.
//
//	go run ./bench/sockcost                       # connected write/read
//	go run ./bench/sockcost -sendmmsg -recvmmsg -opts -tos -bigbuf -filter -epoll
package main

import (
	"flag"
	"fmt"
	"log"
	"runtime"
	"sort"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var (
	mmsgSend = flag.Bool("sendmmsg", false, "send with sendmmsg+addr (unconnected)")
	mmsgRecv = flag.Bool("recvmmsg", false, "recv with recvmmsg vlen 64 + cmsg")
	oneSend  = flag.Bool("sendmsg", false, "with -sendmmsg: send the same message with sendmsg instead (one message, no vector)")
	oneRecv  = flag.Bool("recvmsg", false, "with -recvmmsg: receive with recvmsg into the first slot instead (one message, no vector)")
	opts     = flag.Bool("opts", false, "rxego socket options (RECVTOS, RXQ_OVFL, GRO, FRAGSIZE, PMTUDISC_DO)")
	tos      = flag.Bool("tos", false, "TOS cmsg per send")
	bigbuf   = flag.Bool("bigbuf", false, "4 MiB rcvbuf")
	n        = flag.Int("n", 200000, "round trips")
	filter   = flag.Bool("filter", false, "attach an accept-all classic BPF socket filter, as rxego's sockets have (SO_ATTACH_FILTER)")
	epollet  = flag.Bool("epoll", false, "register the socket in an edge-triggered epoll instance, as the Go runtime's poller does")
)

func sock(port int, peer int) int {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		log.Fatal(err)
	}
	if *opts {
		unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVTOS, 1)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1)
		unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVFRAGSIZE, 1)
		unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1)
	}
	if *bigbuf {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 4<<20)
	}
	if *filter {
		f := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff}} // keep the whole datagram
		if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: 1, Filter: &f[0]}); err != nil {
			log.Fatal(err)
		}
	}
	if *epollet {
		// Registered and never waited on: what a registration costs each
		// datagram is the socket's wait queue, not a wake-up.
		efd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			log.Fatal(err)
		}
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd)}
		if err := unix.EpollCtl(efd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			log.Fatal(err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: port}); err != nil {
		log.Fatal(err)
	}
	if !*mmsgSend {
		if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: peer}); err != nil {
			log.Fatal(err)
		}
	}
	return fd
}

type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

type ep struct {
	fd    int
	peer  unix.RawSockaddrInet4
	shdr  [1]mmsghdr
	siov  unix.Iovec
	sbuf  []byte
	sctrl []byte
	rhdr  []mmsghdr
	riov  []unix.Iovec
	rbuf  []byte
	rctrl []byte
	rname []unix.RawSockaddrInet4
}

func newEP(fd, peer int) *ep {
	e := &ep{fd: fd, sbuf: make([]byte, 96), sctrl: make([]byte, 64)}
	e.peer.Family = unix.AF_INET
	e.peer.Port = uint16(peer>>8) | uint16(peer&0xff)<<8
	e.peer.Addr = [4]byte{127, 0, 0, 1}
	e.siov.Base = &e.sbuf[0]
	e.siov.SetLen(len(e.sbuf))
	h := &e.shdr[0].hdr
	h.Name = (*byte)(unsafe.Pointer(&e.peer))
	h.Namelen = unix.SizeofSockaddrInet4
	h.Iov = &e.siov
	h.SetIovlen(1)
	if *tos {
		c := (*unix.Cmsghdr)(unsafe.Pointer(&e.sctrl[0]))
		c.Level, c.Type = unix.IPPROTO_IP, unix.IP_TOS
		c.SetLen(unix.CmsgLen(4))
		*(*uint32)(unsafe.Pointer(&e.sctrl[unix.CmsgLen(0)])) = 2
		h.Control = &e.sctrl[0]
		h.SetControllen(unix.CmsgSpace(4))
	}
	const vlen, slot, cs = 64, 2048, 128
	e.rhdr = make([]mmsghdr, vlen)
	e.riov = make([]unix.Iovec, vlen)
	e.rbuf = make([]byte, vlen*slot)
	e.rctrl = make([]byte, vlen*cs)
	e.rname = make([]unix.RawSockaddrInet4, vlen)
	for i := range e.rhdr {
		h := &e.rhdr[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&e.rname[i]))
		h.Namelen = unix.SizeofSockaddrInet4
		e.riov[i].Base = &e.rbuf[i*slot]
		e.riov[i].SetLen(slot)
		h.Iov = &e.riov[i]
		h.SetIovlen(1)
		h.Control = &e.rctrl[i*cs]
		h.SetControllen(cs)
	}
	return e
}

func (e *ep) send() {
	if *mmsgSend && *oneSend {
		_, _, errno := unix.Syscall(unix.SYS_SENDMSG, uintptr(e.fd), uintptr(unsafe.Pointer(&e.shdr[0].hdr)), 0)
		if errno != 0 {
			log.Fatal("sendmsg: ", errno)
		}
		return
	}
	if *mmsgSend {
		_, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(e.fd), uintptr(unsafe.Pointer(&e.shdr[0])), 1, 0, 0, 0)
		if errno != 0 {
			log.Fatal("sendmmsg: ", errno)
		}
		return
	}
	if _, err := unix.Write(e.fd, e.sbuf); err != nil {
		log.Fatal(err)
	}
}

func (e *ep) recv() {
	for {
		if *mmsgRecv {
			h := &e.rhdr[0].hdr
			h.Namelen = unix.SizeofSockaddrInet4
			h.SetControllen(128)
			if *oneRecv {
				r, _, errno := unix.Syscall(unix.SYS_RECVMSG, uintptr(e.fd), uintptr(unsafe.Pointer(h)), unix.MSG_DONTWAIT)
				if errno == 0 && r > 0 {
					return
				}
				continue
			}
			r, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(e.fd), uintptr(unsafe.Pointer(&e.rhdr[0])), 64, unix.MSG_DONTWAIT, 0, 0)
			if errno == 0 && r > 0 {
				return
			}
			continue
		}
		if _, err := unix.Read(e.fd, e.rbuf[:2048]); err == nil {
			return
		}
	}
}

func pin(cpu int) {
	runtime.LockOSThread()
	var s unix.CPUSet
	s.Set(cpu)
	unix.SchedSetaffinity(0, &s)
}

func main() {
	flag.Parse()
	a, b := sock(40001, 40002), sock(40002, 40001)
	ea, eb := newEP(a, 40002), newEP(b, 40001)
	go func() {
		pin(1)
		for {
			eb.recv()
			eb.send()
		}
	}()
	pin(0)
	rt := make([]time.Duration, *n)
	for i := range rt {
		t := time.Now()
		ea.send()
		ea.recv()
		rt[i] = time.Since(t)
	}
	sort.Slice(rt, func(i, j int) bool { return rt[i] < rt[j] })
	fmt.Printf("p50 %v p99 %v\n", rt[len(rt)/2], rt[len(rt)*99/100])
}
