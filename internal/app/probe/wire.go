package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/gopacket/gopacket/layers"
	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/icrc"
	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/internal/inetsum"
	"github.com/rxego/rxego/internal/iphdr"
	"github.com/rxego/rxego/transport"
	"github.com/rxego/rxego/transport/pcaptap"
	"golang.org/x/sys/unix"
)

// Safety bounds of every run. They are the probe's promise to the peer's
// owner: it cannot flood, whatever the scenarios ask for.
const (
	// DefaultMaxPackets bounds the RoCE packets one run sends.
	DefaultMaxPackets = 2000
	// DefaultGap is the least time between two packets the probe sends
	// (at most 1000 packets a second).
	DefaultGap = time.Millisecond
	// maxSendsPerScenario bounds one scenario's scripted packets.
	maxSendsPerScenario = 64
)

// ErrBudget is returned when a run would send more packets than its bound.
var ErrBudget = errors.New("probe: packet budget exhausted")

// arrival is one RoCE packet the probe received, ICRC checked.
type arrival struct {
	at  time.Time
	hdr bth.Header
	pkt []byte
	rec trace.Record
}

// wire is the probe's own UDP port 4791: it sends exactly the bytes a
// scenario builds (with a correct ICRC unless the scenario corrupts it) to
// the one peer address, and hands every received packet, parsed, to the
// run. It does not go through rxego's queue-pair engine, so PSNs and
// headers are exactly what the scenario says.
type wire struct {
	conn  *net.UDPConn
	local netip.AddrPort
	peer  netip.AddrPort

	gap        time.Duration
	maxPackets int

	// sendMu makes setting a packet's TOS and sending it one step: a
	// CNP train's goroutine sends beside the run's own answers.
	sendMu sync.Mutex

	mu     sync.Mutex
	sent   int
	last   time.Time
	frames int
	pcap   *pcaptap.Writer
	// recs collects every packet's trace record, for the ladders.
	recs []trace.Record

	in      chan arrival
	dropped int // received but not RoCE or bad ICRC

	// dev, when set, is the rxego device sharing the port (-R: its CM
	// and exchange); it gets every packet but those for claimed QPs.
	dev     *devConn
	claimed map[uint32]bool
	done    chan struct{}
}

// openWire binds local:4791 and will talk only to peer:4791.
func openWire(local, peer netip.Addr, gap time.Duration, maxPackets int, pcap *pcaptap.Writer) (*wire, error) {
	if local.Is4() != peer.Is4() {
		return nil, fmt.Errorf("probe: local address %v and peer %v are of different IP versions", local, peer)
	}
	la := netip.AddrPortFrom(local, transport.Port)
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(la))
	if err != nil {
		return nil, fmt.Errorf("probe: binding %v (another RoCE stack on this address?): %w", la, err)
	}
	// DF, as rxe sends, which also makes the kernel write IPv4 ID 0: the
	// ICRC covers the ID (see docs/transport.md).
	rc, err := c.SyscallConn()
	if err == nil {
		cerr := rc.Control(func(fd uintptr) {
			if local.Is4() {
				err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
			} else {
				err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
			}
		})
		if err == nil {
			err = cerr
		}
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("probe: setting DF on %v: %w", la, err)
	}
	// The kernel stamps each packet as it reaches the socket: the probe's
	// timings (a resend after T, the first resend after a NAK) must not
	// include how long the probe's reader took to be scheduled, which on
	// a loaded host is tens of milliseconds and can put a packet's first
	// copy next to its resend.
	if err := stampArrivals(c); err != nil {
		c.Close()
		return nil, fmt.Errorf("probe: asking for receive timestamps on %v: %w", la, err)
	}
	if gap <= 0 {
		gap = DefaultGap
	}
	if maxPackets <= 0 {
		maxPackets = DefaultMaxPackets
	}
	w := &wire{conn: c, local: la, peer: netip.AddrPortFrom(peer, transport.Port), gap: gap,
		maxPackets: maxPackets, pcap: pcap, in: make(chan arrival, 1024), done: make(chan struct{})}
	go w.readLoop()
	return w, nil
}

// close stops the reader and releases the port.
func (w *wire) close() {
	w.conn.Close()
	<-w.done
}

// setTOS sets the IP TOS byte (DSCP and ECN) of the packets sent next.
func (w *wire) setTOS(tos uint8) error {
	rc, err := w.conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if w.local.Addr().Is4() {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TOS, int(tos))
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_TCLASS, int(tos))
		}
	}); err != nil {
		return err
	}
	return serr
}

// fillICRC writes pkt's ICRC as sent from local to peer with IPv4 ID 0.
func (w *wire) fillICRC(pkt []byte) {
	if w.local.Addr().Is4() {
		v := icrc.V4{Src: w.local.Addr().As4(), Dst: w.peer.Addr().As4(), SrcPort: w.local.Port(), DstPort: w.peer.Port(), DF: true}
		v.Fill(0, pkt)
		return
	}
	v := icrc.V6{Src: w.local.Addr().As16(), Dst: w.peer.Addr().As16(), SrcPort: w.local.Port(), DstPort: w.peer.Port()}
	v.Fill(pkt)
}

// spinBelow is the longest gap send waits out by yielding rather than
// with a timer.
const spinBelow = 500 * time.Microsecond

// send paces and sends one packet (BTH..ICRC, ICRC already as wanted) to
// the peer; tos is the IP TOS it carried, for the record.
func (w *wire) send(ctx context.Context, pkt []byte, tos uint8) (time.Time, error) {
	return w.sendWith(ctx, pkt, tos, false, w.writer(pkt))
}

// sendYielding is send for a packet that gives way to every other: it
// waits for a moment when a packet may leave at once and no other is
// waiting for its slot (a CNP train fills the gaps between the run's
// ACKs, which it would otherwise delay more and more as both queue for
// slots).
func (w *wire) sendYielding(ctx context.Context, pkt []byte) (time.Time, error) {
	return w.sendWith(ctx, pkt, 0, true, w.writer(pkt))
}

// writer sends pkt to the peer on the UDP socket.
func (w *wire) writer(pkt []byte) func() error {
	return func() error {
		_, err := w.conn.WriteToUDPAddrPort(pkt, w.peer)
		return err
	}
}

// sendBadUDPChecksum is send with the UDP checksum wrong: the datagram
// is built whole (IPv4, DF, ID 0, as the UDP socket sends it, so the
// ICRC still checks) and sent on a raw socket, which needs CAP_NET_RAW.
func (w *wire) sendBadUDPChecksum(ctx context.Context, pkt []byte) (time.Time, error) {
	if !w.local.Addr().Is4() {
		return time.Time{}, errors.New("probe: a bad UDP checksum is sent over IPv4 only")
	}
	dgram := make([]byte, iphdr.IPv4Len+iphdr.UDPLen+len(pkt))
	ip, u := iphdr.IPv4(dgram), iphdr.UDP(dgram[iphdr.IPv4Len:])
	ip.Encode(&iphdr.IPv4Fields{TotalLength: uint16(len(dgram)), DF: true, TTL: 64, Protocol: iphdr.ProtoUDP,
		Src: w.local.Addr().As4(), Dst: w.peer.Addr().As4()})
	u.Encode(&iphdr.UDPFields{SrcPort: w.local.Port(), DstPort: w.peer.Port(), Length: uint16(iphdr.UDPLen + len(pkt))})
	copy(u[iphdr.UDPLen:], pkt)
	good := inetsum.UDP(ip.Addrs(), u)
	// Wrong, and neither zero ("no checksum") nor the partial sum a
	// local sender's offload leaves, which receivers on the same host
	// accept.
	bad := good ^ 0x00ff
	if bad == 0 || bad == inetsum.UDPPartial(ip.Addrs(), len(u)) {
		bad = good ^ 0x0f0f
	}
	u.SetChecksum(bad)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return time.Time{}, fmt.Errorf("probe: a bad UDP checksum needs a raw socket (CAP_NET_RAW): %w", err)
	}
	defer unix.Close(fd)
	to := &unix.SockaddrInet4{Addr: w.peer.Addr().As4()}
	return w.sendWith(ctx, pkt, 0, false, func() error { return unix.Sendto(fd, dgram, 0, to) })
}

// sleepUntil returns at t, or with ctx's error if it ends first.
func sleepUntil(ctx context.Context, t time.Time) error {
	wait := time.Until(t)
	switch {
	case wait > spinBelow:
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	case wait > 0:
		// A timer this short wakes the goroutine late on a busy host
		// (about 1 ms per ACK was measured under load, late enough for
		// the peer's ACK timer to run out): yield until the time comes.
		return spinUntil(ctx, t)
	}
	return nil
}

// spinUntil returns at t, or with ctx's error if it ends first, keeping
// its CPU busy (yielding to the process's other goroutines) meanwhile.
func spinUntil(ctx context.Context, t time.Time) error {
	for time.Now().Before(t) {
		if err := ctx.Err(); err != nil {
			return err
		}
		runtime.Gosched()
	}
	return nil
}

// sendWith paces one packet, records it, and sends it with write; a
// non-zero tos is set on the socket for this packet only; yield: see
// sendYielding.
func (w *wire) sendWith(ctx context.Context, pkt []byte, tos uint8, yield bool, write func() error) (time.Time, error) {
	// Each packet takes the next slot, a gap after the last one taken,
	// and waits for it holding no lock.
	slot, err := w.takeSlot(ctx, yield)
	if err != nil {
		return time.Time{}, err
	}
	if err := sleepUntil(ctx, slot); err != nil {
		return time.Time{}, err
	}
	w.sendMu.Lock()
	defer w.sendMu.Unlock()
	// Stamped and recorded before it leaves: a fast peer's answer is read
	// (stamped and recorded) before WriteTo returns, and the capture must
	// show the cause before the effect. A failed send ends the run.
	if tos != 0 {
		if err := w.setTOS(tos); err != nil {
			return time.Time{}, fmt.Errorf("probe: setting the IP TOS %#x: %w", tos, err)
		}
		defer w.setTOS(0)
	}
	now := time.Now()
	w.record(transport.Out, now, w.local, w.peer, tos, 0, pkt)
	if err := write(); err != nil {
		return time.Time{}, fmt.Errorf("probe: sending to %v: %w", w.peer, err)
	}
	w.mu.Lock()
	w.last = latest(w.last, now) // a packet that left late pushes the next slot on
	w.mu.Unlock()
	return now, nil
}

// takeSlot returns when the next packet may leave, a gap after the
// slot taken last, and counts it against the budget; yield waits
// (spinning, as sleepUntil) until that is now.
func (w *wire) takeSlot(ctx context.Context, yield bool) (time.Time, error) {
	for {
		w.mu.Lock()
		if w.sent >= w.maxPackets {
			w.mu.Unlock()
			return time.Time{}, ErrBudget
		}
		now := time.Now()
		slot := w.last.Add(w.gap)
		if !yield || !slot.After(now) {
			slot = latest(slot, now)
			w.last = slot
			w.sent++
			w.mu.Unlock()
			return slot, nil
		}
		w.mu.Unlock()
		if err := sleepUntil(ctx, slot); err != nil {
			return time.Time{}, err
		}
	}
}

// latest returns the later of a and b.
func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// record writes pkt to the pcap and keeps its trace record.
func (w *wire) record(dir transport.Dir, at time.Time, src, dst netip.AddrPort, tos uint8, id uint16, pkt []byte) trace.Record {
	local, remote := src, dst
	if dir == transport.In {
		local, remote = dst, src
	}
	if w.pcap != nil {
		w.pcap.Packet(dir, at, local, remote, tos, id, pkt)
	}
	frame, _ := pcaptap.AppendFrame(nil, src, dst, tos, id, pkt)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.frames++
	rec, _ := trace.FromFrame(w.frames, at, layers.LinkTypeEthernet, frame)
	w.recs = append(w.recs, rec)
	return rec
}

// readLoop receives until the socket closes. Packets from anyone but the
// peer, malformed ones and those whose ICRC does not check are counted and
// dropped, as a RoCE device drops them.
func (w *wire) readLoop() {
	defer close(w.done)
	defer close(w.in)
	buf := make([]byte, 65536)
	oob := arrivalOOB()
	for {
		n, oobn, _, from, err := w.conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			return
		}
		at := arrivalTime(oob[:oobn])
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		pkt := append([]byte(nil), buf[:n]...)
		p, perr := bth.Parse(pkt)
		id, ok := w.checkICRC(from, pkt)
		if from.Addr() != w.peer.Addr() || perr != nil || !ok {
			w.mu.Lock()
			w.dropped++
			w.mu.Unlock()
			continue
		}
		if dc := w.toDevice(p.Decode().DestQP); dc != nil {
			w.record(transport.In, at, from, w.local, 0, id, pkt)
			dc.deliver(p, pkt, from, id, at)
			continue
		}
		rec := w.record(transport.In, at, from, w.local, 0, id, pkt)
		select {
		case w.in <- arrival{at: at, hdr: p.Decode(), pkt: pkt, rec: rec}:
		default: // the run reads far less than 1024 packets behind
			w.mu.Lock()
			w.dropped++
			w.mu.Unlock()
		}
	}
}

// stampArrivals asks the kernel to stamp every packet c receives
// (SO_TIMESTAMPNS), for arrivalTime.
func stampArrivals(c *net.UDPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return err
	}
	return serr
}

// arrivalOOB returns a buffer for the control message arrivalTime reads.
func arrivalOOB() []byte { return make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{})))) }

// arrivalTime returns when the kernel received the packet whose control
// messages are oob (SO_TIMESTAMPNS), or now if it did not say.
func arrivalTime(oob []byte) time.Time {
	now := time.Now()
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return now
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(unix.Timespec{})) {
			ts := *(*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
			at := time.Unix(ts.Unix())
			// Keep the monotonic reading (durations against the probe's
			// own send times stay immune to clock steps): now less how
			// long the packet waited in the socket.
			if d := now.Sub(at); d >= 0 {
				return now.Add(-d)
			}
			return now
		}
	}
	return now
}

// checkICRC checks a received packet's ICRC; for IPv4 it recovers the ID
// the sender wrote (a UDP socket does not see it).
func (w *wire) checkICRC(from netip.AddrPort, pkt []byte) (uint16, bool) {
	if len(pkt) < bth.Len+icrc.Len {
		return 0, false
	}
	if from.Addr().Is4() {
		v := icrc.V4{Src: from.Addr().As4(), Dst: w.local.Addr().As4(), SrcPort: from.Port(), DstPort: w.local.Port(), DF: true}
		if id, ok := v.Recover(pkt); ok {
			return id, true
		}
		v.DF = false
		return v.Recover(pkt)
	}
	v := icrc.V6{Src: from.Addr().As16(), Dst: w.local.Addr().As16(), SrcPort: from.Port(), DstPort: w.local.Port()}
	return 0, v.Check(pkt)
}

// records returns a copy of the trace records so far, in time order (the
// reader and the sender record concurrently).
func (w *wire) records() []trace.Record {
	w.mu.Lock()
	out := append([]trace.Record(nil), w.recs...)
	w.mu.Unlock()
	slices.SortStableFunc(out, func(a, b trace.Record) int { return a.Time.Compare(b.Time) })
	return out
}

// sentCount is how many packets the run has sent.
func (w *wire) sentCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent
}
