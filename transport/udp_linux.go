package transport

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/icrc"
	"golang.org/x/sys/unix"
)

// maxEINTR bounds the retries of a system call interrupted by a signal.
const maxEINTR = 64

// maxDropRecs bounds the dropped packets kept for the Tap per Recv call.
const maxDropRecs = 256

var (
	sendCtrlSpace = unix.CmsgSpace(4) + unix.CmsgSpace(2) // TOS, UDP_SEGMENT
	recvCtrlSpace = 5 * unix.CmsgSpace(4)                 // TOS, UDP_GRO, SO_RXQ_OVFL, RECVFRAGSIZE, spare
)

// udpConn is the Conn of Listen: a UDP socket bound to the local address,
// plus, in raw mode, a raw socket that does the reading.
type udpConn struct {
	ep     endpoint
	scope  uint32 // IPv6 scope ID for link-local peers
	mode   RecvMode
	tos    uint8 // default TOS, for the Tap
	gro    bool
	gso    atomic.Bool
	closed atomic.Bool
	// wakeSeq counts Wake calls; dlSet is set while a read deadline
	// (a Wake's, or RecvWait's limit) may be in force.
	wakeSeq atomic.Uint64
	dlSet   atomic.Bool
	file    *os.File
	rc      syscall.RawConn
	raw     *os.File
	rrc     syscall.RawConn
	tap     TapSlot
	ctr     counters
	csum    *csumCounter // socket mode: the namespace's UDP checksum errors

	smu sync.Mutex
	s   sendState
	// tmu guards tapPkt, where the Tap is shown each sent packet of a
	// scattered message gathered whole.
	tmu    sync.Mutex
	tapPkt []byte
	rmu    sync.Mutex
	r      recvState
	// rp and wp are where reads and sends wait (the sockets themselves
	// are not in the runtime's poller: see armedPoll); rp holds the
	// reading socket (the raw one in RecvRaw mode) and is nil for a Conn
	// that only sends.
	rp, wp *armedPoll
}

func (c *udpConn) LocalAddr() netip.AddrPort { return c.ep.local }

func (c *udpConn) SetTap(t Tap) { c.tap.Set(t) }

func (c *udpConn) Stats() Stats {
	s := c.ctr.snapshot()
	if c.rp != nil {
		s.Quiets, s.Rejoins = c.rp.quiets.Load(), c.rp.rejoins.Load()
	}
	s.GSO, s.GRO, s.Mode = c.gso.Load(), c.gro, c.mode
	return s
}

// Quiet implements Quieter: the receiving socket leaves the receive
// waits' two instances, the sending socket the send wait's.
func (c *udpConn) Quiet() {
	if c.closed.Load() {
		return
	}
	if c.rp != nil {
		c.rp.quieten()
	}
	c.wp.quieten()
}

// RecvBuffer returns the reading socket's SO_RCVBUF (RecvBufferer): the
// raw socket's in RecvRaw mode, the UDP socket's otherwise; 0 if it
// cannot be read.
func (c *udpConn) RecvBuffer() int {
	n := 0
	_ = c.readConn().Control(func(fd uintptr) {
		n, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
	})
	return n
}

func (c *udpConn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return net.ErrClosed
	}
	receivers.remove(c)
	err := c.closeFiles()
	c.csum.close()
	return err
}

// closeFiles closes the wait instances first, so that no waiter still
// runs a system call on a socket when the socket closes, then the
// sockets.
func (c *udpConn) closeFiles() error {
	var errs [4]error
	errs[0], errs[1] = c.rp.close(), c.wp.close()
	errs[2] = c.file.Close()
	if c.raw != nil {
		errs[3] = c.raw.Close()
	}
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// sendState is the preallocated sendmmsg machinery. A slot is one datagram:
// one packet, or one GSO run.
type sendState struct {
	hdrs  []mmsghdr
	iovs  []unix.Iovec
	names []sockaddr
	ctrl  []byte
	msg   []int32 // index in msgs of each slot's message
	// siovs are the iovecs of scattered slots (header, payload and
	// trailer of each packet), made at the first scattered message;
	// sused of them are taken by the slots of the batch being built.
	siovs []unix.Iovec
	sused int
	pkts  []int32 // packets in each slot
	win   []mmsghdr
	n     int
	errno unix.Errno
	fn    func(fd uintptr) bool // made once: a closure per call would allocate
	wait  func(uintptr) bool    // fn, waiting on the Conn's wp when the socket is full
	// sockTOS is the socket's IP_TOS (IPV6_TCLASS) now: a datagram that
	// wants another carries a control message, which costs the kernel a
	// parse per datagram. When tosRun datagrams in a row want the same
	// other TOS, tosRunVal, the socket adopts it (adoptTOS): an engine
	// sends nearly all its packets with one TOS (its DataTOS), usually not
	// the Conn's default.
	sockTOS   uint8
	tosRunVal uint8
	tosRun    int
}

// tosAdopt is how many datagrams in a row must want one TOS other than
// the socket's before the socket adopts it: a setsockopt, then no
// control message for each of them.
const tosAdopt = 64

func (s *sendState) init(slots int) {
	s.hdrs = make([]mmsghdr, slots)
	s.iovs = make([]unix.Iovec, slots)
	s.names = make([]sockaddr, slots)
	s.ctrl = make([]byte, slots*sendCtrlSpace)
	s.msg = make([]int32, slots)
	s.pkts = make([]int32, slots)
	for i := range s.hdrs {
		h := &s.hdrs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&s.names[i]))
		h.Iov = &s.iovs[i]
		h.SetIovlen(1)
	}
	s.fn = func(fd uintptr) bool {
		for range maxEINTR {
			n, e := mmsgSyscall(unix.SYS_SENDMMSG, fd, s.win)
			switch {
			case e == unix.EINTR:
				continue
			case e == unix.EAGAIN:
				return false // wait until writable
			case e == 0 && n == 0:
				e = unix.EIO // cannot happen; never spin on it
			}
			s.n, s.errno = n, e
			return true
		}
		s.n, s.errno = 0, unix.EINTR
		return true
	}
}

// scatterIovecs is how many iovecs a batch's scattered slots may use:
// enough for eight full GSO runs of three pieces per packet, far below
// the kernel's UIO_MAXIOV (1024) per datagram.
const scatterIovecs = 8 * 3 * MaxSegments

// Scatters implements Scatterer: scattered messages go out with
// sendmmsg, each packet's header, payload and trailer an iovec of its
// own, so the payload is never copied in user space.
func (c *udpConn) Scatters() bool { return true }

// Send implements Conn.
func (c *udpConn) Send(msgs []Message) (int, error) { return c.sendMsgs(msgs, true) }

// SendFilled implements FilledSender.
func (c *udpConn) SendFilled(msgs []Message) (int, error) { return c.sendMsgs(msgs, false) }

func (c *udpConn) sendMsgs(msgs []Message, fill bool) (int, error) {
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	// The timestamp is taken before the packets leave: on loopback the
	// peer's reply can otherwise be stamped earlier than its request.
	tap, at := c.tap.Get()
	c.smu.Lock()
	sent, gso, fallbackAt, err := c.send(msgs, fill)
	c.smu.Unlock()
	if tap != nil {
		c.tapSent(tap, at, msgs[:sent], gso, fallbackAt)
	}
	return sent, err
}

// send places messages into slots, a batch at a time, and sends them. gso
// is whether GSO was on at the start, and fallbackAt the first message sent
// after the kernel made us turn it off (for the Tap to know the IDs).
func (c *udpConn) send(msgs []Message, fill bool) (sent int, gso bool, fallbackAt int, err error) {
	s := &c.s
	if s.tosRun >= tosAdopt {
		c.adoptTOS(s.tosRunVal)
	}
	gso = c.gso.Load()
	useGSO := gso
	fallbackAt = len(msgs)
	for i := 0; i < len(msgs); {
		slots, j, verr := c.build(msgs, i, useGSO, fill)
		if slots > 0 {
			done, err := c.flush(slots)
			if err != nil {
				k := int(s.msg[done])
				if useGSO && s.pkts[done] > 1 && errors.Is(err, unix.EIO) {
					// The route cannot do GSO (no checksum offload, xfrm):
					// go on without it, as wireguard-go does.
					useGSO = false
					c.gso.Store(false)
					c.ctr.gsoFallbacks.Add(1)
					_ = c.rc.Control(func(fd uintptr) { noChecksum(int(fd), c.ep.v6) })
					fallbackAt, i = k, k
					continue
				}
				return k, gso, fallbackAt, err
			}
		}
		if verr != nil {
			return j, gso, fallbackAt, verr
		}
		i = j
	}
	return len(msgs), gso, fallbackAt, nil
}

// build fills slots from msgs[i:], computing ICRCs if fill is set, until
// the slots or the messages run out or a message is invalid. It returns the
// slots used, the index of the first message not placed, and that
// message's error if it was rejected.
func (c *udpConn) build(msgs []Message, i int, gso, fill bool) (slots, j int, err error) {
	s := &c.s
	for j = i; j < len(msgs); j++ {
		m := &msgs[j]
		peer, ok := c.ep.peer(m.Peer)
		if !ok {
			return slots, j, fmt.Errorf("%w: %v", ErrPeer, m.Peer)
		}
		k, err := c.ep.runSegments(m.Len(), m.Seg)
		if err != nil {
			return slots, j, err
		}
		seg := m.Seg
		if k == 1 {
			seg = m.Len()
		}
		whole := gso && k > 1
		need := k
		if whole {
			need = 1
		}
		if slots+need > len(s.hdrs) {
			return slots, j, nil
		}
		if m.Payload != nil {
			if err := checkScattered(m, seg); err != nil {
				return slots, j, err
			}
			if s.siovs == nil {
				s.siovs = make([]unix.Iovec, scatterIovecs)
			}
			if s.sused+3*k > len(s.siovs) {
				return slots, j, nil
			}
			slots = c.placeScattered(slots, int32(j), m, seg, peer, whole, fill)
			continue
		}
		if fill {
			c.ep.fillRun(m.Buf, seg, peer, 0, whole)
		}
		if whole {
			c.place(slots, int32(j), k, m.Buf, peer, m.TOS, seg)
			slots++
			continue
		}
		for off := 0; off < len(m.Buf); off += seg {
			c.place(slots, int32(j), 1, m.Buf[off:min(off+seg, len(m.Buf))], peer, m.TOS, 0)
			slots++
		}
	}
	return slots, j, nil
}

// placeScattered fills the slots of a scattered message m, validated,
// from slot on, computing ICRCs if fill is set, and returns the next free
// slot: one slot of 3 iovecs per packet (empty pieces left out), or, for
// a whole GSO run, one slot with all of them (the kernel cuts the
// concatenation every seg bytes, which the pieces of each packet add up
// to).
func (c *udpConn) placeScattered(slot int, msg int32, m *Message, seg int, peer netip.AddrPort, whole, fill bool) int {
	s := &c.s
	w := scatterWalk{buf: m.Buf, payload: m.Payload, seg: seg}
	start, pkts, total := s.sused, 0, 0
	var id uint16
	var flow icrc.Flow
	if fill {
		flow = c.ep.outbound(peer)
	}
	for !w.done() {
		hdr, pay, tr, _ := w.next() // checkScattered passed
		if fill {
			c.ep.fillScattered(hdr, pay, tr, flow, id)
		}
		for _, b := range [3][]byte{hdr, pay, tr} {
			if len(b) > 0 {
				s.siovs[s.sused].Base = &b[0]
				s.siovs[s.sused].SetLen(len(b))
				s.sused++
			}
		}
		pkts++
		total += len(hdr) + len(pay) + len(tr)
		if whole {
			id++
			continue
		}
		c.placeIovecs(slot, msg, 1, s.siovs[start:s.sused], total, peer, m.TOS, 0)
		slot++
		start, pkts, total = s.sused, 0, 0
	}
	if whole {
		c.placeIovecs(slot, msg, pkts, s.siovs[start:s.sused], total, peer, m.TOS, seg)
		slot++
	}
	return slot
}

// placeIovecs fills one slot whose data is the n bytes of iovs, which
// live in siovs: s.iovs[slot] keeps only the length, for the counters.
func (c *udpConn) placeIovecs(slot int, msg int32, pkts int, iovs []unix.Iovec, n int, peer netip.AddrPort, tos uint8, gsoSize int) {
	s := &c.s
	h := &s.hdrs[slot].hdr
	h.Iov = &iovs[0]
	h.SetIovlen(len(iovs))
	s.iovs[slot].Base = nil
	s.iovs[slot].SetLen(n)
	c.placeHeader(slot, msg, pkts, peer, tos, gsoSize)
}

// place fills one slot: address, data, and control messages for the TOS
// (when not the socket's) and the GSO segment size.
func (c *udpConn) place(slot int, msg int32, pkts int, buf []byte, peer netip.AddrPort, tos uint8, gsoSize int) {
	s := &c.s
	h := &s.hdrs[slot].hdr
	h.Iov = &s.iovs[slot]
	h.SetIovlen(1)
	s.iovs[slot].Base = &buf[0]
	s.iovs[slot].SetLen(len(buf))
	c.placeHeader(slot, msg, pkts, peer, tos, gsoSize)
}

// placeHeader fills a slot's address and control messages.
func (c *udpConn) placeHeader(slot int, msg int32, pkts int, peer netip.AddrPort, tos uint8, gsoSize int) {
	s := &c.s
	h := &s.hdrs[slot].hdr
	h.Namelen = putSockaddr(&s.names[slot], peer, c.scope)
	ctrl := s.ctrl[slot*sendCtrlSpace : (slot+1)*sendCtrlSpace]
	n := 0
	if tos == 0 {
		tos = c.tos
	}
	if tos == s.sockTOS {
		s.tosRun = 0
	} else {
		if tos == s.tosRunVal {
			s.tosRun++
		} else {
			s.tosRunVal, s.tosRun = tos, 1
		}
		if c.ep.v6 {
			n += putCmsg(ctrl[n:], unix.IPPROTO_IPV6, unix.IPV6_TCLASS, uint32(tos), 4)
		} else {
			n += putCmsg(ctrl[n:], unix.IPPROTO_IP, unix.IP_TOS, uint32(tos), 4)
		}
	}
	if gsoSize > 0 {
		n += putCmsg(ctrl[n:], unix.SOL_UDP, unix.UDP_SEGMENT, uint32(gsoSize), 2)
	}
	if n > 0 {
		h.Control = &ctrl[0]
	} else {
		h.Control = nil
	}
	h.SetControllen(n)
	s.msg[slot], s.pkts[slot] = msg, int32(pkts)
}

// adoptTOS makes tos the socket's IP_TOS (IPV6_TCLASS), so that
// datagrams wanting it need no control message. On failure the socket
// keeps its TOS and datagrams their control messages. c.smu is held.
func (c *udpConn) adoptTOS(tos uint8) {
	s := &c.s
	s.tosRun = 0
	var err error
	cerr := c.rc.Control(func(fd uintptr) {
		if c.ep.v6 {
			err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_TCLASS, int(tos))
		} else {
			err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TOS, int(tos))
		}
	})
	if cerr == nil && err == nil {
		s.sockTOS = tos
	}
}

// flush sends slots [0, slots) and returns the index of the first slot not
// sent when an error stopped it.
func (c *udpConn) flush(slots int) (int, error) {
	s := &c.s
	defer func() {
		for q := range slots {
			s.iovs[q].Base = nil // do not keep the caller's buffers alive
		}
		for q := range s.sused {
			s.siovs[q].Base = nil
		}
		s.sused = 0
		s.win = nil
	}()
	var pkts, bytes, gsoSends, gsoSegs, calls uint64
	defer func() {
		c.ctr.sentPackets.Add(pkts)
		c.ctr.sentBytes.Add(bytes)
		c.ctr.sendCalls.Add(calls)
		if gsoSends > 0 {
			c.ctr.gsoSends.Add(gsoSends)
			c.ctr.gsoSegments.Add(gsoSegs)
		}
	}()
	for off := 0; off < slots; {
		s.win = s.hdrs[off:slots]
		if err := c.wp.wait(s.wait); err != nil {
			return off, c.mapClosed(err)
		}
		calls++
		if s.errno != 0 {
			return off, os.NewSyscallError("sendmmsg", s.errno)
		}
		for q := off; q < off+s.n; q++ {
			pkts += uint64(s.pkts[q])
			bytes += uint64(s.iovs[q].Len)
			if s.pkts[q] > 1 {
				gsoSends++
				gsoSegs += uint64(s.pkts[q])
			}
		}
		off += s.n
	}
	return slots, nil
}

// tapSent shows the Tap every packet of msgs with the IP ID it carried.
func (c *udpConn) tapSent(tap Tap, at time.Time, msgs []Message, gso bool, fallbackAt int) {
	for i := range msgs {
		m := &msgs[i]
		peer, _ := c.ep.peer(m.Peer)
		tos := m.TOS
		if tos == 0 {
			tos = c.tos
		}
		if m.Payload != nil {
			c.tapScattered(tap, at, m, peer, tos, gso && i < fallbackAt && !c.ep.v6)
			continue
		}
		seg := m.Seg
		if seg <= 0 || seg >= len(m.Buf) {
			seg = len(m.Buf)
		}
		var id uint16
		for off := 0; off < len(m.Buf); off += seg {
			tap.Packet(Out, at, c.ep.local, peer, tos, id, m.Buf[off:min(off+seg, len(m.Buf))])
			if gso && i < fallbackAt && !c.ep.v6 {
				id++
			}
		}
	}
}

// tapScattered shows the Tap each packet of the scattered message m,
// gathered whole; countIDs says the packets carried IDs 0, 1, ... (a GSO
// run) rather than 0 each.
func (c *udpConn) tapScattered(tap Tap, at time.Time, m *Message, peer netip.AddrPort, tos uint8, countIDs bool) {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	w := scatterWalk{buf: m.Buf, payload: m.Payload, seg: m.Seg}
	var id uint16
	for !w.done() {
		hdr, pay, tr, err := w.next()
		if err != nil {
			return // not sent: Send rejected it
		}
		c.tapPkt = append(append(append(c.tapPkt[:0], hdr...), pay...), tr...)
		tap.Packet(Out, at, c.ep.local, peer, tos, id, c.tapPkt)
		if countIDs {
			id++
		}
	}
}

// recvState is the preallocated recvmmsg machinery and the walk through
// the datagrams of the last call.
type recvState struct {
	hdrs  []mmsghdr
	iovs  []unix.Iovec
	names []sockaddr
	ctrl  []byte
	buf   []byte
	slot  int
	n     int // datagrams read by the last call
	dirty int // headers the kernel may have written since readBatch reset them
	// vlen is how many datagrams the next call may read: all of hdrs, or
	// one for a TryRecv right after one that found nothing (a poller's
	// next datagram most often comes alone, and a recvmmsg that may read
	// more tries the queue once more after it, in vain).
	vlen  int
	empty bool // the last TryRecv found nothing queued
	// wouldWait is set when a read found nothing queued (and, in a
	// blocking read, its goroutine then parks in the runtime's poller);
	// busyFrom is when reads began to find work without ever waiting, 0
	// since the last wait; parked is set while a reader waits in the
	// runtime's poller (see kickParked).
	wouldWait bool
	busyFrom  atomic.Int64
	parked    atomic.Bool
	kickFDs   []unix.PollFd // kickParked's scratch
	kickConns []*udpConn
	errno     unix.Errno
	fn        func(fd uintptr) bool
	try       func(fd uintptr) // fn once, without waiting (TryRecv)
	got       bool             // try's result
	ready     func(fd uintptr) bool
	pfd       [1]unix.PollFd // for ready
	// wait and readyWait are fn and ready waiting on the Conn's rp;
	// fnWaits and readyWaits mark the reader waiting, as fn and ready do
	// when they find nothing, for a wait that sleeps before it looks.
	wait, readyWait     func(uintptr) bool
	fnWaits, readyWaits func()

	next     int    // next datagram to start
	data     []byte // packets of the current datagram not yet delivered
	seg      int    // their size (GRO or GSO segment size), 0 for one packet
	peer     netip.AddrPort
	tos      uint8
	id       uint16    // IP ID of the next segment (raw mode) or the guess for it (socket mode)
	flow     icrc.Flow // the ICRC flow of packets from flowPeer (raw mode: of the current datagram)
	flowPeer netip.AddrPort
	first    bool        // raw mode: the first segment's ICRC is already known good
	firstPkt bth.Packet  // raw mode: that segment, parsed
	ovfl     uint32      // last SO_RXQ_OVFL count seen
	noDF     noDFWitness // socket mode: corroborates no_df drops
	frag     bool        // the current datagram was reassembled from fragments
	drops    []dropRec
}

func (r *recvState) init(batch, slot int) {
	r.hdrs = make([]mmsghdr, batch)
	r.iovs = make([]unix.Iovec, batch)
	r.names = make([]sockaddr, batch)
	r.ctrl = make([]byte, batch*recvCtrlSpace)
	r.buf = make([]byte, batch*slot)
	r.slot = slot
	r.vlen = batch
	r.dirty = batch // none set up yet
	r.drops = make([]dropRec, 0, maxDropRecs)
	for i := range r.hdrs {
		h := &r.hdrs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&r.names[i]))
		h.Iov = &r.iovs[i]
		h.SetIovlen(1)
		h.Control = &r.ctrl[i*recvCtrlSpace]
		r.iovs[i].Base = &r.buf[i*slot]
		r.iovs[i].SetLen(slot)
	}
	read := func(fd uintptr) bool {
		for range maxEINTR {
			n, e := mmsgSyscall(unix.SYS_RECVMMSG, fd, r.hdrs[:r.vlen])
			switch {
			case e == unix.EINTR:
				continue
			case e == unix.EAGAIN, e == 0 && n == 0:
				return false
			}
			r.n, r.errno = n, e
			return true
		}
		r.n, r.errno = 0, unix.EINTR
		return true
	}
	r.fnWaits = func() {
		r.wouldWait = true
		r.parked.Store(true) // cleared when the read returns (readBatch)
	}
	r.fn = func(fd uintptr) bool {
		if read(fd) {
			return true
		}
		r.fnWaits()
		return false // wait until readable
	}
	// A TryRecv that finds nothing does not count as parked: its
	// goroutine spins, and kickParked must not Wake it.
	r.try = func(fd uintptr) { r.got = read(fd) }
	r.readyWaits = func() {
		r.busyFrom.Store(0)
		r.parked.Store(true) // cleared when WaitReadable's read returns
	}
	r.ready = func(fd uintptr) bool {
		r.pfd[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
		if n, err := unix.Poll(r.pfd[:], 0); err == nil && n == 0 {
			r.readyWaits()
			return false
		}
		return true // readable; on an error, let the read report it
	}
}

// recvHow says how a receive waits.
type recvHow uint8

const (
	recvTry   recvHow = iota // never wait (TryRecv)
	recvBlock                // wait for a packet (Recv)
	recvWake                 // wait for a packet, a Wake or a time limit (RecvWait)
)

// Recv implements Conn.
func (c *udpConn) Recv(msgs []Message) (int, error) { return c.recv(msgs, recvBlock) }

// TryRecv implements Poller.
func (c *udpConn) TryRecv(msgs []Message) (int, error) { return c.recv(msgs, recvTry) }

// pastDeadline is the read deadline Wake sets: any time in the past makes
// the runtime's poller return the blocked reader at once.
var pastDeadline = time.Unix(1, 0)

// readConn is the reading socket: the raw one in raw mode.
func (c *udpConn) readConn() syscall.RawConn {
	if c.rrc != nil {
		return c.rrc
	}
	return c.rc
}

// readFile is the file a reader waits on, whose read deadline ends the
// wait.
func (c *udpConn) readFile() *os.File { return c.rp.file }

// WakeSeq implements Waker.
func (c *udpConn) WakeSeq() uint64 { return c.wakeSeq.Load() }

// Wake implements Waker. The read deadline, set in the past, is what
// returns a reader parked in the runtime's poller; the sequence number
// covers a Wake that comes before the reader parks (see RecvWait).
func (c *udpConn) Wake() {
	c.wakeSeq.Add(1)
	c.dlSet.Store(true)
	_ = c.readFile().SetReadDeadline(pastDeadline)
	c.rp.dw.setDeadline(pastDeadline)
}

// RecvWait implements Waker. It sets the read deadline (until, or none)
// before it compares the wake count with seq: a Wake whose count it does
// not see comes after the deadline was set, and its own deadline in the
// past then ends the wait.
func (c *udpConn) RecvWait(msgs []Message, seq uint64, until time.Time) (int, error) {
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	if err := c.setDeadline(until); err != nil {
		return 0, err
	}
	if c.wakeSeq.Load() != seq {
		return 0, nil
	}
	return c.recv(msgs, recvWake)
}

// setDeadline sets the read deadline, skipping the call when it is and
// stays none (dlSet is false only while no deadline can be set).
func (c *udpConn) setDeadline(until time.Time) error {
	if until.IsZero() && !c.dlSet.Load() {
		return nil
	}
	c.dlSet.Store(!until.IsZero())
	c.rp.dw.setDeadline(until)
	return c.mapClosed(c.readFile().SetReadDeadline(until))
}

// deadlineHit handles a read that ended at the read deadline. A Wake or
// time limit meant for RecvWait that a Recv or WaitReadable meets is
// cleared, and they go on waiting; RecvWait returns.
func (c *udpConn) deadlineHit(err error, how recvHow) (retry bool, _ error) {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false, c.mapClosed(err)
	}
	if how == recvWake {
		// The deadline may be a Wake's that raced with setDeadline's
		// clearing (Wake's dlSet stored before the clear, its deadline set
		// after): with dlSet false it would stay and end every later read
		// at once, a reader spinning without reading. Mark it set, so the
		// next RecvWait clears it.
		c.dlSet.Store(true)
		return false, errNothing
	}
	// Clear it whatever dlSet says: a Wake racing with an earlier clear
	// can leave its deadline in the past with dlSet false (Wake's store
	// of true before the clear's of false, its deadline after the
	// clear's), and setDeadline would then skip the call, the reader
	// meeting the deadline again at once, for ever, with datagrams
	// queued (TestDeadlineLeftByWake).
	c.dlSet.Store(true)
	return true, c.setDeadline(time.Time{})
}

// WaitReadable implements Poller: it parks in the runtime's poller until
// a datagram is queued, without reading it and without holding the
// receive lock, so TryRecv from other goroutines goes ahead meanwhile.
func (c *udpConn) WaitReadable() error {
	if c.closed.Load() {
		return net.ErrClosed
	}
	if c.rp == nil {
		return errSendOnly
	}
	for {
		err := c.rp.wait(c.r.readyWait)
		c.r.parked.Store(false)
		if err == nil {
			return nil
		}
		if retry, err := c.deadlineHit(err, recvBlock); !retry || err != nil {
			return err
		}
	}
}

// recv is Recv (recvBlock), TryRecv (recvTry: return 0 at once when
// nothing is queued or another goroutine is receiving) and RecvWait
// (recvWake: return 0 when woken or at the deadline).
func (c *udpConn) recv(msgs []Message, how recvHow) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	if c.rp == nil {
		return 0, errSendOnly
	}
	for {
		if how != recvTry {
			c.rmu.Lock()
		} else if !c.rmu.TryLock() {
			return 0, nil
		}
		n, err := c.fill(msgs, how)
		drops := c.r.drops
		c.r.drops = c.r.drops[:0]
		c.rmu.Unlock()
		if tap, at := c.tap.Get(); tap != nil {
			for i := range msgs[:n] {
				m := &msgs[i]
				tap.Packet(In, at, c.ep.local, m.Peer, m.TOS, m.IPID, m.Buf)
			}
			for i := range drops {
				d := &drops[i]
				tap.Drop(d.reason, at, c.ep.local, d.peer, d.tos, d.pkt)
			}
		}
		clear(drops) // drop references into the buffers
		if n > 0 || err != nil || how != recvBlock {
			return n, err
		}
	}
}

// fill delivers packets from the datagrams read so far, reading a new batch
// only when nothing has been delivered or dropped yet: waiting for one as
// how says.
func (c *udpConn) fill(msgs []Message, how recvHow) (int, error) {
	r := &c.r
	n := 0
	var bytes uint64
	var drops [NumDropReasons]uint64
	defer func() {
		c.ctr.recvPackets.Add(uint64(n))
		c.ctr.recvBytes.Add(bytes)
		for i, d := range drops {
			if d > 0 {
				c.ctr.drops[i].Add(d)
			}
		}
	}()
	for n < len(msgs) && len(r.drops) < cap(r.drops) {
		if len(r.data) == 0 {
			if r.next < r.n {
				if reason, pkt, bad := c.startDatagram(); bad {
					drops[reason]++
					r.drops = append(r.drops, dropRec{reason: reason, peer: r.peer, tos: r.tos, pkt: pkt})
				}
				continue
			}
			if n > 0 || len(r.drops) > 0 {
				break
			}
			if err := c.readBatch(how); err != nil {
				if err == errNothing {
					return n, nil
				}
				return n, err
			}
			continue
		}
		seg := r.seg
		if seg <= 0 || seg > len(r.data) {
			seg = len(r.data)
		}
		pkt := r.data[:seg:seg]
		r.data = r.data[seg:]
		pk, id, reason, ok := c.verify(pkt)
		if !ok {
			drops[reason]++
			r.drops = append(r.drops, dropRec{reason: reason, peer: r.peer, tos: r.tos, pkt: pkt})
			continue
		}
		msgs[n] = Message{Buf: pkt, Pkt: pk, Peer: r.peer, TOS: r.tos, IPID: id}
		n++
		bytes += uint64(len(pkt))
	}
	return n, nil
}

// errSendOnly is the answer of a receive on a source-port Conn, which
// only sends (its socket drops everything it is sent).
var errSendOnly = errors.New("transport: this Conn only sends")

// errNothing is readBatch's answer when, not blocking, nothing is queued.
var errNothing = errors.New("transport: nothing queued")

// readBatch runs recvmmsg; it returns errNothing when, as how allows,
// it stops waiting (recvTry: at once; recvWake: at a Wake or the
// deadline) before a datagram comes.
func (c *udpConn) readBatch(how recvHow) error {
	r := &c.r
	// Only the headers the last call filled need resetting: a ping-pong's
	// receive reads one datagram of the 256 the batch has room for.
	for i := range r.hdrs[:r.dirty] {
		h := &r.hdrs[i]
		h.n = 0
		h.hdr.Namelen = unix.SizeofSockaddrInet6
		h.hdr.SetControllen(recvCtrlSpace)
		h.hdr.Flags = 0
	}
	r.dirty = 0
	r.n, r.next = 0, 0
	r.vlen = len(r.hdrs)
	if how == recvTry && r.empty {
		r.vlen = 1
	}
	if how != recvTry {
		r.wouldWait = false
		for {
			err := c.rp.wait(r.wait)
			r.parked.Store(false)
			if err == nil {
				break
			}
			if retry, err := c.deadlineHit(err, how); !retry || err != nil {
				return err
			}
		}
	} else {
		r.got = false
		if err := c.readConn().Control(r.try); err != nil {
			return c.mapClosed(err)
		}
		r.empty = !r.got
		if !r.got {
			return errNothing
		}
	}
	c.ctr.recvCalls.Add(1)
	if how != recvTry && r.wouldWait {
		r.busyFrom.Store(0)
	} else if r.stillBusy() {
		c.kickParked()
	}
	if r.errno != 0 {
		r.dirty = len(r.hdrs) // whatever the kernel wrote before it failed
		r.n = 0
		return c.mapClosed(os.NewSyscallError("recvmmsg", r.errno))
	}
	r.dirty = r.n
	c.ctr.recvDatagrams.Add(uint64(r.n))
	return nil
}

// startDatagram sets up the walk through datagram r.next. bad reports a
// datagram dropped whole (truncated, or headers cut short).
func (c *udpConn) startDatagram() (reason DropReason, pkt []byte, bad bool) {
	r := &c.r
	i := r.next
	r.next++
	h := &r.hdrs[i]
	b := r.buf[i*r.slot : i*r.slot+min(int(h.n), r.slot)]
	ri := parseCmsgs(r.ctrl[i*recvCtrlSpace : i*recvCtrlSpace+min(int(h.hdr.Controllen), recvCtrlSpace)])
	if ri.hasDrops {
		if d := ri.drops - r.ovfl; d > 0 && d < 1<<31 {
			// The socket's drop count also counts datagrams the kernel
			// dropped for a bad UDP checksum (socket mode).
			bad := c.csum.take(uint64(d))
			c.ctr.drops[DropBadUDPChecksum].Add(bad)
			c.ctr.drops[DropOverflow].Add(uint64(d) - bad)
		}
		r.ovfl = ri.drops
	}
	r.peer, r.tos, r.seg, r.data, r.id, r.frag = getSockaddr(&r.names[i]), ri.tos, 0, nil, 0, ri.frag
	if h.hdr.Flags&unix.MSG_TRUNC != 0 {
		return DropTruncated, b, true
	}
	if c.raw != nil {
		return c.startRaw(b)
	}
	if len(b) == 0 {
		return DropShort, b, true
	}
	if ri.frag {
		return DropFragment, b, true
	}
	if r.peer != r.flowPeer {
		// The flow's part of the ICRC is folded once for all the packets
		// and datagrams that come from one peer in a row.
		r.flow, r.flowPeer = c.ep.inbound(r.peer), r.peer
	}
	r.data, r.seg = b, ri.gso
	if ri.gso > 0 && len(b) > ri.gso {
		c.ctr.groBatches.Add(1)
		c.ctr.groSegments.Add(uint64((len(b) + ri.gso - 1) / ri.gso))
	}
	return 0, nil, false
}

// verify checks one packet of the current datagram.
func (c *udpConn) verify(pkt []byte) (bth.Packet, uint16, DropReason, bool) {
	if c.raw == nil {
		// The segments of a GRO batch most often carry consecutive IDs (a
		// GSO sender's 0, 1, 2, ...; a kernel's per-destination counter),
		// so the ID after the previous packet's is tried first: checking
		// one ID is cheaper than solving for it.
		p, id, reason, ok := c.ep.recover(pkt, c.r.peer, c.r.flow, c.r.id)
		c.r.id = id + 1
		return p, id, c.r.noDF.observe(c.r.peer, reason), ok
	}
	return c.verifyRaw(pkt)
}
