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
//	_ = qp.Connect(rxego.RemoteQP{...}, nil)
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
// QP's state does not allow fails with ErrInvalidWR.
//
// Addresses: a peer's GID is an IPv4-mapped IPv6 address for an IPv4
// peer (::ffff:a.b.c.d); every address that enters the API (Open,
// QP.Connect, CreateAH, QP.Modify) is normalised to the IPv4 form.
// A device may serve several GIDs (Options.GIDs, Device.QueryGID): a
// connection's or AH's source GID is chosen by RemoteQP.SGIDIndex or
// PD.CreateAHFrom, as ibv_ah_attr's sgid_index.
//
// Work requests, completions, QP states, attribute masks, statuses and
// their numeric values are those of verbs (ibv_wr_opcode, ibv_wc_status,
// ibv_qp_attr_mask, ...), so code and intuition carry over; all of them,
// and the errors (ErrInvalidWR, ErrQueueFull, ErrInvalidModify,
// ErrCQOverrun, ...), are in this package: a verbs program needs no
// other. Every error a call returns reads "rxego: ...". The engine behind
// them lives in package qp; memory registration in package mr; the UDP
// transport in package transport; what lies between the sockets and the
// engines in internal/device. A device spreads its QPs over shards, one
// engine, socket and receive loop each (Options.Shards); CQs, SRQs, PDs
// and MRs are device-wide.
package rxego

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxego/rxego/internal/device"
	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// Types shared with the engine, re-exported so applications need only this
// package.
type (
	// Access is a set of memory access rights (ibv_access_flags).
	Access = mr.Access
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
	// QPState is a QP state (ibv_qp_state): StateReset, StateInit, ...
	QPState = qp.State
	// WROpcode is a send work request's opcode (ibv_wr_opcode): WRWrite, ...
	WROpcode = qp.WROpcode
	// WCOpcode is a completion's opcode (ibv_wc_opcode): WCSend, ...
	WCOpcode = qp.WCOpcode
	// SendFlags are a send work request's flags (ibv_send_flags).
	SendFlags = qp.SendFlags
	// WCFlags are a completion's flags (ibv_wc_flags).
	WCFlags = qp.WCFlags
	// DropReason says why a device dropped a received packet (Stats.Drops).
	DropReason = qp.DropReason
	// CongestionConfig configures DCQCN (Options.Congestion).
	CongestionConfig = qp.CongestionConfig
	// CCStats are a QP's DCQCN figures (QP.CongestionStats).
	CCStats = qp.CCStats
)

// DefaultPort is RoCEv2's UDP port.
const DefaultPort = transport.Port

// errNotOpen is the zero Device's error.
var errNotOpen = fmt.Errorf("rxego: device not opened (use rxego.Open): %w", ErrClosed)

// Options configure a Device. The zero value is fine.
type Options struct {
	// Transport options for the UDP socket (GSO/GRO, receive mode, ...).
	Transport transport.Options
	// Conn, when set, is used instead of opening a socket: for tests and
	// for impairment shims. Every shard then sends and receives through
	// it (its packets reach their QP's shard from the one receive loop).
	Conn transport.Conn
	// Shards is how many shards the device spreads its QPs over: each has
	// its own engine (lock, timers, send path) and, on the sockets Open
	// makes, its own socket in an SO_REUSEPORT group whose BPF program
	// steers every received packet to its QP's shard (its QP number's
	// block of 16, mod Shards: a shard's QPs take consecutive numbers of
	// its blocks, the shards in turn). 0 means one per CPU
	// (runtime.NumCPU), at most MaxShards, but one on a machine of two
	// CPUs or fewer; one with BusyPoll; the raw receive mode
	// (transport.RecvRaw) always has one. A blocked CQ.PollWait reads its
	// CQ's first shard itself; completions of QPs on other shards reach
	// it through their shards' receive goroutines, a wake-up each time it
	// waits; so many QPs on one CQ may do better with fewer shards on any
	// machine (10,000 QPs on one CQ: 1.34x with one shard on two CPUs,
	// bench/RESULTS.md, session 19).
	Shards int
	// SourcePorts is how many UDP source ports each shard sends from, in
	// 0xC000-0xFFFF as rxe and RNICs do, so that ECMP fabrics and the
	// receiving host's RSS spread QPs: every packet of a QP leaves from
	// the port its peer's QP number hashes to (transport.FlowHash). 0
	// means DefaultSourcePorts, except on a loopback address (127.0.0.0/8,
	// ::1), where nothing would spread and everything is sent from the
	// device's own port; negative sends everything from the device's own
	// port (4791). Ignored with Conn.
	SourcePorts int
	// Window is the most unacknowledged PSNs per QP (default 256).
	Window int
	// RetryStallTime bounds retransmissions without progress on a QP
	// whose retry_cnt is 7, which rxe retries for ever: after more than
	// 64 of them, the first at least this long ago, the oldest WR fails
	// with RETRY_EXC_ERR (docs/rnic.md). 0 means qp.DefaultStallTime
	// (10 s); negative means never, rxe's rule.
	RetryStallTime time.Duration
	// DataTOS is the IP TOS of data packets: DSCP<<2 | ECN bits.
	DataTOS uint8
	// Congestion configures DCQCN (reaction point, notification point,
	// pacing); nil means on with NVIDIA's defaults
	// (congestion.NVIDIAParams at qp.DefaultLineRate). Set Off to disable
	// it, or RP to congestion.PaperParams for the DCQCN paper's values.
	Congestion *CongestionConfig
	// BusyPoll, when positive, turns on busy polling: polling one of the
	// device's CQs (CQ.Poll) while it is empty also takes in whatever
	// packets the socket holds, on the polling goroutine, and CQ.PollWait
	// polls so for up to BusyPoll before it blocks. An application that
	// spins on Poll then sees a reply with no wake-up or goroutine switch
	// in between, at the price of a busy CPU. While an application polls,
	// the device's own receive goroutine stands back and reads nothing
	// (the poller takes in every QP's packets); it takes the socket back
	// once the last poll is BusyPoll old, so packets wait at most about
	// BusyPoll once the application stops polling. Used with the sockets of
	// transport.Listen; ignored for other Conns.
	BusyPoll time.Duration
	// ZeroCopy, when set, sends the payloads of RC WRITEs, SENDs and READ
	// responses of 512 bytes or more from registered memory with
	// scatter-gather I/O instead of copying them into the packet (sockets
	// of transport.Listen and pipes; other Conns get whole packets).
	// Off by default: on the 2-CPU development machine it made 64 KiB
	// WRITEs at MTU 4096 about 1.05x faster but SENDs and READs
	// 0.72-0.91x and MTU 1024 slower (bench/RESULTS.md, session 8); the
	// kernel's walk of three iovecs per packet costs more there than the
	// copy it saves. Memory a READ response is sent from must not change
	// until the response has left, or the peer drops it on its ICRC and
	// asks again.
	ZeroCopy bool
	// GIDs are further addresses the device serves besides Open's, each
	// a GID table entry with its own socket group: Open's address is index
	// 0, GIDs[i] index i+1 (see Device.QueryGID and docs/rnic.md for how
	// this compares with rxe's table). Not allowed with Conn.
	GIDs []string
	// Tap, when set, sees every packet the device sends, receives and
	// drops from the moment it opens: a transport/pcaptap Writer records
	// them as pcapng. Device.SetTap changes it later.
	Tap Tap
}

// DefaultSourcePorts is how many source ports a shard sends from by
// default: a connection's packets keep one port, and eight per shard are
// enough entropy for a fabric's hash without a socket per QP.
const DefaultSourcePorts = device.DefaultSourcePorts

// MaxShards is the most shards a device has by default. More rarely pay:
// each shard costs a socket, two goroutines and an engine.
const MaxShards = 16

// Device is one RoCEv2 port: a UDP endpoint on one local address and the
// engines serving its QPs. Methods are safe for concurrent use. Make one
// with Open; the zero Device is closed (its methods return ErrClosed).
type Device struct {
	dev   *device.Device // shards, receive loops, routes, multicast input
	mrs   *mr.Table
	local netip.AddrPort
	gids  []netip.AddrPort // the GID table: local first (gid.go)

	closeOnce sync.Once
	closed    atomic.Bool
	cqMu      sync.Mutex // guards cqs and, with closed, CreateCQ against Close
	cqs       []*qp.CQ   // the CQs Close wakes (closed ones pruned in CreateCQ)
	cqsLive   int        // len(cqs) after the last prune
	qps       sync.Map   // *qp.QP -> *QP: the facade of each live QP
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
// QP.Connect, CreateAH, QP.Modify), so one peer never looks like two.
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

// shardCount is how many shards o asks for.
func (o *Options) shardCount() (int, error) {
	n := o.Shards
	switch {
	case n < 0 || n > transport.MaxGroup:
		return 0, fmt.Errorf("rxego: %d shards (0..%d)", n, transport.MaxGroup)
	case o.Transport.Mode == transport.RecvRaw:
		return 1, nil // the raw socket sees every packet: nothing to steer
	case n == 0 && o.BusyPoll > 0:
		// Busy polling serves the latency of a few QPs: one shard, so
		// that polling an empty CQ costs one non-blocking recvmmsg, not
		// one per shard (docs/performance.md, fourth round).
		return 1, nil
	case n == 0:
		return defaultShards(runtime.NumCPU()), nil
	}
	return n, nil
}

// defaultShards is how many shards a device has on a machine of cpus
// CPUs when Options.Shards is 0: one per CPU, at most MaxShards, but one
// where there are two CPUs or fewer. There the application's goroutines
// (posting, polling) and one shard's receive loop already fill the CPUs,
// and a second shard splits the same work over more wake-ups and
// sockets. On the two-CPU development machine (bench/RESULTS.md,
// session 19) one shard per device moved SENDs over 8 and 16 QPs
// 0.96-1.27x what two did (most rows 1.07-1.27x), the blocking 64-byte
// rate over 8 QPs 1.07-1.17x and 10,000 QPs on one CQ 1.34x, with WRITEs
// and READs over many QPs at 0.91-1.12x, inside the sittings' spread.
func defaultShards(cpus int) int {
	if cpus <= 2 {
		return 1
	}
	return min(cpus, MaxShards)
}

// Open starts a device on addr ("127.0.0.1", "[::1]:4791", ...): it binds
// UDP port 4791 (or the given one) on that address and starts the
// engines' receive loops and timers.
func Open(addr string, opts *Options) (*Device, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	local, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	n, err := o.shardCount()
	if err != nil {
		return nil, err
	}
	gids, err := gidTable(local, o.GIDs, o.Conn != nil)
	if err != nil {
		return nil, err
	}
	mrs := mr.NewTable()
	d := &Device{mrs: mrs} // the QPs' Destroyed hook forgets them here
	dev, err := device.Open(device.Config{GIDs: gids, Shards: n, Transport: o.Transport, Conn: o.Conn,
		SourcePorts: o.SourcePorts, Window: o.Window, StallTime: o.RetryStallTime, DataTOS: o.DataTOS, Congestion: o.Congestion,
		BusyPoll: o.BusyPoll, ZeroCopy: o.ZeroCopy, Tap: o.Tap, MRs: mrs, Destroyed: func(q *qp.QP) { d.qps.Delete(q) }})
	if err != nil {
		return nil, err
	}
	d.dev, d.local, d.gids = dev, dev.Local(), dev.GIDs()
	return d, nil
}

// ActiveMTU returns the port's active MTU (ibv_port_attr.active_mtu): the
// largest path MTU the interface the device sends on carries. Modifying a
// QP to a larger path MTU fails, as packets that long would never leave.
func (d *Device) ActiveMTU() MTU {
	if d.dev == nil {
		return 0
	}
	return d.dev.MaxMTU()
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
// ErrClosed, as os.File's does (and CQ.Close, QP.Destroy, MR.Deregister,
// PD.Dealloc, MW.Dealloc, SRQ.Destroy); Close of the zero Device returns
// an error wrapping ErrClosed.
func (d *Device) Close() error {
	if d.dev == nil {
		return errNotOpen
	}
	err := ErrClosed // unless this call is the one that closes
	d.closeOnce.Do(func() {
		err = nil
		d.cqMu.Lock()
		d.closed.Store(true)
		cqs := d.cqs
		d.cqs = nil
		d.cqMu.Unlock()
		err = d.dev.Stop()
		for _, cq := range cqs {
			cq.Close() // ErrClosed for one the application closed: fine
		}
		d.dev.Wait()
		d.qps.Clear()
	})
	return err
}

// check returns ErrClosed (wrapped for the zero Device) once the device
// is closed.
func (d *Device) check() error {
	if d == nil || d.dev == nil {
		return errNotOpen
	}
	if d.closed.Load() {
		return ErrClosed
	}
	return nil
}

// Addr returns the device's address and UDP port, its GID of index 0:
// the GID, as an IP address, is Addr().Addr(). GIDs lists them all.
func (d *Device) Addr() netip.AddrPort { return d.local }

// GID returns the device's GID of index 0 (Open's address): the
// IPv4-mapped (::ffff:a.b.c.d) or IPv6 address, as rxe shows it in its GID
// table. QueryGID reads the others.
func (d *Device) GID() [16]byte { return d.local.Addr().As16() }

// Shards returns how many shards the device spreads its QPs over.
func (d *Device) Shards() int {
	if d.dev == nil {
		return 0
	}
	return d.dev.Shards()
}

// QPs returns the device's QPs, in no particular order.
func (d *Device) QPs() []*QP {
	if d.dev == nil {
		return nil
	}
	var out []*QP
	for _, q := range d.dev.QPs() {
		if v, ok := d.qps.Load(q); ok {
			out = append(out, v.(*QP))
		}
	}
	return out
}

// Batch runs fn and sends the packets the PostSend calls inside it make
// together when it returns, on every shard: posts to
// many QPs leave in a few system calls and GSO runs. Where GOMAXPROCS is
// 4 or more, each shard a post went to builds and sends its packets on a
// goroutine of its own, as an RNIC's send engines work behind one
// doorbell, so one goroutine posting to QPs of many shards uses as many
// CPUs; Batch returns once every shard has sent.
func (d *Device) Batch(fn func()) {
	if d.dev == nil {
		fn()
		return
	}
	d.dev.Batch(fn)
}

// Transport returns the device's UDP transport, for statistics and taps:
// its Stats sum the shards' sockets, SetTap reaches them all.
func (d *Device) Transport() Transport {
	if d == nil || d.dev == nil {
		return nil // the zero Device has none
	}
	return (*deviceTransport)(d)
}

// Transport is the view of a device's transport that Device.Transport
// gives.
type Transport interface {
	// Stats returns the sum of the counters of the device's Conns, the
	// sockets of the multicast groups it has joined included.
	Stats() transport.Stats
	// SetTap is Device.SetTap.
	SetTap(Tap)
	// LocalAddr is Device.Addr.
	LocalAddr() netip.AddrPort
}

type deviceTransport Device

func (t *deviceTransport) Stats() transport.Stats { return t.dev.TransportStats() }

func (t *deviceTransport) SetTap(tap Tap) { (*Device)(t).SetTap(tap) }

func (t *deviceTransport) LocalAddr() netip.AddrPort { return t.local }

// Sync waits until the engines have finished what they were doing. It
// orders registered memory between the application and the engines under
// Go's memory model, in both directions: after Sync, the application sees
// what peers wrote through this device; bytes the application wrote before
// Sync are what peers will read. It is needed only where the application
// learns of a peer's access by a path Go cannot see (the peer's own
// completion, a message over another socket); a completion polled from
// this device's CQs already orders memory.
func (d *Device) Sync() {
	if d.dev != nil {
		d.dev.Sync()
	}
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
	return apiErr(p.pd.Dealloc())
}

// RegMR registers buf for access: its lkey and rkey name it in work
// requests and in peers' RDMA operations. The MR's IOVA (the address peers
// use) is the buffer's real address unless AccessZeroBased is given. One
// MR serves the QPs of every shard.
func (p *PD) RegMR(buf []byte, access Access) (*MR, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	return p.wrapMR(p.pd.Register(buf, access))
}

// RegMRInvalidatable registers buf so that SEND with Invalidate and
// LOCAL_INV may invalidate it.
func (p *PD) RegMRInvalidatable(buf []byte, access Access) (*MR, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	return p.wrapMR(p.pd.Register(buf, access, mr.WithInvalidate()))
}

// AllocMW allocates an unbound memory window (ibv_alloc_mw). Bind a type
// 1 window with QP.BindMW (ibv_bind_mw), a type 2 window with a WRBindMW
// work request; LOCAL_INV or a peer's SEND with Invalidate on its rkey
// unbinds a type 2 window. Windows reach MRs registered with AccessMWBind.
func (p *PD) AllocMW(typ MWType) (*MW, error) {
	w, err := p.pd.AllocMW(typ)
	if err != nil {
		return nil, apiErr(err)
	}
	return &MW{w}, nil
}

// wrapMR gives the application its view of a region p registered.
func (p *PD) wrapMR(m *mr.MR, err error) (*MR, error) {
	if err != nil {
		return nil, apiErr(err)
	}
	return &MR{m: m, pd: p}, nil
}

// QPInitAttr describes a QP to create (ibv_qp_init_attr); its PD is the
// one CreateQP is called on.
type QPInitAttr struct {
	Type   QPType
	SendCQ *CQ
	RecvCQ *CQ
	SRQ    *SRQ // receives come from the SRQ (nil: the QP's own receive queue)
	Caps   Caps
	SigAll bool // every send work request completes, signalled or not
	// QPN asks for a specific QP number, e.g. 1 for the GSI QP a
	// connection manager sends its MADs on; 0 lets the device pick one.
	QPN uint32
}

// CreateQP makes a QP in the RESET state, on the shard its number maps to
// (Options.Shards): the shards take new QPs in turn, so they spread.
func (p *PD) CreateQP(a QPInitAttr) (*QP, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	if a.SendCQ == nil || a.RecvCQ == nil {
		return nil, errors.New("rxego: a QP needs a send CQ and a receive CQ")
	}
	attr := qp.InitAttr{Type: a.Type, PD: p.pd, SendCQ: a.SendCQ.cq, RecvCQ: a.RecvCQ.cq, Caps: a.Caps,
		SigAll: a.SigAll, QPN: a.QPN}
	if a.SRQ != nil {
		attr.SRQ = a.SRQ.srq
	}
	q, err := p.dev.dev.CreateQP(attr)
	if err != nil {
		return nil, apiErr(err)
	}
	fq := &QP{q: q, dev: p.dev, pd: p}
	p.dev.qps.Store(q, fq)
	s := p.dev.dev.ShardOf(q.Num())
	a.SendCQ.attach(p.dev, s)
	a.RecvCQ.attach(p.dev, s)
	return fq, nil
}

// CreateSRQ makes a shared receive queue; it serves QPs of every shard.
func (p *PD) CreateSRQ(depth, maxSGE int) (*SRQ, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	srq, err := p.dev.dev.NewSRQ(p.pd, depth, maxSGE)
	if err != nil {
		return nil, apiErr(err)
	}
	return &SRQ{srq: srq}, nil
}

// SRQ is a shared receive queue (ibv_srq): the QPs created with it take
// their receives from it, whichever shard they are on.
type SRQ struct {
	srq *qp.SRQ
}

// PostRecv posts receive work requests to the SRQ (ibv_post_srq_recv),
// all or nothing, as QP.PostRecv.
func (s *SRQ) PostRecv(wrs ...RecvWR) error { return apiErr(s.srq.PostRecv(wrs...)) }

// Len returns how many receives are posted and not yet taken.
func (s *SRQ) Len() int { return s.srq.Len() }

// Depth returns how many receive WQEs the SRQ holds at most (max_wr).
func (s *SRQ) Depth() int { return s.srq.Depth() }

// Arm sets the SRQ's limit (ibv_modify_srq with IBV_SRQ_LIMIT): when a
// receive taken from the SRQ leaves fewer than limit WQEs posted, the
// channel of LimitReached gets a value once and the limit disarms, as
// IBV_EVENT_SRQ_LIMIT_REACHED does (rxe's rule: the count after the take
// is below the limit). Arm again after each event to keep watching. limit
// 0 disarms; a limit of the depth or more is refused, as verbs refuses
// one above max_wr.
func (s *SRQ) Arm(limit int) error { return apiErr(s.srq.Arm(limit)) }

// Limit returns the armed limit, 0 when disarmed (ibv_query_srq's
// srq_limit).
func (s *SRQ) Limit() int { return s.srq.Limit() }

// LimitReached returns the channel that receives a value when the armed
// limit is reached (see Arm): the SRQ's IBV_EVENT_SRQ_LIMIT_REACHED, for
// a select beside the application's other channels. It is closed when the
// SRQ is destroyed.
func (s *SRQ) LimitReached() <-chan struct{} { return s.srq.LimitReached() }

// Destroy destroys the SRQ (ibv_destroy_srq): the receives still posted
// are dropped without completions, and PostRecv fails with ErrClosed.
// While a QP that is not destroyed uses the SRQ, Destroy fails with
// ErrBusy and changes nothing, as ibv_destroy_srq does. A second Destroy
// returns ErrClosed. The channel of LimitReached is closed.
func (s *SRQ) Destroy() error { return apiErr(s.srq.Destroy()) }

// CreateAH makes an address handle for UD sends to dest (port 4791 when 0)
// from the first GID of dest's address family.
func (p *PD) CreateAH(dest netip.AddrPort) (*AH, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	if !dest.Addr().IsValid() {
		return nil, errors.New("rxego: address handle needs a destination address")
	}
	return &AH{Dest: peerAddr(dest)}, nil
}

// CreateAHFrom makes an address handle for UD sends to dest from the
// device's GID of index sgid (ibv_ah_attr.grh.sgid_index). Every datagram
// to dest's address then leaves from that GID: a second AH to the same
// peer from another GID is refused.
func (p *PD) CreateAHFrom(sgid int, dest netip.AddrPort) (*AH, error) {
	ah, err := p.CreateAH(dest)
	if err != nil {
		return nil, err
	}
	if err := p.dev.dev.SetRoute(ah.Dest, device.AnyQPN, sgid, nil); err != nil {
		return nil, err
	}
	return ah, nil
}
