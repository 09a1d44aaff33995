// Package rxego is a user-space RoCEv2 stack with a verbs-like API: it
// speaks the InfiniBand transport inside UDP datagrams on port 4791,
// wire-compatible with RDMA NICs and with Linux Soft-RoCE (rdma_rxe).
//
// The shapes follow libibverbs: Open a Device on a local address, allocate
// a protection domain, register memory, create completion queues and queue
// pairs, move the QPs through INIT, RTR and RTS, post work requests and
// poll (or wait for) completions.
//
//	dev, _ := rxego.Open("127.0.0.1", nil)
//	pd, _ := dev.AllocPD()
//	mr, _ := pd.RegMR(buf, rxego.AccessLocalWrite|rxego.AccessRemoteWrite)
//	cq, _ := dev.CreateCQ(64)
//	qp, _ := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq, RecvCQ: cq, Caps: ...})
//	_ = rxego.ConnectRC(qp, rxego.RemoteQP{...}, nil)
//	_ = qp.PostSend(rxego.SendWR{Opcode: rxego.WRWrite, ...})
//
// The swapWrite example is this, whole and runnable, as the README shows
// it: both sides connect and write into each other's memory, and each
// calls Device.Sync before reading what the peer wrote.
//
// Waiting: CQ.PollWait blocks until completions arrive or its context
// ends; CQ.Notify gives a channel to wait on in a select beside sockets
// and timers (a completion channel).
//
// Lifecycle: Device.Close moves every QP to the error state, so its
// outstanding work requests complete with WR_FLUSH_ERR, wakes every
// goroutine waiting on the device's CQs, and makes later calls fail with
// ErrClosed (test with errors.Is, as for net.ErrClosed). CQ.Close refuses
// with ErrBusy while a QP uses the CQ, as ibv_destroy_cq does. A post the
// QP's state does not allow fails with qp.ErrInvalidWR.
//
// Addresses: a peer's GID is an IPv4-mapped IPv6 address for an IPv4
// peer (::ffff:a.b.c.d); every address that enters the API (Open,
// ConnectRC, CreateAH, QP.Modify) is normalised to the IPv4 form.
//
// Work requests, completions, QP attributes and their numeric values are
// those of verbs (ibv_wr_opcode, ibv_wc_status, ibv_qp_attr_mask, ...), so
// code and intuition carry over. The engine behind them lives in package
// qp; memory registration in package mr; the UDP transport in package
// transport.
package rxego

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// Types shared with the engine, re-exported so applications need only this
// package.
type (
	// QP is a queue pair.
	QP = qp.QP
	// CQ is a completion queue.
	CQ = qp.CQ
	// SRQ is a shared receive queue.
	SRQ = qp.SRQ
	// MR is a registered memory region.
	MR = mr.MR
	// Access is a set of memory access rights (ibv_access_flags).
	Access = mr.Access
	// MW is a memory window (ibv_mw).
	MW = mr.MW
	// MWType is a memory window's type (ibv_mw_type).
	MWType = mr.MWType
	// MWBind is what a BIND_MW work request binds (ibv_send_wr.bind_mw).
	MWBind = qp.MWBind
	// SendWR is a send work request (ibv_send_wr).
	SendWR = qp.SendWR
	// RecvWR is a receive work request (ibv_recv_wr).
	RecvWR = qp.RecvWR
	// SGE is a scatter/gather element (ibv_sge).
	SGE = qp.SGE
	// WC is a work completion (ibv_wc).
	WC = qp.WC
	// WCStatus is a completion status (ibv_wc_status).
	WCStatus = qp.WCStatus
	// QPAttr is the modifiable state of a QP (ibv_qp_attr).
	QPAttr = qp.Attr
	// AttrMask selects QPAttr fields (ibv_qp_attr_mask).
	AttrMask = qp.AttrMask
	// Caps are a QP's queue sizes (ibv_qp_cap).
	Caps = qp.Caps
	// AH is an address handle for UD sends.
	AH = qp.AH
	// MTU is a path MTU in ibv_mtu encoding.
	MTU = qp.MTU
	// QPType is RC, UC or UD.
	QPType = qp.Type
	// QPState is a QP state.
	QPState = qp.State
)

// Access flags (ibv_access_flags).
const (
	AccessLocalWrite   = mr.LocalWrite
	AccessRemoteWrite  = mr.RemoteWrite
	AccessRemoteRead   = mr.RemoteRead
	AccessRemoteAtomic = mr.RemoteAtomic
	AccessZeroBased    = mr.ZeroBased
	AccessMWBind       = mr.MWBind
)

// Memory window types (ibv_mw_type).
const (
	MWType1 = mr.MWType1
	MWType2 = mr.MWType2
)

// QP types.
const (
	RC = qp.RC
	UC = qp.UC
	UD = qp.UD
)

// Work request opcodes.
const (
	WRWrite       = qp.WRWrite
	WRWriteImm    = qp.WRWriteImm
	WRSend        = qp.WRSend
	WRSendImm     = qp.WRSendImm
	WRRead        = qp.WRRead
	WRCompareSwap = qp.WRCompareSwap
	WRFetchAdd    = qp.WRFetchAdd
	WRLocalInv    = qp.WRLocalInv
	WRBindMW      = qp.WRBindMW
	WRSendInv     = qp.WRSendInv
	WRFlush       = qp.WRFlush
	WRAtomicWrite = qp.WRAtomicWrite
)

// Completion statuses most programs test for; the others are package
// qp's WC* constants (ibv_wc_status values).
const (
	WCSuccess    = qp.WCSuccess
	WCWRFlushErr = qp.WCWRFlushErr
)

// Send flags.
const (
	SendFence     = qp.SendFence
	SendSignaled  = qp.SendSignaled
	SendSolicited = qp.SendSolicited
	SendInline    = qp.SendInline
)

// DefaultPort is RoCEv2's UDP port.
const DefaultPort = transport.Port

// ErrClosed is what calls on a closed Device, and on the PDs, CQs, QPs
// and SRQs it made, return (wrapped or as is; test with errors.Is), as
// net.ErrClosed is for connections. The zero Device counts as closed.
var ErrClosed = qp.ErrClosed

// ErrBusy is what CQ.Close returns while a QP still uses the CQ (verbs:
// EBUSY from ibv_destroy_cq). Destroy the QP first.
var ErrBusy = qp.ErrBusy

// errNotOpen is the zero Device's error.
var errNotOpen = fmt.Errorf("rxego: device not opened (use rxego.Open): %w", ErrClosed)

// Options configure a Device. The zero value is fine.
type Options struct {
	// Transport options for the UDP socket (GSO/GRO, receive mode, ...).
	Transport transport.Options
	// Conn, when set, is used instead of opening a socket: for tests and
	// for impairment shims.
	Conn transport.Conn
	// Window is the most unacknowledged PSNs per QP (default 256).
	Window int
	// DataTOS is the IP TOS of data packets: DSCP<<2 | ECN bits.
	DataTOS uint8
	// Congestion configures DCQCN (reaction point, notification point,
	// pacing); nil means on with NVIDIA's defaults
	// (congestion.NVIDIAParams at qp.DefaultLineRate). Set Off to disable
	// it, or RP to congestion.PaperParams for the DCQCN paper's values.
	Congestion *qp.CongestionConfig
	// BusyPoll, when positive, turns on busy polling: polling one of the
	// device's CQs (CQ.Poll) while it is empty also takes in whatever
	// packets the socket holds, on the polling goroutine, and CQ.PollWait
	// polls so for up to BusyPoll before it blocks. An application that
	// spins on Poll then sees a reply with no wake-up or goroutine switch
	// in between, at the price of a busy CPU. While an application polls,
	// the device's own receive goroutine stands back (it looks again every
	// BusyPoll), so packets wait at most about twice BusyPoll once the
	// application stops polling. Used with the sockets of
	// transport.Listen; ignored for other Conns.
	BusyPoll time.Duration
	// Tap, when set, sees every packet the device sends, receives and
	// drops from the moment it opens: a transport/pcaptap Writer records
	// them as pcapng. Device.SetTap changes it later.
	Tap transport.Tap
}

// Device is one RoCEv2 port: a UDP endpoint on one local address and the
// engine serving its QPs. Methods are safe for concurrent use. Make one
// with Open; the zero Device is closed (its methods return ErrClosed).
type Device struct {
	conn  transport.Conn
	eng   *qp.Engine
	mrs   *mr.Table
	local netip.AddrPort

	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closed    atomic.Bool
	cqMu      sync.Mutex // guards cqs and, with closed, CreateCQ against Close
	cqs       []*qp.CQ   // the CQs Close wakes (closed ones pruned in CreateCQ)
	cqsLive   int        // len(cqs) after the last prune

	sendMu sync.Mutex
	msgs   []transport.Message
	first  []int // index in Emit's pkts of each message's first packet

	// Receiving: see receiveLoop.
	poller   transport.Poller // the Conn's non-blocking receive, if it has one
	rxMu     sync.Mutex       // held while packets from rxMsgs are in the engine
	rxMsgs   []transport.Message
	rxIn     []qp.InPacket
	busy     time.Duration // Options.BusyPoll, with a Poller
	clock    *qp.MonoClock
	lastPoll atomic.Int64 // clock time of the last application poll (busy mode)

	// Blocking mode over a transport.Waker: see readLoop and cqWaiter.
	waker     transport.Waker
	wantRd    atomic.Int32    // goroutines in PollWait waiting for the socket while another reads
	rxReading atomic.Bool     // the receive goroutine holds rxMu
	rxDown    atomic.Bool     // the Conn is closed: PollWait waits on the CQ alone
	handoff   chan struct{}   // a token: the socket is free for a goroutine counted in wantRd
	rdEpoch   atomic.Uint64   // counts application goroutines taking the socket
	ctxDone   <-chan struct{} // see watchCtx (under rxMu)
	ctxStop   func() bool
}

// ParseAddr accepts "IP", "IP:port" or "[IPv6]:port"; the port defaults
// to 4791. An IPv4-mapped address (::ffff:a.b.c.d, the form a RoCE GID
// takes) comes back as the IPv4 address: see Unmap.
func ParseAddr(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return Unmap(ap), nil
	}
	a, err := netip.ParseAddr(strings.Trim(s, "[]"))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("rxego: %q is not an IP address or IP:port", s)
	}
	return Unmap(netip.AddrPortFrom(a, DefaultPort)), nil
}

// Unmap returns ap with an IPv4-mapped address (::ffff:a.b.c.d) turned
// into the IPv4 address. RoCE names an IPv4 peer by such a GID
// (Device.GID returns one), but packets from it arrive from the IPv4
// address: rxego normalises every address where it enters (Open,
// ConnectRC, CreateAH, QP.Modify), so one peer never looks like two.
func Unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// peerAddr is a peer's address as the API takes it in: unmapped, with
// port 4791 when none is given.
func peerAddr(ap netip.AddrPort) netip.AddrPort {
	if ap.Port() == 0 {
		ap = netip.AddrPortFrom(ap.Addr(), DefaultPort)
	}
	return Unmap(ap)
}

// Open starts a device on addr ("127.0.0.1", "[::1]:4791", ...): it binds
// UDP port 4791 (or the given one) on that address and starts the
// engine's receive loop and timers.
func Open(addr string, opts *Options) (*Device, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	local, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	conn := o.Conn
	if conn == nil {
		conn, err = transport.Listen(local, o.Transport)
		if err != nil {
			return nil, fmt.Errorf("rxego: open %v: %w", local, err)
		}
	} else {
		local = Unmap(conn.LocalAddr())
	}
	maxMTU, err := activeMTU(local, o.Conn == nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if o.Tap != nil {
		conn.SetTap(o.Tap)
	}
	d := &Device{conn: conn, mrs: mr.NewTable(), local: local, stop: make(chan struct{}),
		rxMsgs: make([]transport.Message, recvBatch), rxIn: make([]qp.InPacket, 0, recvBatch)}
	clock := qp.NewMonoClock()
	d.clock = clock
	if p, ok := conn.(transport.Poller); ok && o.BusyPoll > 0 {
		d.poller = p
		d.busy = o.BusyPoll
	} else if w, ok := conn.(transport.Waker); ok {
		d.waker = w
		d.handoff = make(chan struct{}, 1)
	}
	d.eng, err = qp.NewEngine(qp.Config{
		Local: local.Addr(), Port: local.Port(), Clock: clock, Out: (*deviceOut)(d), MRs: d.mrs,
		Window: o.Window, DataTOS: o.DataTOS, Congestion: o.Congestion, MaxMTU: maxMTU,
	})
	if err != nil {
		conn.Close()
		return nil, err
	}
	d.wg.Add(2)
	go func() { defer d.wg.Done(); d.receiveLoop() }()
	go func() { defer d.wg.Done(); d.eng.RunTimers(d.stop) }()
	return d, nil
}

// activeMTU is the port's active MTU: the largest path MTU whose packets
// fit the MTU of the interface holding the device's address, as rxe takes
// it from its netdev (1500 gives 1024, loopback's 65536 gives 4096). A
// device on the unspecified address, or on a Conn it was given, has no one
// interface: 0, which the engine reads as 4096.
func activeMTU(local netip.AddrPort, own bool) (qp.MTU, error) {
	if !own || local.Addr().IsUnspecified() {
		return 0, nil
	}
	n, err := transport.InterfaceMTU(local.Addr())
	if err != nil {
		return 0, fmt.Errorf("rxego: open %v: %w", local, err)
	}
	m := qp.ActiveMTU(n)
	if m == 0 {
		return 0, fmt.Errorf("rxego: open %v: interface MTU %d is below the smallest RoCE MTU (256 + 80 bytes)", local, n)
	}
	return m, nil
}

// ActiveMTU returns the port's active MTU (ibv_port_attr.active_mtu): the
// largest path MTU the interface the device sends on carries. Modifying a
// QP to a larger path MTU fails, as packets that long would never leave.
func (d *Device) ActiveMTU() MTU { return d.eng.MaxMTU() }

// deviceOut adapts the device's Conn to the engine's Output.
type deviceOut Device

// Emit sends the engine's packets in one batch. Runs of packets the engine
// built back to back in memory, to the same peer with the same TOS, of
// equal length (the last may be shorter), go out as one GSO message each:
// a multi-packet message crosses the kernel in a few large datagrams, and
// the transport still writes every segment's ICRC for the IP ID it will
// carry.
func (o *deviceOut) Emit(pkts []qp.OutPacket) {
	d := (*Device)(o)
	d.sendMu.Lock()
	defer d.sendMu.Unlock()
	msgs, first := d.msgs[:0], d.first[:0]
	for i := 0; i < len(pkts); {
		k := runLen(pkts[i:], transport.MaxSegments)
		p := &pkts[i]
		m := transport.Message{Buf: p.Buf, Peer: p.Dest, TOS: p.TOS}
		if k > 1 {
			n := 0
			for _, q := range pkts[i : i+k] {
				n += len(q.Buf)
			}
			m.Buf, m.Seg = p.Buf[:n], len(p.Buf)
		}
		msgs, first = append(msgs, m), append(first, i)
		i += k
	}
	d.msgs, d.first = msgs, first // keep the grown arrays for the next call
	for off := 0; off < len(msgs); {
		n, err := d.conn.Send(msgs[off:])
		if err != nil {
			d.eng.Stats.SendErr.Add(1)
			if j := off + n; j < len(msgs) && transport.Unsendable(err) {
				// Longer than the interface carries: resending cannot
				// help, so the work request fails (qp.Engine.SendFailed).
				d.eng.SendFailed(&pkts[first[j]])
			}
			// Otherwise the packet is lost as if the network dropped it;
			// the transport's retransmission recovers, as on a real link.
			n++
		}
		off += n
	}
	clear(d.msgs) // do not keep the engine's buffers alive
}

// maxRunBytes is the most bytes of RoCE packets one GSO datagram carries:
// the largest UDP payload over IPv4 (IPv6 allows a few bytes more).
const maxRunBytes = 65535 - 20 - 8

// runLen returns how many packets from pkts[0] form one GSO run, at most
// limit: each packet starts where the one before it ends in memory (the
// engine builds them back to back in one slab), all go to the same peer
// with the same TOS, all but the last have pkts[0]'s length and the last
// is not longer, and together they fit one UDP datagram.
func runLen(pkts []qp.OutPacket, limit int) int {
	first := &pkts[0]
	seg, total := len(first.Buf), len(first.Buf)
	k := 1
	for ; k < len(pkts) && k < limit; k++ {
		prev, p := &pkts[k-1], &pkts[k]
		if len(prev.Buf) != seg || len(p.Buf) == 0 || len(p.Buf) > seg ||
			p.Dest != first.Dest || p.TOS != first.TOS ||
			total+len(p.Buf) > maxRunBytes || !adjacent(prev.Buf, p.Buf) {
			break
		}
		total += len(p.Buf)
	}
	return k
}

// adjacent reports whether b starts right where a ends, inside a's
// capacity (see qp.Output), so a[:len(a)+len(b)] covers both.
func adjacent(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 || cap(a) < len(a)+len(b) {
		return false
	}
	return &a[:len(a)+1][len(a)] == &b[0]
}

// recvBatch is the most packets the receive loop hands the engine at once:
// a few GRO datagrams' worth. The engine answers each batch with at most
// one coalesced ACK per QP, so larger batches mean fewer ACKs.
const recvBatch = 256

// receiveLoop takes in packets until the device closes.
//
// In busy-poll mode the loop waits for the socket to become readable and
// then takes its packets in without blocking, under rxMu, so that an
// application polling a CQ can take them in too (pollOnce); views into the
// transport's buffers are only ever in use under rxMu. Otherwise it reads
// with blocking Recv, which makes one system call per wake-up fewer: a
// recvmmsg that finds nothing parks the goroutine, and the next one after
// the wake-up reads.
func (d *Device) receiveLoop() {
	if d.busy > 0 {
		d.pollLoop()
		return
	}
	if d.waker != nil {
		d.readLoop()
		return
	}
	for {
		n, err := d.conn.Recv(d.rxMsgs)
		if err != nil {
			if d.closing(err) {
				return
			}
			continue
		}
		d.input(n)
	}
}

// closing reports whether a receive error means the device is closing.
func (d *Device) closing(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return true
	}
	select {
	case <-d.stop:
		return true
	default:
		return false
	}
}

// input hands the n packets in rxMsgs to the engine.
func (d *Device) input(n int) { d.inputWith(n, d.eng.InputWoke) }

// inputWith hands the n packets in rxMsgs to the engine through input
// and returns what input does.
func (d *Device) inputWith(n int, input func([]qp.InPacket) bool) bool {
	in := d.rxIn[:0]
	for i := range d.rxMsgs[:n] {
		m := &d.rxMsgs[i]
		p, err := bth.Parse(m.Buf)
		if err != nil {
			continue // the transport already counted and dropped these
		}
		in = append(in, qp.InPacket{Pkt: p, Src: m.Peer, TOS: m.TOS, Dest: d.local.Addr()})
	}
	r := input(in)
	clear(in) // no references into the transport's buffers
	clear(d.rxMsgs[:n])
	return r
}

// receiveOnce takes in what the socket holds, without blocking.
func (d *Device) receiveOnce() (int, error) {
	d.rxMu.Lock()
	defer d.rxMu.Unlock()
	n, err := d.poller.TryRecv(d.rxMsgs)
	if n > 0 {
		d.input(n)
	}
	return n, err
}

// pollLoop is the receive loop over a transport.Poller.
func (d *Device) pollLoop() {
	for {
		n, err := d.receiveOnce()
		if err != nil && d.closing(err) {
			return
		}
		if n > 0 || err != nil {
			continue
		}
		d.eng.FlushAcks() // held for a poller that has stopped polling
		if d.busy > 0 && d.clock.Now()-time.Duration(d.lastPoll.Load()) < d.busy {
			// An application is polling and takes the packets in itself:
			// stand back rather than be woken for every packet.
			time.Sleep(d.busy)
			continue
		}
		if err := d.poller.WaitReadable(); err != nil && d.closing(err) {
			return
		}
	}
}

// pollOnce is a busy-polling CQ's poller: it takes in what the socket
// holds on the polling goroutine, unless another goroutine is at it.
func (d *Device) pollOnce() {
	if !d.rxMu.TryLock() {
		return
	}
	defer d.rxMu.Unlock()
	d.lastPoll.Store(int64(d.clock.Now()))
	if n, _ := d.poller.TryRecv(d.rxMsgs); n > 0 {
		d.inputWith(n, d.eng.InputPolled)
	} else {
		d.eng.FlushAcks() // the poller did not answer what it took in last time
	}
}

// The receive goroutine looks whether application goroutines have
// stopped reading the socket checkMin after it handed the socket over,
// then at intervals doubling up to checkMax: a socket an application
// stopped reading waits at most about twice that. The check runs on the
// receive goroutine's own timer: resetting a timer at every PollWait
// would wake the runtime's network poller each time, the very cost that
// reading on the application's goroutine saves.
const (
	checkMin = time.Millisecond
	checkMax = 4 * time.Millisecond
)

// readLoop is the receive loop of a blocking-mode device over a
// transport.Waker.
//
// Whoever holds rxMu reads the socket: this goroutine, or an application
// goroutine blocked in PollWait on one of the device's CQs (cqWaiter).
// When the application reads, the packet that completes its work wakes
// the goroutine that wants it straight from the runtime's network poller:
// no hand-off between goroutines, which on a two-CPU machine cost two
// futex calls and a goroutine switch per message. Packets for other QPs
// and CQs go into the engine all the same.
//
// The receive goroutine reads only while no application goroutine waits:
// one that comes to PollWait while it reads wakes it, and it hands the
// socket over (release). An application goroutine that stops reading
// hands it to another waiting one, if any; otherwise the receive
// goroutine takes it back once it finds it unread, and not taken by an
// application goroutine, for a whole check period.
func (d *Device) readLoop() {
	t := time.NewTimer(checkMin)
	defer t.Stop()
	period, seen := checkMin/2, d.rdEpoch.Load()
	for {
		period = min(2*period, checkMax)
		if d.wantRd.Load() == 0 && d.rxMu.TryLock() {
			if d.rdEpoch.Load() != seen {
				d.release() // taken and left again lately: likely back soon (a goroutine that came meanwhile gets the socket)
			} else {
				// Unread for a whole period: take it back.
				d.rxReading.Store(true)
				d.eng.FlushAcks() // held for an answer that did not come
				err := d.serve()
				d.rxReading.Store(false)
				d.release()
				if err != nil {
					return
				}
				period = checkMin
			}
		}
		seen = d.rdEpoch.Load()
		t.Reset(period)
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
	}
}

// serve reads for the receive goroutine, with rxMu held, until an
// application goroutine wants the socket (nil) or the device closes.
func (d *Device) serve() error {
	for {
		seq := d.waker.WakeSeq()
		if d.wantRd.Load() > 0 {
			return nil
		}
		n, err := d.waker.RecvWait(d.rxMsgs, seq, time.Time{})
		if err != nil {
			if d.closing(err) {
				d.rxDown.Store(true)
				return err
			}
			continue
		}
		if n > 0 {
			d.input(n)
		}
	}
}

// release gives up the socket (rxMu), to an application goroutine that
// waits for it if there is one.
func (d *Device) release() {
	d.rxMu.Unlock()
	if d.wantRd.Load() > 0 {
		select {
		case d.handoff <- struct{}{}:
		default:
		}
	}
}

// cqWaiter is the qp.Waiter of a blocking-mode device's CQs: PollWait on
// an empty CQ reads the socket on the caller's goroutine (readLoop).
type cqWaiter Device

// WaitCQ implements qp.Waiter.
func (w *cqWaiter) WaitCQ(ctx context.Context, cq *qp.CQ) error {
	d := (*Device)(w)
	if d.rxDown.Load() {
		return cq.Wait(ctx)
	}
	if !d.rxMu.TryLock() {
		// Another goroutine reads. Say so, then look again: either this
		// goroutine then finds the socket free or whoever releases it
		// sees wantRd and hands it over.
		d.wantRd.Add(1)
		if !d.rxMu.TryLock() {
			if d.rxReading.Load() {
				d.waker.Wake() // the receive goroutine: it hands over
			}
			err := cq.WaitOr(ctx, d.handoff)
			d.wantRd.Add(-1)
			return err
		}
		d.wantRd.Add(-1)
	}
	d.rdEpoch.Add(1)
	defer d.release()
	return d.readFor(ctx, cq)
}

// Wake implements qp.Waiter.
func (w *cqWaiter) Wake() { w.waker.Wake() }

// readFor reads the socket, with rxMu held, until cq may hold
// completions or ctx is done. The ACKs for what it takes in wait for the
// caller's answer, as in busy polling (qp.Engine.InputPolled): a
// ping-pong's reply and ACK then leave in one datagram (one system call
// per hop; 57-66 to 36-38 us p50 on an idle 2-core VM). They go out
// before the reader blocks again, at the caller's next PostSend or
// Modify, or after ackHold (1 ms) at the latest.
func (d *Device) readFor(ctx context.Context, cq *qp.CQ) error {
	d.watchCtx(ctx)
	for {
		seq := d.waker.WakeSeq()
		if !cq.Watch() {
			return nil
		}
		d.eng.FlushAcks() // nothing to answer yet: the held ACKs go now
		if err := ctx.Err(); err != nil {
			cq.Unwatch()
			return err
		}
		n, err := d.waker.RecvWait(d.rxMsgs, seq, time.Time{})
		cq.Unwatch()
		if n > 0 {
			d.inputWith(n, d.eng.InputPolled)
		} else if err != nil && d.closing(err) {
			d.rxDown.Store(true)
			return nil // PollWait waits on the CQ from now on
		}
	}
}

// watchCtx makes ctx's end wake the socket's reader. The registration
// (context.AfterFunc, which allocates) is kept for the next wait and
// made again only for a context with another Done channel: a loop
// calling PollWait with one context registers once. rxMu is held.
func (d *Device) watchCtx(ctx context.Context) {
	done := ctx.Done()
	if done == nil || done == d.ctxDone {
		return
	}
	if d.ctxStop != nil {
		d.ctxStop()
	}
	d.ctxDone, d.ctxStop = done, context.AfterFunc(ctx, d.waker.Wake)
}

// Close stops the device, as closing an RDMA device context tears down
// what was made on it. Every QP moves to the error state: its outstanding
// work requests complete with WR_FLUSH_ERR on its CQs, and the QP is
// destroyed. Every CQ closes: a goroutine waiting in PollWait (or on
// Notify's channel) wakes and polls the flushed completions, and then
// gets ErrClosed. ACKs the engine still holds go out first. Later calls
// on the device and on what it made (AllocPD, CreateCQ, RegMR, CreateQP,
// PostSend, ...) fail with an error errors.Is matches with ErrClosed.
// Registered memory stays the application's. A second Close returns
// nil; Close of the zero Device returns an error wrapping ErrClosed.
func (d *Device) Close() error {
	if d.eng == nil {
		return errNotOpen
	}
	var err error
	d.closeOnce.Do(func() {
		d.cqMu.Lock()
		d.closed.Store(true)
		cqs := d.cqs
		d.cqs = nil
		d.cqMu.Unlock()
		// The engine sends the ACKs it still holds (for a reply that will
		// not come now: the peer would otherwise retransmit to a closed
		// port and, with retry_cnt 7, wait forever), then flushes and
		// destroys every QP, which leaves the CQs unused.
		d.eng.Close()
		close(d.stop)
		err = d.conn.Close()
		for _, cq := range cqs {
			cq.Close() // ErrClosed for one the application closed: fine
		}
		d.wg.Wait()
		if d.waker != nil {
			d.rxMu.Lock()
			if d.ctxStop != nil {
				d.ctxStop()
			}
			d.rxMu.Unlock()
		}
	})
	return err
}

// check returns ErrClosed (wrapped for the zero Device) once the device
// is closed.
func (d *Device) check() error {
	if d == nil || d.eng == nil {
		return errNotOpen
	}
	if d.closed.Load() {
		return ErrClosed
	}
	return nil
}

// Addr returns the device's address and UDP port: its GID, as an IP
// address, is Addr().Addr().
func (d *Device) Addr() netip.AddrPort { return d.local }

// GID returns the device's GID: the IPv4-mapped (::ffff:a.b.c.d) or IPv6
// address, as rxe shows it in its GID table.
func (d *Device) GID() [16]byte { return d.local.Addr().As16() }

// Engine returns the device's engine, for statistics and advanced use.
func (d *Device) Engine() *qp.Engine { return d.eng }

// Transport returns the device's UDP transport, for statistics and taps.
func (d *Device) Transport() transport.Conn { return d.conn }

// Sync waits until the engine has finished what it was doing. It orders
// registered memory between the application and the engine under Go's
// memory model, in both directions: after Sync, the application sees
// what peers wrote through this device; bytes the application wrote before
// Sync are what peers will read. It is needed only where the application
// learns of a peer's access by a path Go cannot see (the peer's own
// completion, a message over another socket); a completion polled from
// this device's CQs already orders memory.
func (d *Device) Sync() {
	if d.eng != nil {
		d.eng.Sync()
	}
}

// CreateCQ makes a completion queue of the given depth. Close it (after
// destroying the QPs that use it) when done; Device.Close closes it too.
func (d *Device) CreateCQ(depth int) (*CQ, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	cq, err := qp.NewCQ(depth)
	if err != nil {
		return nil, err
	}
	if d.busy > 0 {
		cq.SetPoller(d.pollOnce, d.busy)
	} else if d.waker != nil {
		cq.SetWaiter((*cqWaiter)(d))
	}
	d.cqMu.Lock()
	defer d.cqMu.Unlock()
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if len(d.cqs) >= 2*d.cqsLive+16 {
		// Forget the CQs the application closed; amortised over the
		// CreateCQ calls since the last time, this costs O(1) each.
		live := d.cqs[:0]
		for _, c := range d.cqs {
			if !c.Closed() {
				live = append(live, c)
			}
		}
		clear(d.cqs[len(live):])
		d.cqs, d.cqsLive = live, len(live)
	}
	d.cqs = append(d.cqs, cq)
	return cq, nil
}

// PD is a protection domain.
type PD struct {
	dev *Device
	pd  *mr.PD
}

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (*PD, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	return &PD{dev: d, pd: d.mrs.AllocPD()}, nil
}

// check returns the error of the PD's device (ErrClosed once closed).
func (p *PD) check() error {
	if p == nil || p.pd == nil {
		return errNotOpen
	}
	return p.dev.check()
}

// Dealloc frees the PD; it fails while MRs are registered in it. It works
// after the device closed, to release what the application still holds.
func (p *PD) Dealloc() error {
	if p == nil || p.pd == nil {
		return errNotOpen
	}
	return p.pd.Dealloc()
}

// RegMR registers buf for access: its lkey and rkey name it in work
// requests and in peers' RDMA operations. The MR's IOVA (the address peers
// use) is the buffer's real address unless AccessZeroBased is given.
func (p *PD) RegMR(buf []byte, access Access) (*MR, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	return p.pd.Register(buf, access)
}

// RegMRInvalidatable registers buf so that SEND with Invalidate and
// LOCAL_INV may invalidate it.
func (p *PD) RegMRInvalidatable(buf []byte, access Access) (*MR, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	return p.pd.Register(buf, access, mr.WithInvalidate())
}

// AllocMW allocates an unbound memory window (ibv_alloc_mw). Bind a type
// 1 window with QP.BindMW (ibv_bind_mw), a type 2 window with a WRBindMW
// work request; LOCAL_INV or a peer's SEND with Invalidate on its rkey
// unbinds a type 2 window. Windows reach MRs registered with AccessMWBind.
func (p *PD) AllocMW(typ MWType) (*MW, error) { return p.pd.AllocMW(typ) }

// QPInitAttr describes a QP to create.
type QPInitAttr struct {
	Type   QPType
	SendCQ *CQ
	RecvCQ *CQ
	SRQ    *SRQ
	Caps   Caps
	SigAll bool
	// QPN asks for a specific QP number, e.g. 1 for the GSI QP a
	// connection manager sends its MADs on; 0 lets the device pick one.
	QPN uint32
}

// CreateQP makes a QP in the RESET state.
func (p *PD) CreateQP(a QPInitAttr) (*QP, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	return p.dev.eng.Create(qp.InitAttr{Type: a.Type, PD: p.pd, SendCQ: a.SendCQ, RecvCQ: a.RecvCQ, SRQ: a.SRQ, Caps: a.Caps,
		SigAll: a.SigAll, QPN: a.QPN})
}

// CreateSRQ makes a shared receive queue.
func (p *PD) CreateSRQ(depth, maxSGE int) (*SRQ, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	return p.dev.eng.NewSRQ(p.pd, depth, maxSGE)
}

// CreateAH makes an address handle for UD sends to dest (port 4791 when 0).
func (p *PD) CreateAH(dest netip.AddrPort) (*AH, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	if !dest.Addr().IsValid() {
		return nil, errors.New("rxego: address handle needs a destination address")
	}
	return &AH{Dest: peerAddr(dest)}, nil
}
