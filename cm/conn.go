package cm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/rxego/rxego"
)

// state is a connection's CM state (IBA 12.9.6, Linux enum ib_cm_state).
type state uint8

const (
	stIdle        state = iota
	stREQSent           // active: REQ out, waiting for REP
	stMRAREQRcvd        // active: the peer asked for more time
	stREQRcvd           // passive: REQ in, waiting for the application
	stREPSent           // passive: REP out, waiting for RTU
	stEstablished       // both
	stDREQSent          // DREQ out, waiting for DREP
	stTimeWait          // disconnected; answers duplicates for a while
	stClosed            // gone
)

var stateNames = [...]string{"IDLE", "REQ_SENT", "MRA_REQ_RCVD", "REQ_RCVD", "REP_SENT", "ESTABLISHED",
	"DREQ_SENT", "TIMEWAIT", "CLOSED"}

func (s state) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", s)
}

// Errors a connection can end with.
var (
	// ErrTimeout means the peer did not answer a REQ, REP or DREQ within
	// its retries.
	ErrTimeout = errors.New("cm: no answer from the peer within the retries")
	// ErrDisconnected means the peer disconnected (sent a DREQ).
	ErrDisconnected = errors.New("cm: disconnected by the peer")
	// ErrLocalDisconnect means this side disconnected.
	ErrLocalDisconnect = errors.New("cm: disconnected")
	// ErrNotConnected is returned by Disconnect before the connection was
	// established.
	ErrNotConnected = errors.New("cm: not connected")
)

// RejectError is how a connection attempt ends when the peer rejects it
// with a REJ.
type RejectError struct {
	Reason      uint16 // RejInvalidServiceID, RejConsumerDefined, ...
	ARI         []byte // additional rejection information
	PrivateData []byte
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("cm: rejected by the peer, reason %d (%s)", e.Reason, RejectReason(e.Reason))
}

var rejNames = map[uint16]string{
	RejNoQP: "no QP", RejNoResources: "no resources", RejTimeout: "timeout", RejUnsupported: "unsupported",
	RejInvalidCommID: "invalid comm ID", RejInvalidServiceID: "invalid service ID",
	RejInvalidTransportType: "invalid transport type", RejStaleConn: "stale conn", RejInvalidGID: "invalid GID",
	RejInvalidMTU: "invalid MTU", RejConsumerDefined: "consumer defined", RejInvalidRNRRetry: "invalid RNR retry",
	RejInvalidClassVersion: "invalid class version",
}

// RejectReason names a REJ reason as the Linux CM does.
func RejectReason(r uint16) string {
	if s, ok := rejNames[r]; ok {
		return s
	}
	return "unrecognized reason"
}

// Params are what one side offers for a connection (struct
// rdma_conn_param). The zero value is fine: rping's values.
type Params struct {
	// PrivateData goes in the REQ (after rdma_cm's IP header: at most 56
	// bytes) or the REP (at most 196 bytes).
	PrivateData []byte
	// ResponderResources is how many RDMA READ and atomic requests this
	// side accepts outstanding (max_dest_rd_atomic); InitiatorDepth how
	// many it issues (max_rd_atomic). 0 means 1. The passive side takes
	// the smaller of its offer and the initiator's.
	ResponderResources uint8
	InitiatorDepth     uint8
	// RetryCount is the transport retry count the peer's QP uses toward
	// this one (3 bits, 7 retries forever); RNRRetry likewise for RNR NAKs.
	// Only the initiator's RetryCount is carried: the passive side uses it
	// too. nil-like zero means 7.
	RetryCount *uint8
	RNRRetry   *uint8
	// MinRNRTimer is the RNR NAK timer this side's QP announces (5-bit
	// IBA encoding); 0 means 12 (0.64 ms). (The Linux CM uses 0, 655 ms.)
	MinRNRTimer uint8
	// MTU is the path MTU the initiator asks for; 0 means 1024 bytes, what
	// rdma_cm chooses on a 1500-byte Ethernet. The passive side takes the
	// REQ's.
	MTU rxego.MTU
	// PSN is the starting PSN this side announces in its REQ or REP; nil
	// means random, as rdma_cm. By the Linux CM's convention (which the
	// rxe captures show) the peer sends from it: it is this side's
	// expected receive PSN, and the peer's announcement its send PSN.
	PSN *uint32
	// Access is the QP's remote access when cm moves it to INIT; 0 means
	// local write, remote read, remote write and remote atomic.
	Access rxego.Access
	// SrcPort is the initiator's rdma_cm port, carried in the IP header;
	// 0 picks a free one from the ephemeral range.
	SrcPort uint16
	// FlowControl sets the end-to-end flow control bit of the REQ or REP
	// (rdma_conn_param's flow_control), as rsocket asks for.
	FlowControl bool
}

func (p *Params) orDefault() Params {
	var o Params
	if p != nil {
		o = *p
	}
	if o.ResponderResources == 0 {
		o.ResponderResources = 1
	}
	if o.InitiatorDepth == 0 {
		o.InitiatorDepth = 1
	}
	if o.MinRNRTimer == 0 {
		o.MinRNRTimer = 12
	}
	if o.MTU == 0 {
		o.MTU = rxego.MTU1024
	}
	return o
}

func (p *Params) retry() uint8 {
	if p.RetryCount == nil {
		return 7
	}
	return *p.RetryCount
}

func (p *Params) rnrRetry() uint8 {
	if p.RNRRetry == nil {
		return 7
	}
	return *p.RNRRetry
}

func (p *Params) psn() uint32 {
	if p.PSN == nil {
		return rand.Uint32() & 0xffffff
	}
	return *p.PSN
}

func (p *Params) check(active bool) error {
	room := REPPrivateDataSize
	if active {
		room = REQPrivateDataSize - IPHeaderSize
	}
	if len(p.PrivateData) > room {
		return fmt.Errorf("%w: %d bytes, room for %d", ErrPrivData, len(p.PrivateData), room)
	}
	if p.ResponderResources > rxego.MaxRdAtomicLimit || p.InitiatorDepth > rxego.MaxRdAtomicLimit {
		return fmt.Errorf("%w: responder resources %d and initiator depth %d must be <= %d",
			ErrField, p.ResponderResources, p.InitiatorDepth, rxego.MaxRdAtomicLimit)
	}
	if p.retry() > 7 || p.rnrRetry() > 7 || p.MinRNRTimer > 31 || p.MTU.Bytes() == 0 {
		return fmt.Errorf("%w: retry count %d, RNR retry %d (<= 7), min RNR timer %d (<= 31), MTU %d (1..5)",
			ErrField, p.retry(), p.rnrRetry(), p.MinRNRTimer, p.MTU)
	}
	if p.PSN != nil && *p.PSN > 0xffffff {
		return fmt.Errorf("%w: PSN %#x exceeds 24 bits", ErrField, *p.PSN)
	}
	return nil
}

// Conn is one RC connection made by Dial or accepted from a Listener.
type Conn struct {
	m      *Manager
	active bool
	q      *rxego.QP
	peer   netip.Addr // the peer port's address (its GID)
	local  netip.AddrPort
	remote netip.AddrPort

	// Guarded by m.mu.
	st         state
	localID    uint32
	remoteID   uint32
	remoteGUID uint64
	tid        uint64 // of the exchange we answer or started
	remoteQPN  uint32
	timeout    time.Duration // CM retransmission timeout
	maxRetries uint8
	ackTimeout uint8 // QP ACK timeout exponent, also the time-wait
	priv       []byte
	req        *REQ
	params     Params

	out     [MADSize]byte // the message awaiting an answer
	retries uint8
	timer   *time.Timer
	gen     uint64 // timer generation: a stale timer sees a newer one
	// The RTU and DREP sent, repeated on a duplicate REP or DREQ.
	rtu, drep       [MADSize]byte
	hasRTU, hasDREP bool
	dreqLost        bool // our DREQ went unanswered

	ready    chan struct{} // closed when established or failed
	readyErr error
	done     chan struct{} // closed when the connection ends
	doneErr  error
	gone     chan struct{} // closed on entering time-wait or closed
	once     sync.Once
}

func (m *Manager) newConn(active bool, peer netip.Addr) *Conn {
	c := &Conn{m: m, active: active, peer: peer, localID: m.newLocalID(),
		ready: make(chan struct{}), done: make(chan struct{}), gone: make(chan struct{})}
	m.conns[c.localID] = c
	return c
}

// QP returns the connection's queue pair.
func (c *Conn) QP() *rxego.QP { return c.q }

// LocalAddr returns this side's IP address and rdma_cm port.
func (c *Conn) LocalAddr() netip.AddrPort { return c.local }

// RemoteAddr returns the peer's IP address and rdma_cm port.
func (c *Conn) RemoteAddr() netip.AddrPort { return c.remote }

// PrivateData returns the peer's private data: the REP's for Dial, the
// REQ's (after the IP header) for an accepted connection.
func (c *Conn) PrivateData() []byte {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return append([]byte(nil), c.priv...)
}

// Done is closed when the connection ends: the peer disconnected or
// rejected it, Disconnect was called, or the manager closed.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err says why Done was closed: ErrDisconnected, ErrLocalDisconnect, a
// *RejectError, ErrTimeout or ErrClosed; nil while connected.
func (c *Conn) Err() error {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.doneErr
}

// Disconnect ends an established connection: the QP moves to ERR (its
// outstanding work completes with flush errors), a DREQ goes to the peer,
// and Disconnect waits for the DREP, the retries to run out (the
// connection is then gone all the same and ErrTimeout is returned) or
// ctx. When the peer's DREQ crosses ours, it is answered and the wait
// goes on for the DREP ours is owed, so that the peer's last message
// does not find the process gone. Disconnecting a connection the peer
// already ended returns nil.
func (c *Conn) Disconnect(ctx context.Context) error {
	m := c.m
	m.mu.Lock()
	switch c.st {
	case stEstablished:
		c.setQPError()
		c.endLocked(ErrLocalDisconnect)
		d := DREQ{LocalCommID: c.localID, RemoteCommID: c.remoteID, RemoteQPN: c.remoteQPN}
		c.tid = m.hiTID | uint64(c.localID)
		c.sendRetry(&d, c.timeout, c.maxRetries)
		c.st = stDREQSent
	case stDREQSent, stTimeWait, stClosed:
	default:
		m.mu.Unlock()
		return ErrNotConnected
	}
	m.mu.Unlock()
	select {
	case <-c.gone:
	case <-ctx.Done():
		return ctx.Err()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.dreqLost {
		return ErrTimeout
	}
	return nil
}

// sendRetry sends msg and keeps retransmitting it every timeout, up to
// retries times, until cancelTimer; m.mu must be held.
func (c *Conn) sendRetry(msg Message, timeout time.Duration, retries uint8) {
	mad, ok := c.m.sendMsg(c.peer, c.tid, msg)
	if !ok {
		return
	}
	c.out = mad
	c.retries = retries
	c.arm(timeout)
}

// arm (re)starts the retransmission timer; m.mu must be held.
func (c *Conn) arm(d time.Duration) {
	c.cancelTimer()
	gen := c.gen
	c.timer = time.AfterFunc(d, func() {
		c.m.mu.Lock()
		defer c.m.mu.Unlock()
		if c.gen == gen && !c.m.closed {
			c.expired()
		}
	})
}

func (c *Conn) cancelTimer() {
	c.gen++
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
}

// expired handles the retransmission timer; m.mu is held.
func (c *Conn) expired() {
	switch c.st {
	case stREQSent, stMRAREQRcvd, stREPSent, stDREQSent:
	default:
		return
	}
	if c.retries > 0 {
		c.retries--
		c.m.stats.retransmits.Add(1)
		c.m.send(c.peer, &c.out)
		// After an MRA the longer wait was for one answer only.
		if c.st == stMRAREQRcvd {
			c.st = stREQSent
		}
		c.arm(c.timeout)
		return
	}
	c.m.stats.timeouts.Add(1)
	switch c.st {
	case stREQSent, stMRAREQRcvd, stREPSent:
		// As the Linux CM: no REJ, the connection just fails.
		c.setQPError()
		c.failLocked(ErrTimeout)
	case stDREQSent:
		c.dreqLost = true
		c.enterTimeWait()
	}
}

// setQPError moves the QP to ERR, flushing its work.
func (c *Conn) setQPError() {
	if c.q != nil {
		c.q.Modify(&rxego.QPAttr{State: rxego.StateErr}, rxego.AttrState)
	}
}

// failLocked ends a connection that never got established.
func (c *Conn) failLocked(err error) {
	c.cancelTimer()
	c.readyErr = err
	c.endLocked(err)
	c.once.Do(func() { close(c.ready) })
	c.closeLocked()
}

// endLocked closes Done with err, once.
func (c *Conn) endLocked(err error) {
	select {
	case <-c.done:
	default:
		c.doneErr = err
		close(c.done)
	}
}

// establishLocked marks the connection usable.
func (c *Conn) establishLocked() {
	c.cancelTimer()
	c.st = stEstablished
	c.once.Do(func() { close(c.ready) })
}

// enterTimeWait keeps the connection known for a while to answer
// duplicates (a DREQ with the DREP), then forgets it.
func (c *Conn) enterTimeWait() {
	c.cancelTimer()
	c.st = stTimeWait
	c.once.Do(func() { close(c.ready) })
	select {
	case <-c.gone:
	default:
		close(c.gone)
	}
	gen := c.gen
	c.timer = time.AfterFunc(cmTime(c.ackTimeout), func() {
		c.m.mu.Lock()
		defer c.m.mu.Unlock()
		if c.gen == gen && c.st == stTimeWait {
			c.closeLocked()
		}
	})
}

// closeLocked forgets the connection.
func (c *Conn) closeLocked() {
	c.cancelTimer()
	c.st = stClosed
	m := c.m
	if m.conns[c.localID] == c {
		delete(m.conns, c.localID)
	}
	k := remoteKey{c.remoteGUID, c.remoteID}
	if m.byRemote[k] == c {
		delete(m.byRemote, k)
	}
	if c.active && c.local.Port() != 0 {
		delete(m.ports, c.local.Port())
	}
	select {
	case <-c.gone:
	default:
		close(c.gone)
	}
}

// abortLocked ends the connection as the manager closes.
func (c *Conn) abortLocked() {
	switch c.st {
	case stEstablished:
		c.setQPError()
		c.m.sendMsg(c.peer, c.m.hiTID|uint64(c.localID),
			&DREQ{LocalCommID: c.localID, RemoteCommID: c.remoteID, RemoteQPN: c.remoteQPN})
	case stREQRcvd, stREPSent:
		c.setQPError()
		c.reject(RejConsumerDefined, nil, nil)
	case stREQSent, stMRAREQRcvd:
		c.reject(RejTimeout, guidARI(c.m.cfg.NodeGUID), nil)
	}
	c.readyErr = ErrClosed
	c.endLocked(ErrClosed)
	c.once.Do(func() { close(c.ready) })
	c.closeLocked()
}

func guidARI(g uint64) []byte { return binary.BigEndian.AppendUint64(nil, g) }

// reject sends a REJ for this connection in its current state (the Linux
// CM's cm_format_rej).
func (c *Conn) reject(reason uint16, ari, priv []byte) {
	r := REJ{RemoteCommID: c.remoteID, LocalCommID: c.localID, Reason: reason, ARI: ari, PrivateData: priv,
		MessageRejected: MsgOther}
	switch c.st {
	case stREQRcvd:
		r.LocalCommID, r.MessageRejected = 0, MsgREQ
	case stREPSent:
		r.MessageRejected = MsgOther
	}
	if len(r.PrivateData) > REJPrivateDataSize {
		r.PrivateData = r.PrivateData[:REJPrivateDataSize]
	}
	c.m.sendMsg(c.peer, c.tid, &r)
}

// qpSetup are the attributes a connection gives its QP.
type qpSetup struct {
	remoteQPN, rqPSN, sqPSN uint32
	mtu                     rxego.MTU
	respRes, initDepth      uint8
	timeout, retry, rnr     uint8
	minRNR                  uint8
	access                  rxego.Access
}

// connectQP moves q through INIT (if it is still in RESET), RTR and RTS.
func (c *Conn) connectQP(s qpSetup) error {
	q := c.q
	if q.State() == rxego.StateReset {
		if err := q.Init(s.access); err != nil {
			return err
		}
	}
	rtr := rxego.QPAttr{State: rxego.StateRTR, PathMTU: s.mtu, DestQPN: s.remoteQPN, RQPSN: s.rqPSN,
		Dest: netip.AddrPortFrom(c.peer, rxego.DefaultPort), HopLimit: 64,
		MaxDestRdAtomic: s.respRes, MinRNRTimer: s.minRNR}
	if err := q.Modify(&rtr, rxego.AttrState|rxego.AttrAV|rxego.AttrPathMTU|rxego.AttrDestQPN|rxego.AttrRQPSN|
		rxego.AttrMaxDestRdAtomic|rxego.AttrMinRNRTimer); err != nil {
		return fmt.Errorf("cm: QP %d to RTR: %w", q.Num(), err)
	}
	rts := rxego.QPAttr{State: rxego.StateRTS, SQPSN: s.sqPSN, Timeout: s.timeout, RetryCnt: s.retry, RNRRetry: s.rnr,
		MaxRdAtomic: s.initDepth}
	if err := q.Modify(&rts, rxego.AttrState|rxego.AttrSQPSN|rxego.AttrTimeout|rxego.AttrRetryCnt|rxego.AttrRNRRetry|
		rxego.AttrMaxQPRdAtomic); err != nil {
		return fmt.Errorf("cm: QP %d to RTS: %w", q.Num(), err)
	}
	return nil
}

// checkQP makes sure q is a fresh RC QP of the manager's device.
func checkQP(q *rxego.QP) error {
	if q == nil || q.Type() != rxego.RC {
		return errors.New("cm: connections need an RC QP")
	}
	if st := q.State(); st != rxego.StateReset && st != rxego.StateInit {
		return fmt.Errorf("cm: QP %d is in %v; it must be in RESET or INIT", q.Num(), st)
	}
	return nil
}

// waitReady waits for establishment or failure; on ctx's end it gives the
// connection up with abandon.
func (c *Conn) waitReady(ctx context.Context, abandon func()) error {
	select {
	case <-c.ready:
	case <-ctx.Done():
		c.m.mu.Lock()
		select {
		case <-c.ready:
		default:
			abandon()
		}
		c.m.mu.Unlock()
	}
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if c.st == stEstablished || c.readyErr == nil {
		return nil
	}
	return c.readyErr
}
