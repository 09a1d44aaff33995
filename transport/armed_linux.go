package transport

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Readiness the runtime hears of only while someone waits for it. Go's
// poller registers a socket edge-triggered for reading and writing at
// once, so every datagram that arrives and every sent datagram the
// kernel frees is an edge; a thread of the process parked in epoll_pwait
// is woken by each, though the reader is busy and no one waits to write.
// A stream of one QP seldom leaves such a thread; with several QPs, and
// both shards' sockets busy, the process has one more often (session 14
// counted 21.5 against 28.5 epoll_pwait calls per MiB for 1 and 8 QPs:
// docs/performance.md, "A socket read late").
//
// So a Conn's sockets stay out of the runtime's poller (they are blocking
// descriptors, read and written with MSG_DONTWAIT), and each wait goes
// through an epoll instance of the Conn's own (armedPoll) that holds the
// socket with EPOLLONESHOT and that the runtime's poller watches instead:
// the socket is armed just before its waiter parks and disarmed as soon
// as it wakes, so arrivals while the reader works reach nobody. That is
// the wait of a stream's reader; a round trip's blocks in the kernel
// instead (directwait_linux.go).

// armedPoll is an epoll instance that holds one socket with EPOLLONESHOT,
// armed for events while a waiter is parked on it and disarmed once its
// waiter is found busy (see above). Waits on it are serialized by mu,
// which guards every field a waiter sets.
type armedPoll struct {
	// mu is held for a whole wait. The file's read lock already
	// serializes the waiters' runs, but a waiter leaves its outcome
	// (dwErr, failed, parked) for its caller, who reads it after that
	// lock is released: a WaitReadable and a blocking Recv of one Conn
	// wait at once, and one must not take the other's.
	mu     sync.Mutex
	file   *os.File // the epoll instance, in the runtime's poller
	rc     syscall.RawConn
	efd    uintptr
	fd     int32  // the socket
	events uint32 // EPOLLIN or EPOLLOUT
	// busyAfter is how many tries in a row that find work, with no wait
	// between them, make the waiter busy and disarm the socket.
	busyAfter int
	found     int
	armed     bool
	failed    unix.Errno // an arm that failed, for the waiter's caller
	ctl       unix.EpollEvent
	ev        [1]unix.EpollEvent
	// dw, on the receive side, is where a round trip's wait happens
	// (directWait); parked is set while the waiter is parked in the
	// runtime's poller instead, and dwErr is a direct wait's result for
	// the waiter's caller.
	dw     *directWait
	parked bool
	dwErr  error
	// slept is set while waits are a round trip's and the last one slept
	// in dw (so dw is not nil): the next sleeps before its first look
	// unless much moved since (directwait_linux.go).
	slept bool
	// quiet is set while the socket is out of the instance and of dw's
	// (quieten), until a waiter that must block puts it back (rejoin);
	// quiets and rejoins count those moves.
	quiet           bool
	quiets, rejoins atomic.Uint64
}

// newArmedPoll makes the armedPoll of socket fd for events (EPOLLIN or
// EPOLLOUT), disarmed. With traffic (the Conn's packet and byte counts),
// waits that follow little traffic wait in the kernel instead
// (directWait).
func newArmedPoll(fd int, events uint32, busyAfter int, name string, traffic func() (packets, bytes uint64)) (*armedPoll, error) {
	efd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	p := &armedPoll{efd: uintptr(efd), fd: int32(fd), events: events, busyAfter: busyAfter}
	p.ctl = unix.EpollEvent{Events: unix.EPOLLONESHOT, Fd: p.fd} // no events: disarmed
	if err := unix.EpollCtl(efd, unix.EPOLL_CTL_ADD, fd, &p.ctl); err != nil {
		unix.Close(efd)
		return nil, os.NewSyscallError("epoll_ctl", err)
	}
	// Non-blocking, so that os.NewFile puts it in the runtime's poller.
	if err := unix.SetNonblock(efd, true); err != nil {
		unix.Close(efd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	p.file = os.NewFile(uintptr(efd), name)
	if p.rc, err = p.file.SyscallConn(); err != nil {
		p.file.Close()
		return nil, fmt.Errorf("transport: %s: %w", name, err)
	}
	if traffic != nil {
		if p.dw, err = newDirectWait(fd, name+" direct", traffic); err != nil {
			p.file.Close()
			return nil, fmt.Errorf("transport: %s: %w", name, err)
		}
	}
	return p, nil
}

// waiter returns the function to hand p.rc.Read: it runs try on the
// socket; when try must wait, it arms the socket if it is not armed yet;
// when tries keep finding work (busyAfter), it disarms it. A reader that
// wakes, takes one datagram and waits again (a request and its reply)
// leaves the socket armed and makes no epoll call at all. Made once per
// try, since a closure made per call would allocate. waits, run before
// a wait that sleeps without trying first, does what try does when it
// finds nothing; it is needed only where p has a direct wait.
func (p *armedPoll) waiter(try func(fd uintptr) bool, waits func()) func(uintptr) bool {
	return func(uintptr) bool {
		if p.slept && waits != nil && !p.parked && !p.quiet && waitPath != waitRuntime &&
			(p.dw.fewSince() || waitPath == waitDirect) {
			// The last wait slept in dw and little moved since: this one
			// sleeps before it looks (directwait_linux.go).
			if p.armed {
				p.disarm()
			}
			waits()
			p.dwErr = p.dw.wait(try, uintptr(p.fd), false)
			return true
		}
		if try(uintptr(p.fd)) {
			p.found++
			if p.armed && p.found >= p.busyAfter {
				p.disarm()
			}
			p.parked = false
			return true
		}
		p.found = 0
		if p.quiet {
			if rejoinHook != nil {
				rejoinHook()
			}
			if e := p.rejoin(); e != 0 {
				p.failed = e
				return true // wait reports it
			}
		}
		if p.dw != nil && !p.parked && waitPath != waitRuntime && (waitPath == waitDirect || p.dw.roundTrip()) {
			if p.armed {
				p.disarm() // the runtime's thread is not to be woken too
			}
			p.slept = true
			p.dwErr = p.dw.wait(try, uintptr(p.fd), true)
			return true
		}
		p.slept = false
		p.parked = true
		if !p.armed {
			if armHook != nil {
				armHook()
			}
			if e := p.ctlMod(p.events | unix.EPOLLONESHOT); e != 0 {
				p.failed = e
				return true // wait reports it
			}
			p.armed = true
		}
		return false
	}
}

// rejoinHook, set by tests only, runs between a try that found nothing
// and the rejoin of a quiet socket that follows: a datagram that arrives
// then must still end the wait.
var rejoinHook func()

// quieten takes the socket out of the instance, and out of the direct
// wait's, so that the kernel's wake-up for each datagram the socket is
// given or frees finds no entry of ours to run (Quieter). A waiter that
// holds p now keeps it as it is, and so does a closing Conn (the
// instance's read reference keeps it open meanwhile). On a failure the
// socket stays in whatever instance it could not leave, and waits go on
// as before.
func (p *armedPoll) quieten() {
	if !p.mu.TryLock() {
		return
	}
	defer p.mu.Unlock()
	if p.quiet {
		return
	}
	_ = p.rc.Control(func(efd uintptr) {
		if ctl(efd, unix.EPOLL_CTL_DEL, p.fd, nil) != 0 {
			return
		}
		p.armed = false
		if p.dw != nil && ctl(p.dw.efd, unix.EPOLL_CTL_DEL, p.fd, nil) != 0 {
			p.ctl.Events = unix.EPOLLONESHOT // disarmed, as it was
			ctl(efd, unix.EPOLL_CTL_ADD, p.fd, &p.ctl)
			return
		}
		p.quiet = true
		p.quiets.Add(1)
	})
}

// rejoin puts a quiet socket back into the instance, disarmed, and into
// the direct wait's, before a waiter blocks. Both instances look at the
// socket as it joins: a datagram queued while it was out is seen by the
// arm or the direct wait that follows. The waiter runs it, under p.mu.
func (p *armedPoll) rejoin() unix.Errno {
	p.ctl.Events = unix.EPOLLONESHOT
	if e := ctl(p.efd, unix.EPOLL_CTL_ADD, p.fd, &p.ctl); e != 0 && e != unix.EEXIST {
		return e
	}
	if p.dw != nil {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: p.fd}
		if e := ctl(p.dw.efd, unix.EPOLL_CTL_ADD, p.fd, &ev); e != 0 && e != unix.EEXIST {
			return e
		}
	}
	p.quiet = false
	p.rejoins.Add(1)
	return 0
}

// armHook, set by tests only, runs between a try that found nothing and
// the arm that follows it: a datagram that arrives then must still wake
// the waiter.
var armHook func()

// disarm takes the socket's pending event, which disables it
// (EPOLLONESHOT) and takes it off the instance's ready list, or, with
// none pending, disables it. Off the ready list matters: a later arm
// that finds the socket readable signals only an event not listed yet.
func (p *armedPoll) disarm() {
	p.armed = false
	n, _, _ := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, p.efd, uintptr(unsafe.Pointer(&p.ev[0])), 1, 0, 0, 0)
	if int(n) != 1 {
		p.ctlMod(unix.EPOLLONESHOT)
	}
}

// ctlMod sets the socket's events. The calls are raw, as mmsgSyscall's
// are: neither waits.
func (p *armedPoll) ctlMod(events uint32) unix.Errno {
	p.ctl.Events = events
	return ctl(p.efd, unix.EPOLL_CTL_MOD, p.fd, &p.ctl)
}

// ctl is a raw epoll_ctl(2) on instance efd for socket fd.
func ctl(efd uintptr, op int, fd int32, ev *unix.EpollEvent) unix.Errno {
	_, _, e := unix.RawSyscall6(unix.SYS_EPOLL_CTL, efd, uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	return e
}

// wait runs fn, a waiter of p, until it is done, parking in the
// runtime's poller while it waits; an arm that failed is its error.
func (p *armedPoll) wait(fn func(uintptr) bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.rc.Read(fn)
	if err != nil {
		p.parked = false // ended by the deadline or close: the next wait decides afresh
	}
	if e := p.dwErr; e != nil {
		p.dwErr = nil
		return e
	}
	if e := p.failed; e != 0 {
		p.failed = 0
		return os.NewSyscallError("epoll_ctl", e)
	}
	return err
}

// close closes the epoll instance; parked waiters return net.ErrClosed
// (through mapClosed), and os.File's Close returns only when none runs.
func (p *armedPoll) close() error {
	if p == nil {
		return nil
	}
	if p.dw == nil {
		return p.file.Close()
	}
	p.dw.stop()           // a direct wait, which holds the file's read lock, returns
	err := p.file.Close() // and Close waits for it
	if e := p.dw.close(); err == nil {
		err = e
	}
	return err
}
