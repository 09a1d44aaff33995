package cm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/qp"
)

// Defaults of Config, the values rdma_cm uses on RoCE.
const (
	DefaultResponseTimeout = 20 // CMA_CM_RESPONSE_TIMEOUT: 4.096 us * 2^20, about 4.3 s
	DefaultPacketLifeTime  = 16 // CMA_IBOE_PACKET_LIFETIME
	DefaultMaxRetries      = 15 // CMA_MAX_CM_RETRIES
	DefaultBacklog         = 16
	// DefaultHalfOpenTimeout bounds the wait for the RTU after a REP: a
	// live initiator answers within a round trip (REP retransmissions
	// included), one behind a forged source address never does.
	DefaultHalfOpenTimeout = time.Second
	// ACKDelay is the Target ACK Delay rxego puts in its REPs: rdma_rxe's
	// local_ca_ack_delay.
	ACKDelay = 15
	// MRAServiceTimeout is what an MRA asks for when the application has
	// not yet answered a request (rdma_cm's CMA_CM_MRA_SETTING: 2^24 *
	// 4.096 us, about 69 s).
	MRAServiceTimeout = 24
)

// QP1 resources.
const (
	recvSlots = 128
	slotSize  = rxego.GRHLen + MADSize
	sendDepth = 256
)

// Config tunes a Manager. The zero value gives rdma_cm's values.
type Config struct {
	// NodeGUID is the CA GUID rxego puts in its REQs and REPs; peers use
	// it, with the communication ID, to recognise duplicates and stale
	// connections. 0 picks a random one, so that a new process reusing QP
	// numbers is not taken for a stale connection.
	NodeGUID uint64
	// ResponseTimeout is the CM response timeout exponent rxego's REQs
	// announce in both directions: how long the peer may take to answer,
	// and how long rxego takes; the peer times its REP retransmissions
	// with it. 0 means DefaultResponseTimeout.
	ResponseTimeout uint8
	// PacketLifeTime is the path's packet lifetime exponent; the REQ's
	// local ACK timeout, the RC QPs' ACK timeout and the time-wait follow
	// from it. 0 means DefaultPacketLifeTime.
	PacketLifeTime uint8
	// MaxRetries is the REQ's Max CM Retries: how often either side
	// retransmits a message before giving up (4 bits). 0 means
	// DefaultMaxRetries.
	MaxRetries uint8
	// Backlog is how many requests a Listener or UDListener holds before
	// Accept takes them. A REQ or SIDR_REQ that finds it full is dropped
	// without an answer and remembered; its retransmission (which only a
	// live initiator sends) goes to a lane of its own that Accept serves
	// first. 0 means DefaultBacklog.
	Backlog int
	// HalfOpenTimeout bounds how long an accepted request waits for the
	// initiator's RTU after the REP, whatever the REQ's timers allow
	// (rdma_cm's: about a minute); then Accept fails with ErrHalfOpen
	// and the application's QP is free for the next request. 0 means
	// DefaultHalfOpenTimeout.
	HalfOpenTimeout time.Duration
	// DropMAD, when set, is asked about every CM MAD sent (out) and
	// received; true drops it, as a lossy network would. For fault
	// injection in tests.
	DropMAD func(out bool, h Header) bool
	// Logf, when set, receives a line per CM message sent and received.
	Logf func(format string, args ...any)
}

func (c *Config) withDefaults() Config {
	var o Config
	if c != nil {
		o = *c
	}
	if o.ResponseTimeout == 0 {
		o.ResponseTimeout = DefaultResponseTimeout
	}
	if o.PacketLifeTime == 0 {
		o.PacketLifeTime = DefaultPacketLifeTime
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = DefaultMaxRetries
	}
	if o.Backlog <= 0 {
		o.Backlog = DefaultBacklog
	}
	if o.HalfOpenTimeout <= 0 {
		o.HalfOpenTimeout = DefaultHalfOpenTimeout
	}
	for o.NodeGUID == 0 {
		o.NodeGUID = rand.Uint64()
	}
	return o
}

func (c *Config) check() error {
	if c.ResponseTimeout > 31 || c.PacketLifeTime > 30 || c.MaxRetries > 15 {
		return fmt.Errorf("%w: response timeout %d (<= 31), packet lifetime %d (<= 30), max retries %d (<= 15)",
			ErrField, c.ResponseTimeout, c.PacketLifeTime, c.MaxRetries)
	}
	return nil
}

// Manager is the connection manager of one rxego.Device: it owns the
// device's QP1 and every connection made or accepted through it. Its
// methods are safe for concurrent use.
type Manager struct {
	dev   *rxego.Device
	cfg   Config
	local netip.Addr

	pd     *rxego.PD
	rcq    *rxego.CQ
	scq    *rxego.CQ
	qp1    *rxego.QP
	mr     *rxego.MR
	buf    []byte
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	hiTID     uint64
	listeners map[uint64]*Listener
	conns     map[uint32]*Conn    // by local communication ID
	byRemote  map[remoteKey]*Conn // passive side: by the initiator's GUID and ID
	ports     map[uint16]bool     // rdma_cm source ports in use by Dial
	// shed remembers the REQs dropped for a full backlog: a REQ found
	// here is a retransmission, from an initiator that is alive.
	shed  shedSet[remoteKey]
	sidr  sidrState                // UD "connections" (sidr.go)
	joins map[mcastKey]*Membership // multicast memberships (mcast.go)

	stats counters
}

// shedREQ remembers a REQ dropped for a full backlog; m.mu must be held.
func (m *Manager) shedREQ(k remoteKey) {
	m.stats.shed.Add(1)
	m.shed.add(k)
}

// remoteKey identifies a connection by the peer's CA GUID and its
// communication ID, which is how a passive side recognises a duplicate REQ.
type remoteKey struct {
	guid uint64
	id   uint32
}

// ErrClosed is returned by operations on a closed Manager or Listener.
var ErrClosed = errors.New("cm: closed")

// New starts a connection manager on dev: it creates QP1 (a UD QP with the
// GSI Q_Key) and receives CM MADs on it until Close. A device has at most
// one Manager.
func New(dev *rxego.Device, cfg *Config) (*Manager, error) {
	c := cfg.withDefaults()
	if err := c.check(); err != nil {
		return nil, err
	}
	m := &Manager{dev: dev, cfg: c, local: dev.Addr().Addr().Unmap(), hiTID: uint64(rand.Uint32()) << 32,
		listeners: map[uint64]*Listener{}, conns: map[uint32]*Conn{}, byRemote: map[remoteKey]*Conn{},
		ports: map[uint16]bool{}}
	if err := m.setupQP1(); err != nil {
		m.teardown()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.wg.Add(1)
	go func() { defer m.wg.Done(); m.recvLoop(ctx) }()
	return m, nil
}

func (m *Manager) setupQP1() error {
	var err error
	if m.pd, err = m.dev.AllocPD(); err != nil {
		return err
	}
	if m.rcq, err = m.dev.CreateCQ(recvSlots); err != nil {
		return err
	}
	if m.scq, err = m.dev.CreateCQ(sendDepth); err != nil {
		return err
	}
	m.buf = make([]byte, recvSlots*slotSize)
	if m.mr, err = m.pd.RegMR(m.buf, rxego.AccessLocalWrite); err != nil {
		return err
	}
	m.qp1, err = m.pd.CreateQP(rxego.QPInitAttr{Type: rxego.UD, SendCQ: m.scq, RecvCQ: m.rcq, QPN: 1,
		Caps: rxego.Caps{MaxSendWR: sendDepth, MaxRecvWR: recvSlots, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: MADSize}})
	if err != nil {
		return fmt.Errorf("cm: creating QP1: %w", err)
	}
	if err := m.qp1.ActivateUD(qp.QKeyGSI, 0); err != nil {
		return err
	}
	for i := range recvSlots {
		if err := m.postRecv(uint64(i)); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manager) postRecv(slot uint64) error {
	return m.qp1.PostRecv(rxego.RecvWR{ID: slot, SGL: []rxego.SGE{{
		Addr: m.mr.IOVA() + slot*slotSize, Length: slotSize, LKey: m.mr.LKey()}}})
}

// teardown releases QP1's resources; the receive loop must have stopped.
func (m *Manager) teardown() {
	if m.qp1 != nil {
		m.qp1.Destroy()
	}
	if m.rcq != nil {
		m.rcq.Close()
	}
	if m.mr != nil {
		m.mr.Deregister()
	}
	if m.pd != nil {
		m.pd.Dealloc()
	}
}

// Close stops the manager: listeners close, connections still established
// are sent a DREQ (without waiting for the DREP) and their QPs moved to
// ERR, multicast memberships are left, and QP1 is destroyed. The device
// stays open.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	m.closed = true
	for _, l := range m.listeners {
		l.closeLocked()
	}
	for _, c := range m.conns {
		c.abortLocked()
	}
	m.leaveAllLocked()
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
	m.teardown()
	return nil
}

// Device returns the manager's device.
func (m *Manager) Device() *rxego.Device { return m.dev }

// NodeGUID returns the CA GUID the manager sends.
func (m *Manager) NodeGUID() uint64 { return m.cfg.NodeGUID }

// recvLoop takes CM MADs off QP1 until ctx ends.
func (m *Manager) recvLoop(ctx context.Context) {
	wcs := make([]rxego.WC, 16)
	var mad [MADSize]byte
	for {
		n, err := m.rcq.PollWait(ctx, wcs)
		if err != nil {
			return
		}
		for _, wc := range wcs[:n] {
			slot := wc.ID
			if wc.Status != rxego.WCSuccess {
				if wc.Status == rxego.WCWRFlushErr {
					return
				}
				m.stats.malformed.Add(1)
			} else if wc.ByteLen < slotSize || slot >= recvSlots {
				m.stats.malformed.Add(1)
			} else {
				off := slot*slotSize + rxego.GRHLen
				copy(mad[:], m.buf[off:off+MADSize])
				m.receive(wc.Src.Addr().Unmap(), mad[:])
			}
			if slot < recvSlots {
				if err := m.postRecv(slot); err != nil {
					return // QP1 destroyed: Close is under way
				}
			}
		}
	}
}

// send transmits a CM MAD to the CM of the port at addr (QP1, UDP 4791).
// A send that fails is counted and treated as lost: retransmission
// recovers, as on a real link.
func (m *Manager) send(to netip.Addr, mad *[MADSize]byte) {
	h, _ := ParseHeader(mad[:])
	m.logf("cm: send %s tid %#x to %v", AttrName(h.AttrID), h.TID, to)
	m.stats.count(&m.stats.sent, h.AttrID)
	if m.cfg.DropMAD != nil && m.cfg.DropMAD(true, h) {
		m.stats.dropped.Add(1)
		return
	}
	err := m.qp1.PostSend(rxego.SendWR{Opcode: rxego.WRSend, Flags: rxego.SendInline, Inline: mad[:],
		AH: &rxego.AH{Dest: netip.AddrPortFrom(to, rxego.DefaultPort), HopLimit: 64}, RemoteQPN: 1, RemoteQKey: qp.QKeyGSI})
	if err != nil {
		m.stats.sendErrors.Add(1)
		m.logf("cm: send %s to %v: %v", AttrName(h.AttrID), to, err)
	}
}

// sendMsg marshals and sends msg. Messages built here always fit; a
// marshal error is a bug and is reported through the counters.
func (m *Manager) sendMsg(to netip.Addr, tid uint64, msg Message) ([MADSize]byte, bool) {
	mad, err := Marshal(tid, msg)
	if err != nil {
		m.stats.sendErrors.Add(1)
		m.logf("cm: %v", err)
		return mad, false
	}
	m.send(to, &mad)
	return mad, true
}

func (m *Manager) logf(format string, args ...any) {
	if m.cfg.Logf != nil {
		m.cfg.Logf(format, args...)
	}
}

// newLocalID returns an unused, nonzero, random communication ID; m.mu
// must be held.
func (m *Manager) newLocalID() uint32 {
	for {
		id := rand.Uint32()
		if _, taken := m.conns[id]; id != 0 && !taken {
			return id
		}
	}
}

// receive dispatches one received MAD.
func (m *Manager) receive(from netip.Addr, mad []byte) {
	h, msg, err := Unmarshal(mad)
	if err != nil {
		if errors.Is(err, ErrUnknown) {
			m.stats.unsupported.Add(1)
		} else {
			m.stats.malformed.Add(1)
		}
		m.logf("cm: drop MAD from %v: %v", from, err)
		return
	}
	m.logf("cm: recv %s tid %#x from %v", AttrName(h.AttrID), h.TID, from)
	if m.cfg.DropMAD != nil && m.cfg.DropMAD(false, h) {
		m.stats.dropped.Add(1)
		return
	}
	m.stats.count(&m.stats.rcvd, h.AttrID)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	switch r := msg.(type) {
	case *REQ:
		m.onREQ(from, h, r)
	case *MRA:
		m.onMRA(r)
	case *REJ:
		m.onREJ(r)
	case *REP:
		m.onREP(from, r)
	case *RTU:
		m.onRTU(r)
	case *DREQ:
		m.onDREQ(from, h, r)
	case *DREP:
		m.onDREP(r)
	case *SIDRREQ:
		m.onSIDRREQ(from, h, r)
	case *SIDRREP:
		m.onSIDRREP(r)
	}
}

// lookup finds the connection a message addresses: by our ID, and by the
// peer's ID when it is known (remote != 0 and the connection has one).
func (m *Manager) lookup(local, remote uint32) *Conn {
	c := m.conns[local]
	if c == nil || (remote != 0 && c.remoteID != 0 && c.remoteID != remote) {
		m.stats.unmatched.Add(1)
		return nil
	}
	return c
}

// counters are the manager's statistics.
type counters struct {
	sent, rcvd  [numAttrs]atomic.Uint64
	retransmits atomic.Uint64
	duplicates  atomic.Uint64
	malformed   atomic.Uint64
	unsupported atomic.Uint64
	unmatched   atomic.Uint64
	sendErrors  atomic.Uint64
	dropped     atomic.Uint64
	timeouts    atomic.Uint64
	shed        atomic.Uint64 // REQs and SIDR_REQs dropped for a full backlog
	halfOpen    atomic.Uint64 // accepted requests whose RTU never came
	mcastJoins  atomic.Uint64 // JoinMulticast calls that joined
	mcastLeaves atomic.Uint64 // memberships left (Leave, or Close)
}

const numAttrs = int(AttrSIDRREP-AttrREQ) + 1 // REQ .. DREP, SIDR_REQ, SIDR_REP

func (c *counters) count(a *[numAttrs]atomic.Uint64, attr uint16) {
	if attr >= AttrREQ && attr <= AttrSIDRREP {
		a[attr-AttrREQ].Add(1)
	}
}

// Counters returns the manager's statistics by name: cm_sent_req,
// cm_rcvd_rep, ... per message, and cm_retransmits, cm_duplicates (a
// duplicate answered or ignored), cm_timeouts (retries exhausted),
// cm_malformed, cm_unsupported (other CM attributes: LAP, APR),
// cm_unmatched (for no known connection), cm_send_errors, cm_dropped
// (by Config.DropMAD), cm_backlog_shed (REQs and SIDR_REQs dropped for a full backlog)
// cm_half_open (accepted requests whose RTU never came), and
// cm_mcast_joins and cm_mcast_leaves (JoinMulticast's memberships made and
// left).
func (m *Manager) Counters() map[string]uint64 {
	s := &m.stats
	out := map[string]uint64{
		"cm_retransmits": s.retransmits.Load(), "cm_duplicates": s.duplicates.Load(),
		"cm_malformed": s.malformed.Load(), "cm_unsupported": s.unsupported.Load(),
		"cm_unmatched": s.unmatched.Load(), "cm_send_errors": s.sendErrors.Load(),
		"cm_dropped": s.dropped.Load(), "cm_timeouts": s.timeouts.Load(),
		"cm_backlog_shed": s.shed.Load(), "cm_half_open": s.halfOpen.Load(),
		"cm_mcast_joins": s.mcastJoins.Load(), "cm_mcast_leaves": s.mcastLeaves.Load(),
	}
	for i := range numAttrs {
		name := lower(AttrName(AttrREQ + uint16(i)))
		out["cm_sent_"+name] = s.sent[i].Load()
		out["cm_rcvd_"+name] = s.rcvd[i].Load()
	}
	return out
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
