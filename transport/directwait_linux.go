package transport

import (
	"net"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Round trips wait in the kernel. A reader parked in the runtime's poller
// waits, through armedPoll, on an epoll instance that the runtime's own
// instance watches. A nested instance wakes the one that watches it
// without the synchronous hint (WF_SYNC) of the socket's wake-up: the
// hint tells the scheduler the waker is about to sleep, so that it may
// run the woken thread on the waker's CPU. Without it the runtime's
// thread was woken on its own, idle, CPU: in a round trip on the 2-vCPU
// VM, 1.4-1.8 inter-processor interrupts per round trip against UDP's
// 0.2-0.3, and 1.25-1.55x UDP's p50 (docs/performance.md, "Blocking
// round trips and nested epoll").
//
// So a reader whose Conn moved few packets since its last wait (a round
// trip's: a request or reply each way, and maybe an ACK) waits in a
// blocking epoll_pwait2 on an instance of its own that holds the socket
// level-triggered (directWait), as a blocking read would: the socket's
// wake-up reaches its thread with the hint. A reader of a stream still
// parks in the runtime's poller: the same direct wait there measured
// 0.77-0.92x one QP's streams and 0.87x the 64-byte rate (more
// threads put to sleep and woken; the runtime's spinning threads catch a
// stream's next datagram without that).
//
// A round trip's wait sleeps first. Once a round trip's wait has slept, the
// next one sleeps before it looks: the instance is level-triggered, so a
// datagram already queued ends the sleep at once, and the look that
// would have found nothing (a recvmmsg, 1.3-2 us on the 2-vCPU VM) is
// saved. It sat between a side's send and its sleep: the peer's thread,
// woken by that send with the synchronous hint, may be waiting for this
// CPU meanwhile. Counted per round trip of the blocking SEND ping-pong:
// 3.87 system calls a side before, 3.44 after, every recvmmsg with data
// (docs/performance.md, "Sleeping before the first look").

// roundTripPackets and roundTripBytes are the most packets and bytes a
// Conn may have sent and received since its reader last waited for the
// next wait to look like a round trip's (a SEND ping-pong's side moves
// four packets, its echo and the ACK of the SEND it answers each way, and
// now and then up to about 30; a 64-byte stream posted in lists of 32,
// one more; 10,000 QPs' 4 KiB WRITEs, a few per QP and wait, more bytes).
// modeSwitch waits in a row that look like the other kind switch the
// kind: a ping-pong's occasional larger count left in the runtime's
// poller cost far more than its share (on the 2-vCPU VM the SEND
// ping-pong's cross-CPU wake-ups doubled with 4% of its waits there).
const (
	roundTripPackets = 32
	roundTripBytes   = 16 << 10
	modeSwitch       = 4
)

// directWait is the receive side's wait in the kernel: an epoll instance
// holding the socket (level-triggered, for good: nobody waits on it while
// the reader is busy, so arrivals then wake nobody) and an eventfd, which
// ends a wait early (a deadline moved: Wake; close). Both descriptors are
// blocking, so the runtime's poller never watches them. Its waits run
// inside armedPoll's, under the epoll file's read lock.
type directWait struct {
	epoll, kickF *os.File
	efd          uintptr
	kick         int32
	// traffic counts the packets and bytes the Conn sent and received;
	// lastPackets and lastBytes are its counts at the last wait.
	traffic                func() (packets, bytes uint64)
	lastPackets, lastBytes uint64
	// prevPackets and prevBytes are the counts when a reader last slept
	// here or came to sleep first (fewSince).
	prevPackets, prevBytes uint64
	// stream is set while waits are a stream's (they park in the
	// runtime's poller); streak counts the waits in a row that looked
	// like the other kind.
	stream bool
	streak int
	// deadline is when waits end, in nanoseconds of waitClock (0: none;
	// 1: past), kept equal to the runtime file's read deadline; sleeping
	// is set while a waiter is in, or about to enter, epoll_pwait2, so
	// that a deadline moved then kicks it.
	deadline atomic.Int64
	sleeping atomic.Bool
	closed   atomic.Bool
	ev       [2]unix.EpollEvent
	ts       unix.Timespec
}

// waitEpoch is the origin of waitClock.
var waitEpoch = time.Now()

// waitClock is the monotonic time since waitEpoch, in nanoseconds.
func waitClock() int64 { return int64(time.Since(waitEpoch)) }

// noPwait2 is set once epoll_pwait2 (Linux 5.11) is found missing; waits
// then time out in whole milliseconds, rounded up.
var noPwait2 atomic.Bool

// newDirectWait makes the direct wait of socket fd.
func newDirectWait(fd int, name string, traffic func() (packets, bytes uint64)) (*directWait, error) {
	efd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	w := &directWait{efd: uintptr(efd), traffic: traffic}
	w.lastPackets, w.lastBytes = traffic()
	w.prevPackets, w.prevBytes = w.lastPackets, w.lastBytes
	w.epoll = os.NewFile(uintptr(efd), name) // blocking: not in the runtime's poller
	// Blocking too, and still never blocks: it is read only once the
	// instance reports it readable, by the one waiter, and its count never
	// nears the limit at which a write would block.
	kfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		w.epoll.Close()
		return nil, os.NewSyscallError("eventfd", err)
	}
	w.kick, w.kickF = int32(kfd), os.NewFile(uintptr(kfd), name+" kick")
	for _, e := range []unix.EpollEvent{{Events: unix.EPOLLIN, Fd: w.kick}, {Events: unix.EPOLLIN, Fd: int32(fd)}} {
		if err := unix.EpollCtl(efd, unix.EPOLL_CTL_ADD, int(e.Fd), &e); err != nil {
			w.close()
			return nil, os.NewSyscallError("epoll_ctl", err)
		}
	}
	return w, nil
}

// roundTrip reports whether the coming wait is a round trip's: whether
// little moved before the last modeSwitch waits, or before most of the
// waits since the kind last switched. Waits are serialized.
func (w *directWait) roundTrip() bool {
	p, b := w.traffic()
	big := p-w.lastPackets > roundTripPackets || b-w.lastBytes > roundTripBytes
	w.lastPackets, w.lastBytes = p, b
	w.prevPackets, w.prevBytes = p, b
	if big != w.stream {
		if w.streak++; w.streak >= modeSwitch {
			w.stream, w.streak = big, 0
		}
	} else {
		w.streak = 0
	}
	return !w.stream
}

// fewSince reports whether the Conn moved at most a round trip's packets
// and bytes since a reader last slept here or came to sleep first, and
// notes the counts. A reader whose last wait slept here calls it before
// it looks: few, it sleeps first, and roundTrip's count starts afresh
// without the wait counting as one of either kind, since whether it
// would have found work at its first look is not known; many, it looks
// first, as a stream's reader must, and a wait then counts as before.
// Waits are serialized.
func (w *directWait) fewSince() bool {
	p, b := w.traffic()
	few := p-w.prevPackets <= roundTripPackets && b-w.prevBytes <= roundTripBytes
	w.prevPackets, w.prevBytes = p, b
	if few {
		w.lastPackets, w.lastBytes = p, b
	}
	return few
}

// wait sleeps and runs try on socket fd until try reports done. It
// returns os.ErrDeadlineExceeded when the deadline passes while try finds
// nothing, and net.ErrClosed once close has begun. looked says whether
// try ran just before: a wait that sleeps first and meets its deadline
// before any sleep still looks once, as one that looked first would
// have.
func (w *directWait) wait(try func(fd uintptr) bool, fd uintptr, looked bool) error {
	for {
		if err := w.sleep(); err != nil {
			if err == os.ErrDeadlineExceeded && !looked && try(fd) {
				return nil
			}
			return err
		}
		looked = true
		if try(fd) {
			return nil
		}
	}
}

// sleep blocks until the socket or the eventfd is ready or the deadline
// passes.
func (w *directWait) sleep() error {
	w.sleeping.Store(true)
	defer w.sleeping.Store(false)
	if w.closed.Load() {
		return net.ErrClosed
	}
	if sleepHook != nil {
		sleepHook()
	}
	var n uintptr
	var e unix.Errno
	for {
		dl := w.deadline.Load()
		var rem int64 = -1
		if dl != 0 {
			if rem = dl - waitClock(); rem <= 0 {
				return os.ErrDeadlineExceeded
			}
		}
		if n, e = w.pwait(rem); e != unix.EINTR { // a signal (the profiler's) ends the call early
			break
		}
	}
	if e != 0 {
		return os.NewSyscallError("epoll_pwait2", e)
	}
	for i := range w.ev[:n] {
		if w.ev[i].Fd == w.kick {
			var b [8]byte
			unix.RawSyscall(unix.SYS_READ, uintptr(w.kick), uintptr(unsafe.Pointer(&b[0])), 8)
		}
	}
	if w.closed.Load() {
		return net.ErrClosed
	}
	return nil
}

// pwait is one epoll_pwait2 for up to rem nanoseconds (negative: no
// limit), through the runtime's system call entry, since it blocks.
func (w *directWait) pwait(rem int64) (uintptr, unix.Errno) {
	if !noPwait2.Load() {
		var ts unsafe.Pointer
		if rem >= 0 {
			w.ts = unix.NsecToTimespec(rem)
			ts = unsafe.Pointer(&w.ts)
		}
		n, _, e := unix.Syscall6(unix.SYS_EPOLL_PWAIT2, w.efd, uintptr(unsafe.Pointer(&w.ev[0])), uintptr(len(w.ev)), uintptr(ts), 0, 0)
		if e != unix.ENOSYS {
			return n, e
		}
		noPwait2.Store(true)
	}
	ms := -1
	if rem >= 0 {
		ms = int((rem + int64(time.Millisecond) - 1) / int64(time.Millisecond))
	}
	n, _, e := unix.Syscall6(unix.SYS_EPOLL_PWAIT, w.efd, uintptr(unsafe.Pointer(&w.ev[0])), uintptr(len(w.ev)), uintptr(ms), 0, 0)
	return n, e
}

// setDeadline sets when waits end (the zero time: never; a time past: at
// once, and a waiter sleeping now wakes).
func (w *directWait) setDeadline(t time.Time) {
	var d int64
	if !t.IsZero() {
		d = max(int64(t.Sub(waitEpoch)), 1)
	}
	w.deadline.Store(d)
	if w.sleeping.Load() {
		w.kickNow()
	}
}

// kickNow makes the eventfd readable, which ends a wait in progress or
// the next one; the waiter that sees it empties it.
func (w *directWait) kickNow() {
	one := [8]byte{1}
	unix.RawSyscall(unix.SYS_WRITE, uintptr(w.kick), uintptr(unsafe.Pointer(&one[0])), 8)
}

// waitPath, set by tests only, makes every receive wait direct or in the
// runtime's poller, whatever the traffic.
var waitPath int

const (
	waitAuto = iota
	waitRuntime
	waitDirect
)

// sleepHook, set by tests only, runs just before a direct wait sleeps: a
// datagram that arrives then must still wake the waiter.
var sleepHook func()

// stop makes a wait in progress, and every later one, return
// net.ErrClosed.
func (w *directWait) stop() {
	w.closed.Store(true)
	if w.kickF != nil {
		w.kickNow()
	}
}

// close closes the descriptors; no wait may run.
func (w *directWait) close() error {
	err := w.epoll.Close()
	if w.kickF != nil {
		if e := w.kickF.Close(); err == nil {
			err = e
		}
	}
	return err
}
