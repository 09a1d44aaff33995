package transport

import (
	"slices"
	"sync"
	"time"
	"weak"

	"golang.org/x/sys/unix"
)

// Readers the Go runtime forgets. The system calls that read and send are
// raw (mmsgSyscall), so a receive loop whose socket always has work
// queued never enters the scheduler: to the runtime it is a goroutine
// computing. If the thread that had been polling the network is the one
// that took that goroutine, no thread is left waiting in epoll while the
// other P idles, and only sysmon polls, every 10 ms or less often. A
// reader parked on another socket then stayed parked 5-344 ms after its
// datagram came: a device's other shard, whose READ requests waited
// until the requester's retry timer fired (docs/performance.md, "A
// socket read late").
//
// Bringing a thread back into epoll would fix that and costs more than it
// saves: that thread is then woken at every datagram of the busy socket
// too, whose reader needs no wake-up (one QP's 64 KiB READ measured
// 0.66-0.72x with a goroutine started once a millisecond for that
// purpose). So a reader that has found work without waiting for
// kickEvery looks, with one poll(2) that does not wait, at the sockets of
// this process whose readers are parked, and wakes (Wake) those whose
// socket holds a datagram: a parked reader waits at most about kickEvery
// longer than it should, and a busy one pays a system call per kickEvery.
// That call is raw too (pollNow): made through the runtime's system call
// entry, the same poll once a millisecond cost that READ 0.81-0.86x in
// alternated sittings (raw: 1.04x), as if any visit to the scheduler
// restarted work the runtime otherwise leaves asleep.
const kickEvery = time.Millisecond

// receivers are the process's receiving Conns, which kickParked looks at.
// The set holds them weakly: a Conn dropped without Close is collected,
// and its sockets closed, as an *os.File is, instead of staying reachable
// from here for ever.
var receivers connSet

// connSet is a set of Conns, held weakly, safe for concurrent use.
type connSet struct {
	mu sync.Mutex
	cs []weak.Pointer[udpConn]
}

func (s *connSet) add(c *udpConn) {
	s.mu.Lock()
	s.cs = append(s.prune(), weak.Make(c))
	s.mu.Unlock()
}

func (s *connSet) remove(c *udpConn) {
	p := weak.Make(c)
	s.mu.Lock()
	s.cs = slices.DeleteFunc(s.prune(), func(q weak.Pointer[udpConn]) bool { return q == p })
	s.mu.Unlock()
}

// prune drops the Conns that were collected. The caller holds mu.
func (s *connSet) prune() []weak.Pointer[udpConn] {
	return slices.DeleteFunc(s.cs, func(q weak.Pointer[udpConn]) bool { return q.Value() == nil })
}

// kickEpoch is the origin of busyFrom's clock (monotonic).
var kickEpoch = time.Now()

// stillBusy notes a read that found work without waiting. While reads
// keep finding work it reports true once every kickEvery; a read that
// waits starts the count again (busyFrom 0). The caller holds rmu.
func (r *recvState) stillBusy() bool {
	now := max(int64(time.Since(kickEpoch)), 1)
	from := r.busyFrom.Load()
	if from != 0 && now-from < int64(kickEvery) {
		return false
	}
	r.busyFrom.Store(now)
	return from != 0
}

// kickParked wakes the readers parked on other sockets of the process
// that hold a datagram (see kickEvery). The caller holds rmu.
func (c *udpConn) kickParked() {
	r := &c.r
	fds, conns := r.kickFDs[:0], r.kickConns[:0]
	receivers.mu.Lock()
	for _, p := range receivers.cs {
		if o := p.Value(); o != nil && o != c && o.r.parked.Load() && !o.closed.Load() {
			fds = append(fds, unix.PollFd{Fd: o.rp.fd, Events: unix.POLLIN})
			conns = append(conns, o)
		}
	}
	receivers.mu.Unlock()
	if len(fds) > 0 {
		if n := pollNow(fds); n > 0 {
			for i := range fds {
				if fds[i].Revents&unix.POLLIN != 0 && conns[i].r.parked.Load() {
					conns[i].Wake()
					c.ctr.parkedKicks.Add(1)
				}
			}
		}
	}
	clear(conns) // no references to closed Conns
	r.kickFDs, r.kickConns = fds, conns[:0]
}
