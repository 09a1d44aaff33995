package rsocket

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
)

// Connection state bits (rsocket.c's rs_connected, rs_readable,
// rs_writable): SHUTDOWN clears one direction, DISCONNECT all.
const (
	stConnected = 1 << iota
	stReadable
	stWritable
	stOpen = stConnected | stReadable | stWritable
)

// Errors a Conn returns, wrapped in a *net.OpError.
var (
	// ErrReset is the error of a connection the peer tore down: a Write
	// after the peer's DISCONNECT, or any call after the connection
	// failed without one (the peer's CM disconnect, a QP error, a
	// protocol violation). It matches syscall.ECONNRESET.
	ErrReset = fmt.Errorf("rsocket: connection reset: %w", syscall.ECONNRESET)
	// ErrShutdown is a Write after CloseWrite; it matches syscall.EPIPE.
	ErrShutdown = fmt.Errorf("rsocket: write after CloseWrite: %w", syscall.EPIPE)
)

// closeWait bounds how long Close and CloseWrite wait for the peer to take
// the last messages (the QP's retries fail a dead peer sooner or later).
const closeWait = 5 * time.Second

// Addr is an rsocket endpoint: an IP address and rdma_cm port.
type Addr struct{ AddrPort netip.AddrPort }

// Network returns "rsocket".
func (a Addr) Network() string { return "rsocket" }

// String returns the address as host:port.
func (a Addr) String() string { return a.AddrPort.String() }

// Stats count what a connection did.
type Stats struct {
	DataSent, DataReceived   uint64 // DATA messages
	BytesSent, BytesReceived uint64
	CreditUpdates            uint64 // SGL messages received
	Keepalives               uint64 // keepalives sent
	Malformed                uint64 // messages dropped as no rsocket peer sends them
	// AfterShutdown counts the peer's messages taken after this side
	// sent SHUTDOWN or DISCONNECT. The peer may tear its QP down on
	// taking that message (rsocket's rshutdown does), so the ACK of each
	// of these may reach a QP already in ERR, which drops it uncounted;
	// or, for the peer's own DISCONNECT, the ACK arrives and this side's
	// message is the one that comes too late. Each costs at most one
	// packet (docs/rsocket.md).
	AfterShutdown uint64
}

// Conn is one rsocket stream connection. It implements net.Conn; its
// methods are safe for concurrent use.
type Conn struct {
	cfg    Config
	cmc    *cm.Conn
	pd     *rxego.PD
	cq     *rxego.CQ
	q      *rxego.QP
	rmr    *rxego.MR // the receive buffer, rbuf
	smr    *rxego.MR // the send buffer, sbuf
	tmr    *rxego.MR // the target buffer list: SGL then iomap, written by the peer
	rbuf   []byte
	sbuf   []byte
	tbuf   []byte
	local  Addr
	remote Addr

	readMu  sync.Mutex // serialises readers: the stream has one order
	writeMu sync.Mutex // serialises writers
	mu      sync.Mutex // guards everything below and every post
	wake    chan struct{}

	state  int
	err    error // why the connection failed (ErrReset and the cause)
	closed bool
	shutWr bool      // CloseWrite was called
	rdl    time.Time // read deadline
	wdl    time.Time // write deadline

	// Send side.
	sqeAvail   int // send WRs free for data
	sbufAvail  int
	sbufHead   int // where the next data goes into sbuf
	sseqNo     uint16
	sseqComp   uint16          // the peer's credit limit
	ctrlSeq    uint32          // control messages posted
	ctrlMax    uint32          // ... and the most that may be
	tsgl       [sglEntries]sge // the peer's receive buffer parts: where DATA goes
	tsge       int             // the one in use
	nextTarget int             // the entry the peer writes next
	peerOrder  binary.ByteOrder
	remoteSGL  sge // the peer's target SGL: address, rkey, entries
	remoteSGE  int
	remoteMap  sge // the peer's target iomap
	// This side's mappings, by their entry in the peer's iomap, and the
	// peer's mappings, as it wrote them into the target iomap.
	mappedIndex map[int]*iomapping
	tmap        []iomapEntry

	// Receive side.
	rmsgs     []uint32 // ring of the lengths of DATA messages not yet read
	rhead     int      // the oldest's index
	rcount    int      // how many
	rqueued   int      // their bytes
	rseqNo    uint16
	rseqComp  uint16
	rbufAvail int // bytes read and not yet advertised
	rbufFree  int // the next half to advertise
	rbufOff   int // where the next unread byte is

	stats struct {
		dataSent, dataRecv, bytesSent, bytesRecv, credits, keepalives, malformed atomic.Uint64
		afterShutdown                                                            atomic.Uint64
	}
	// shutSent records that SHUTDOWN or DISCONNECT went out, for
	// Stats.AfterShutdown.
	shutSent bool

	cancel   context.CancelFunc // ends the poller and keepalive
	pollDone chan struct{}
	teardown sync.Once
}

// newConn creates a connection's QP and buffers on m's device: the QP in
// INIT with every receive posted, ready for the CM.
func newConn(m *cm.Manager, cfg Config) (c *Conn, err error) {
	dev := m.Device()
	c = &Conn{cfg: cfg, wake: make(chan struct{}), pollDone: make(chan struct{})}
	defer func() {
		if err != nil {
			c.release()
		}
	}()
	if c.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if c.cq, err = dev.CreateCQ(cfg.SendQueue + cfg.RecvQueue); err != nil {
		return nil, err
	}
	if c.q, err = c.pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: c.cq, RecvCQ: c.cq, SigAll: true,
		Caps: rxego.Caps{MaxSendWR: cfg.SendQueue, MaxRecvWR: cfg.RecvQueue, MaxSendSGE: 2, MaxRecvSGE: 1,
			MaxInlineData: max(cfg.Inline, iomapSize)}}); err != nil {
		return nil, err
	}
	c.rbuf = make([]byte, cfg.RecvBuffer)
	c.sbuf = make([]byte, cfg.SendBuffer)
	c.tbuf = make([]byte, sglEntries*sgeSize+cfg.IOMapSize*iomapSize)
	remote := rxego.AccessLocalWrite | rxego.AccessRemoteWrite
	if c.rmr, err = c.pd.RegMR(c.rbuf, remote); err != nil {
		return nil, err
	}
	if c.smr, err = c.pd.RegMR(c.sbuf, rxego.AccessLocalWrite); err != nil {
		return nil, err
	}
	if c.tmr, err = c.pd.RegMR(c.tbuf, remote); err != nil {
		return nil, err
	}
	if err = c.q.Init(remote); err != nil {
		return nil, err
	}
	for range cfg.RecvQueue {
		if err = c.postRecv(); err != nil {
			return nil, err
		}
	}
	c.rbufFree = cfg.RecvBuffer / 2
	c.rbufAvail = cfg.RecvBuffer / 2
	c.sbufAvail = cfg.SendBuffer
	c.ctrlMax = ctrlSlots
	c.sqeAvail = cfg.SendQueue - ctrlSlots
	c.rseqComp = uint16(cfg.RecvQueue / 2)
	c.rmsgs = make([]uint32, cfg.RecvQueue+1)
	return c, nil
}

// connData is what this side tells the peer: its receive buffer's first
// half and where its target SGL is.
func (c *Conn) connData() connData {
	d := connData{version: protoVersion, flags: flagIOMap, credits: uint16(c.cfg.RecvQueue),
		iomapSize: scaleOf(c.cfg.IOMapSize),
		targetSGL: sge{addr: c.tmr.IOVA(), key: c.tmr.RKey(), length: sglEntries},
		dataBuf:   sge{addr: c.rmr.IOVA(), key: c.rmr.RKey(), length: uint32(c.cfg.RecvBuffer / 2)}}
	if hostIsNet {
		d.flags |= flagNet
	}
	return d
}

// start takes the peer's connection data and starts the connection.
func (c *Conn) start(cmc *cm.Conn, peer connData) {
	c.cmc = cmc
	c.local = Addr{cmc.LocalAddr()}
	c.remote = Addr{cmc.RemoteAddr()}
	c.remoteSGL = peer.targetSGL
	c.remoteSGE = 1 // the peer's entry 0 is our first half, from the connection data
	c.peerOrder = orderOf(peer.flags)
	if peer.flags&flagIOMap != 0 {
		c.remoteMap = sge{addr: peer.targetSGL.addr + sgeSize*uint64(peer.targetSGL.length),
			key: peer.targetSGL.key, length: uint32(valueOf(peer.iomapSize))}
	}
	c.tsgl[0] = peer.dataBuf
	c.nextTarget = 1
	c.sseqComp = peer.credits
	c.state = stOpen
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.poll(ctx)
	go c.watchCM(ctx)
	if c.cfg.KeepAlive > 0 {
		go c.keepalive(ctx, c.cfg.KeepAlive)
	}
}

func (c *Conn) postRecv() error {
	return c.q.PostRecv(rxego.RecvWR{ID: recvWRFlag})
}

// broadcastLocked wakes every waiter to look at the state again.
func (c *Conn) broadcastLocked() {
	close(c.wake)
	c.wake = make(chan struct{})
}

// failLocked ends the connection with a reset, cause saying why.
func (c *Conn) failLocked(cause error) {
	if c.err == nil {
		c.err = fmt.Errorf("%w (%v)", ErrReset, cause)
	}
	c.state = 0
	c.broadcastLocked()
}

// poll processes completions until the connection is torn down.
func (c *Conn) poll(ctx context.Context) {
	defer close(c.pollDone)
	wcs := make([]rxego.WC, 64)
	for {
		n, err := c.cq.PollWait(ctx, wcs)
		if err != nil {
			return
		}
		c.mu.Lock()
		c.completeLocked(wcs[:n])
		c.updateCreditsLocked()
		c.broadcastLocked()
		c.mu.Unlock()
	}
}

// watchCM fails the connection when the CM connection ends without the
// peer's DISCONNECT message (a DREQ, or the manager closing).
func (c *Conn) watchCM(ctx context.Context) {
	select {
	case <-c.cmc.Done():
		c.settleCQ(ctx)
		c.mu.Lock()
		if c.state&stConnected != 0 {
			c.failLocked(fmt.Errorf("CM: %v", c.cmc.Err()))
		}
		c.mu.Unlock()
	case <-ctx.Done():
	}
}

// cmSettle is how long watchCM lets the poll goroutine take what the CQ
// holds before judging a DREQ, and cmSettleMax the most it waits for the
// CQ to empty.
const (
	cmSettle    = 20 * time.Millisecond
	cmSettleMax = 500 * time.Millisecond
)

// settleCQ waits, after the CM connection ended, until the poll goroutine
// has handled what the CQ held (or the connection is no longer
// connected). The peer's DISCONNECT message is acknowledged before its
// DREQ goes out, so it is in the CQ by then, but the DREQ comes by
// another path (QP1) and can be seen first: judged at once, a clean close
// would read as a reset (nettest's BasicIO saw it under load).
func (c *Conn) settleCQ(ctx context.Context) {
	start := time.Now()
	for {
		c.mu.Lock()
		connected := c.state&stConnected != 0
		c.mu.Unlock()
		waited := time.Since(start)
		if !connected || waited >= cmSettleMax || waited >= cmSettle && c.cq.Len() == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// completeLocked handles completions, as rs_poll_cq.
func (c *Conn) completeLocked(wcs []rxego.WC) {
	received := 0
	for i := range wcs {
		wc := &wcs[i]
		if wc.ID&recvWRFlag != 0 {
			if wc.Status != rxego.WCSuccess {
				continue
			}
			received++
			if c.shutSent {
				c.stats.afterShutdown.Add(1)
			}
			if wc.Flags&rxego.WCWithImm == 0 {
				c.stats.malformed.Add(1)
				continue
			}
			c.receiveLocked(wc.Imm, wc.ByteLen)
			continue
		}
		msg := uint32(wc.ID)
		switch msgOp(msg) {
		case opSGL:
			c.ctrlMax++
		case opCtrl:
			c.ctrlMax++
			if msgData(msg) == ctrlDisconnect {
				c.state = 0
			}
		case opIOMapSGL:
			c.sqeAvail++ // sent inline, no send buffer
		default:
			c.sqeAvail++
			c.sbufAvail += int(msgData(msg))
		}
		if wc.Status != rxego.WCSuccess && c.state&stConnected != 0 {
			c.failLocked(fmt.Errorf("send completion: %v", wc.Status))
		}
	}
	if c.state&stConnected != 0 {
		for range received {
			if err := c.postRecv(); err != nil {
				c.failLocked(err)
				break
			}
		}
	}
}

// receiveLocked handles one message from the peer.
func (c *Conn) receiveLocked(msg, written uint32) {
	switch msgOp(msg) {
	case opData:
		n := int(msgData(msg))
		if c.rqueued+n > c.cfg.RecvBuffer || c.rcount == len(c.rmsgs) || written != uint32(n) {
			c.stats.malformed.Add(1)
			c.failLocked(fmt.Errorf("protocol: DATA of %d bytes (%d written) with %d of %d buffered", n, written, c.rqueued, c.cfg.RecvBuffer))
			return
		}
		if n == 0 {
			c.rseqNo++ // nothing to read, but it took a credit
			return
		}
		c.rmsgs[(c.rhead+c.rcount)%len(c.rmsgs)] = uint32(n)
		c.rcount++
		c.rqueued += n
		c.stats.dataRecv.Add(1)
		c.stats.bytesRecv.Add(uint64(n))
	case opSGL:
		c.sseqComp = uint16(msgData(msg))
		c.stats.credits.Add(1)
		if written == sgeSize {
			c.takeTargetLocked()
		}
	case opIOMapSGL:
		c.takeIOMapLocked(msgData(msg))
	case opCtrl:
		switch msgData(msg) {
		case ctrlDisconnect:
			c.state = 0
		case ctrlShutdown:
			if c.state&stWritable != 0 {
				c.state &^= stReadable
			} else {
				c.state = 0
			}
		}
	default:
		c.stats.malformed.Add(1)
	}
}

// takeTargetLocked reads the target SGE the peer just wrote. The peer
// writes its entries in turn, starting with entry 1 (entry 0 came with the
// connection data), and only one this side has used up, so the entry is
// known without looking at the others, which the peer may be writing.
func (c *Conn) takeTargetLocked() {
	i := c.nextTarget
	c.nextTarget = (i + 1) % sglEntries
	c.tsgl[i] = getSGE(binary.NativeEndian, c.tbuf[i*sgeSize:])
}

// consumeTargetLocked uses n bytes of the current target SGE and returns
// where they go.
func (c *Conn) consumeTargetLocked(n int) (addr uint64, rkey uint32) {
	t := &c.tsgl[c.tsge]
	addr, rkey = t.addr, t.key
	t.addr += uint64(n)
	t.length -= uint32(n)
	if t.length == 0 {
		c.tsge = (c.tsge + 1) % sglEntries
	}
	return addr, rkey
}

func (c *Conn) ctrlAvailLocked() bool { return c.ctrlSeq != c.ctrlMax }

// giveCreditsLocked tells whether a credit update is due: half the
// receive buffer is free to advertise, or the peer has used half its
// credits (rs_give_credits).
func (c *Conn) giveCreditsLocked() bool {
	return (c.rbufAvail >= c.cfg.RecvBuffer/2 || int16(c.rseqNo-c.rseqComp) >= 0) &&
		c.ctrlAvailLocked() && c.state&stConnected != 0
}

func (c *Conn) updateCreditsLocked() {
	if c.giveCreditsLocked() {
		c.sendCreditsLocked()
	}
}

// sendCreditsLocked grants credits up to rseqNo + the receive queue and,
// with half the buffer free, writes its SGE into the peer's target SGL
// (rs_send_credits).
func (c *Conn) sendCreditsLocked() {
	c.ctrlSeq++
	c.rseqComp = c.rseqNo + uint16(c.cfg.RecvQueue/2)
	msg := msgSet(opSGL, uint32(c.rseqNo)+uint32(c.cfg.RecvQueue))
	half := c.cfg.RecvBuffer / 2
	var err error
	if c.rbufAvail >= half {
		var b [sgeSize]byte
		sge{addr: c.rmr.IOVA() + uint64(c.rbufFree), key: c.rmr.RKey(), length: uint32(half)}.put(c.peerOrder, b[:])
		err = c.q.PostSend(rxego.SendWR{ID: uint64(msg), Opcode: rxego.WRWriteImm, Flags: rxego.SendInline,
			Inline: b[:], Imm: msg, RemoteAddr: c.remoteSGL.addr + uint64(c.remoteSGE)*sgeSize, RKey: c.remoteSGL.key})
		c.rbufAvail -= half
		c.rbufFree = (c.rbufFree + half) % c.cfg.RecvBuffer
		c.remoteSGE = (c.remoteSGE + 1) % int(c.remoteSGL.length)
	} else {
		err = c.postMsgLocked(msg)
	}
	if err != nil {
		c.failLocked(err)
	}
}

// postMsgLocked sends a message with no data: a zero-length WRITE with
// immediate.
func (c *Conn) postMsgLocked(msg uint32) error {
	return c.q.PostSend(rxego.SendWR{ID: uint64(msg), Opcode: rxego.WRWriteImm, Imm: msg})
}

// keepalive sends rsocket's keepalive every period while connected: a
// zero-length RDMA WRITE without immediate, rkey 0, that the peer's
// hardware acknowledges and nothing else sees.
func (c *Conn) keepalive(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		if c.ctrlAvailLocked() && c.state&stConnected != 0 {
			c.ctrlSeq++
			msg := msgSet(opCtrl, ctrlKeepalive)
			if err := c.q.PostSend(rxego.SendWR{ID: uint64(msg), Opcode: rxego.WRWrite}); err != nil {
				c.failLocked(err)
			} else {
				c.stats.keepalives.Add(1)
			}
		}
		c.mu.Unlock()
	}
}

// waitLocked waits with c.mu held until ready says so or the deadline
// (when not nil) passes; the deadline is read again after every wake-up,
// so that setting it wakes the waiter. Close wakes it too: ready should
// look at c.closed where Close ends the wait.
func (c *Conn) waitLocked(ready func() bool, deadline *time.Time) error {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		var d time.Duration
		if deadline != nil && !deadline.IsZero() {
			if d = time.Until(*deadline); d <= 0 {
				return os.ErrDeadlineExceeded
			}
		}
		if ready() {
			return nil
		}
		var expire <-chan time.Time
		if d > 0 {
			if timer == nil {
				timer = time.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			expire = timer.C
		}
		wake := c.wake
		c.mu.Unlock()
		select {
		case <-wake:
		case <-expire:
		}
		c.mu.Lock()
	}
}

func (c *Conn) opError(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "rsocket", Source: c.local, Addr: c.remote, Err: err}
}

// Read reads stream data. Data that arrived before the peer's SHUTDOWN or
// DISCONNECT is read first, then io.EOF; a connection that failed gives
// ErrReset.
func (c *Conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	off := 0
	n, err := c.readChunks(func(p []byte) (int, error) { k := copy(b[off:], p); off += k; return k, nil }, len(b))
	return n, c.opError("read", err)
}

// WriteTo writes the stream to w until EOF, straight from the receive
// buffer, saving Read's copy.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		n, err := c.readChunks(w.Write, maxTransfer)
		total += int64(n)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, c.opError("read", err)
		}
	}
}

// readChunks waits for data and hands up to limit bytes of it, all there
// is, to fn in contiguous pieces of the receive buffer. fn runs without
// c.mu: the bytes it sees are not advertised to the peer again until it
// returns.
func (c *Conn) readChunks(fn func([]byte) (int, error), limit int) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.waitLocked(func() bool { return c.closed || c.rcount > 0 || c.state&stReadable == 0 }, &c.rdl)
	if err != nil {
		return 0, err
	}
	if c.closed {
		return 0, net.ErrClosed
	}
	if c.rcount == 0 {
		if c.err != nil {
			return 0, c.err
		}
		return 0, io.EOF
	}
	total := 0
	for total < limit && c.rcount > 0 {
		size := min(int(c.rmsgs[c.rhead]), limit-total, len(c.rbuf)-c.rbufOff)
		p := c.rbuf[c.rbufOff : c.rbufOff+size]
		c.mu.Unlock()
		n, ferr := fn(p)
		c.mu.Lock()
		if n < 0 || n > size {
			ferr = errors.Join(ferr, fmt.Errorf("rsocket: writer took %d of %d bytes", n, size))
			n = 0
		}
		total += n
		c.rbufOff = (c.rbufOff + n) % len(c.rbuf)
		c.rbufAvail += n
		c.rqueued -= n
		if c.rmsgs[c.rhead] -= uint32(n); c.rmsgs[c.rhead] == 0 {
			c.rhead = (c.rhead + 1) % len(c.rmsgs)
			c.rcount--
			c.rseqNo++
		}
		c.updateCreditsLocked()
		if ferr != nil {
			return total, ferr
		}
		if n < size {
			break
		}
	}
	return total, nil
}
