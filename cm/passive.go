package cm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/rxego/rxego"
)

// Listener receives connection requests for one rdma_cm port (TCP port
// space) on the manager's device.
type Listener struct {
	m       *Manager
	port    uint16
	sid     uint64
	backlog chan *Request
	// retried holds requests whose REQ came again after being dropped
	// for a full backlog: their initiators are alive, and Accept serves
	// them first, so a flood of one-shot forged REQs cannot starve them.
	retried chan *Request
	done    chan struct{}
	closed  bool // guarded by m.mu
}

// ErrHalfOpen is returned by Request.Accept when the initiator sent no RTU
// within Config.HalfOpenTimeout: its REQ came from an address that does not
// answer (forged, or gone). The QP is in ERR and may be reset and used for
// the next request.
var ErrHalfOpen = errors.New("cm: no RTU from the initiator (half-open connection expired)")

// ErrInUse is returned by Listen for a port already listened on.
var ErrInUse = errors.New("cm: port already has a listener")

// Listen starts accepting connection requests for port: REQs whose
// service ID is 0x0000000001060000 | port. A REQ for a port nobody
// listens on is answered with a REJ (reason 8, invalid service ID).
func (m *Manager) Listen(port uint16) (*Listener, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	sid := ServiceID(PortSpaceTCP, port)
	if m.listeners[sid] != nil {
		return nil, fmt.Errorf("%w: %d", ErrInUse, port)
	}
	l := &Listener{m: m, port: port, sid: sid, backlog: make(chan *Request, m.cfg.Backlog),
		retried: make(chan *Request, max(m.cfg.Backlog/4, 1)), done: make(chan struct{})}
	m.listeners[sid] = l
	return l, nil
}

// Port returns the rdma_cm port the listener serves.
func (l *Listener) Port() uint16 { return l.port }

// Accept returns the next connection request, a retransmitted one first
// (see Config.Backlog); the caller answers it with Request.Accept or
// Request.Reject.
func (l *Listener) Accept(ctx context.Context) (*Request, error) {
	for {
		var r *Request
		select {
		case r = <-l.retried:
		default:
			select {
			case r = <-l.retried:
			case r = <-l.backlog:
			case <-l.done:
				return nil, ErrClosed
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		l.m.mu.Lock()
		live := r.c.st == stREQRcvd // not evicted or timed out meanwhile
		l.m.mu.Unlock()
		if live {
			return r, nil
		}
	}
}

// Close stops listening; requests not yet taken by Accept are rejected.
// Connections already accepted are not affected.
func (l *Listener) Close() error {
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.closeLocked()
	return nil
}

func (l *Listener) closeLocked() {
	l.closed = true
	close(l.done)
	if l.m.listeners[l.sid] == l {
		delete(l.m.listeners, l.sid)
	}
	for {
		var r *Request
		select {
		case r = <-l.backlog:
		case r = <-l.retried:
		default:
			return
		}
		if r.c.st == stREQRcvd {
			r.c.reject(RejConsumerDefined, nil, nil)
			r.c.failLocked(ErrClosed)
		}
	}
}

// Request is a connection request waiting for the application.
type Request struct {
	c *Conn
	// Remote is the initiator's IP address and rdma_cm port, Local the
	// address and port it asked for (from rdma_cm's IP header).
	Remote, Local netip.AddrPort
	// PrivateData is the initiator's private data after the IP header
	// (56 bytes: the REQ's room less the header).
	PrivateData []byte
	// RemoteQPN is the initiator's QP number.
	RemoteQPN uint32
	// ResponderResources and InitiatorDepth are the initiator's offer seen
	// from this side: the most READ/atomic requests this side may accept
	// outstanding (the REQ's initiator depth) and may issue (its
	// responder resources). Accept takes the smaller of these and Params.
	ResponderResources, InitiatorDepth uint8
	// MTU is the path MTU the initiator chose.
	MTU rxego.MTU
}

// Accept connects q (a fresh RC QP of the manager's device, in RESET or
// in INIT with receives already posted) to the initiator: q moves through
// INIT, RTR and RTS, a REP goes out (retransmitted until the RTU, as the
// initiator's REQ asks) and Accept returns once the RTU arrives. q is in
// RTS before the REP leaves, so the initiator may send at once. When ctx
// ends first the request is rejected and ctx's error returned.
func (r *Request) Accept(ctx context.Context, q *rxego.QP, p *Params) (*Conn, error) {
	o := p.orDefault()
	if err := o.check(false); err != nil {
		return nil, err
	}
	if err := checkQP(q); err != nil {
		return nil, err
	}
	c := r.c
	m := c.m
	m.mu.Lock()
	if c.st != stREQRcvd {
		err := c.readyErr
		m.mu.Unlock()
		if err == nil {
			err = fmt.Errorf("cm: request no longer pending (%v)", c.st)
		}
		return nil, err
	}
	c.q = q
	c.params = o
	req := c.req
	// Linux's PSN convention: we send from the REQ's starting PSN and
	// announce in the REP the one we expect.
	s := qpSetup{remoteQPN: req.LocalQPN, rqPSN: o.psn(), sqPSN: req.StartingPSN, mtu: r.MTU,
		respRes: min(o.ResponderResources, r.ResponderResources), initDepth: min(o.InitiatorDepth, r.InitiatorDepth),
		timeout: c.ackTimeout, retry: req.RetryCount, rnr: req.RNRRetryCount, minRNR: o.MinRNRTimer, access: o.Access}
	if err := c.connectQP(s); err != nil {
		c.reject(RejNoQP, nil, nil)
		c.setQPError()
		c.failLocked(err)
		m.mu.Unlock()
		return nil, err
	}
	rep := REP{LocalCommID: c.localID, RemoteCommID: c.remoteID, LocalQPN: q.Num(), StartingPSN: s.rqPSN,
		ResponderResources: s.respRes, InitiatorDepth: s.initDepth, TargetACKDelay: ACKDelay,
		RNRRetryCount: o.rnrRetry(), LocalCAGUID: m.cfg.NodeGUID, PrivateData: o.PrivateData,
		FlowControl: o.FlowControl}
	c.st = stREPSent
	// The REP goes again at least four times within the half-open
	// timeout, so one lost REP or RTU does not fail a live initiator.
	c.sendRetry(&rep, min(c.timeout, m.cfg.HalfOpenTimeout/4), c.maxRetries)
	halfOpen := time.AfterFunc(m.cfg.HalfOpenTimeout, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if c.st == stREPSent {
			m.stats.halfOpen.Add(1)
			c.reject(RejTimeout, nil, nil)
			c.setQPError()
			c.failLocked(ErrHalfOpen)
		}
	})
	m.mu.Unlock()

	err := c.waitReady(ctx, func() {
		c.reject(RejConsumerDefined, nil, nil)
		c.setQPError()
		c.failLocked(ctx.Err())
	})
	halfOpen.Stop()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Reject refuses the request with a REJ (reason 28, consumer defined)
// carrying privateData (at most 148 bytes), as rdma_reject does.
func (r *Request) Reject(privateData []byte) error {
	if len(privateData) > REJPrivateDataSize {
		return fmt.Errorf("%w: %d bytes, room for %d", ErrPrivData, len(privateData), REJPrivateDataSize)
	}
	c := r.c
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if c.st != stREQRcvd {
		return fmt.Errorf("cm: request no longer pending (%v)", c.st)
	}
	c.reject(RejConsumerDefined, nil, privateData)
	c.failLocked(&RejectError{Reason: RejConsumerDefined})
	return nil
}

// issueREJ answers a message that has no connection (cm_issue_rej): the
// IDs swapped, the TID echoed.
func (m *Manager) issueREJ(to netip.Addr, tid uint64, theirID, ourID uint32, rejected uint8, reason uint16) {
	m.sendMsg(to, tid, &REJ{LocalCommID: ourID, RemoteCommID: theirID, MessageRejected: rejected, Reason: reason})
}

// onREQ handles a connection request.
func (m *Manager) onREQ(from netip.Addr, h Header, r *REQ) {
	if c := m.byRemote[remoteKey{r.LocalCAGUID, r.LocalCommID}]; c != nil {
		m.stats.duplicates.Add(1)
		switch c.st {
		case stREQRcvd:
			// The application is still deciding: ask for more time, as
			// rdma_cm does on a duplicate REQ.
			m.sendMsg(c.peer, c.tid, &MRA{LocalCommID: c.localID, RemoteCommID: c.remoteID,
				MessageMRAed: MsgREQ, ServiceTimeout: MRAServiceTimeout})
		case stTimeWait:
			c.reject(RejStaleConn, nil, nil)
		}
		return
	}
	l := m.listeners[r.ServiceID]
	if l == nil {
		m.issueREJ(from, h.TID, r.LocalCommID, 0, MsgREQ, RejInvalidServiceID)
		return
	}
	if r.TransportType != TransportRC {
		m.issueREJ(from, h.TID, r.LocalCommID, 0, MsgREQ, RejInvalidTransportType)
		return
	}
	mtu := rxego.MTU(r.PathMTU)
	if mtu.Bytes() == 0 {
		m.issueREJ(from, h.TID, r.LocalCommID, 0, MsgREQ, RejInvalidMTU)
		return
	}
	ip, err := ParseIPHeader(r.PrivateData)
	if err != nil || ip.Src.Is4() != m.local.Is4() {
		m.logf("cm: REQ from %v: %v", from, err)
		m.issueREJ(from, h.TID, r.LocalCommID, 0, MsgREQ, RejConsumerDefined)
		return
	}
	// A full backlog drops the REQ without an answer (a REJ would end a
	// live initiator's attempt; silence makes it retransmit) and
	// remembers it; a REQ seen before goes to the retried lane, evicting
	// the oldest there when that is full. So a flood of forged REQs,
	// which are never retransmitted, cannot keep a live client out.
	queue := l.backlog
	if m.shed.take(remoteKey{r.LocalCAGUID, r.LocalCommID}) {
		queue = l.retried
		if len(queue) == cap(queue) {
			select {
			case old := <-queue:
				old.c.reject(RejNoResources, nil, nil)
				old.c.failLocked(ErrClosed)
			default:
			}
		}
	} else if len(queue) == cap(queue) {
		m.shedREQ(remoteKey{r.LocalCAGUID, r.LocalCommID})
		return
	}
	c := m.newConn(false, from)
	c.remoteID, c.remoteGUID, c.remoteQPN = r.LocalCommID, r.LocalCAGUID, r.LocalQPN
	c.tid = h.TID
	c.req = r
	c.local = netip.AddrPortFrom(m.local, l.port)
	c.remote = netip.AddrPortFrom(ip.Src, ip.SrcPort)
	c.priv = r.PrivateData[IPHeaderSize:]
	c.timeout = cmTime(r.LocalCMResponseTimeout)
	c.maxRetries = r.MaxCMRetries
	c.ackTimeout = max(r.Primary.LocalACKTimeout, 1)
	c.st = stREQRcvd
	m.byRemote[remoteKey{c.remoteGUID, c.remoteID}] = c
	req := &Request{c: c, Remote: c.remote, Local: netip.AddrPortFrom(ip.Dst, l.port),
		PrivateData: append([]byte(nil), c.priv...), RemoteQPN: r.LocalQPN,
		ResponderResources: r.InitiatorDepth, InitiatorDepth: r.ResponderResources, MTU: mtu}
	select {
	case queue <- req:
	default:
		c.reject(RejNoResources, nil, nil)
		c.failLocked(ErrClosed)
	}
}

// onRTU completes a passive connection.
func (m *Manager) onRTU(r *RTU) {
	c := m.lookup(r.RemoteCommID, r.LocalCommID)
	if c == nil || c.active {
		return
	}
	if c.st != stREPSent {
		m.stats.duplicates.Add(1)
		return
	}
	c.establishLocked()
}

// onREJ handles a rejection of our REQ or REP, or of an established
// connection.
func (m *Manager) onREJ(r *REJ) {
	var c *Conn
	switch {
	case r.Reason == RejTimeout && len(r.ARI) >= 8:
		// A timed-out initiator names itself by GUID and its own ID.
		k := remoteKey{uint64(r.ARI[0])<<56 | uint64(r.ARI[1])<<48 | uint64(r.ARI[2])<<40 | uint64(r.ARI[3])<<32 |
			uint64(r.ARI[4])<<24 | uint64(r.ARI[5])<<16 | uint64(r.ARI[6])<<8 | uint64(r.ARI[7]), r.LocalCommID}
		c = m.byRemote[k]
		if c == nil {
			c = m.lookup(r.RemoteCommID, r.LocalCommID)
		}
	case r.MessageRejected == MsgREQ:
		c = m.lookup(r.RemoteCommID, 0)
	default:
		c = m.lookup(r.RemoteCommID, r.LocalCommID)
	}
	if c == nil {
		return
	}
	rej := &RejectError{Reason: r.Reason, ARI: r.ARI, PrivateData: r.PrivateData}
	switch c.st {
	case stREQSent, stMRAREQRcvd, stREPSent, stREQRcvd:
		c.setQPError()
		c.failLocked(rej)
	case stEstablished, stDREQSent:
		c.setQPError()
		c.endLocked(rej)
		c.enterTimeWait()
	}
}

// onDREQ handles a disconnect request: the QP goes to ERR, a DREP answers
// (again for duplicates), and the connection ends.
func (m *Manager) onDREQ(from netip.Addr, h Header, r *DREQ) {
	c := m.lookup(r.RemoteCommID, r.LocalCommID)
	if c == nil {
		// Unknown or forgotten: answer anyway so the peer can finish
		// (cm_issue_drep).
		m.sendMsg(from, h.TID, &DREP{LocalCommID: r.RemoteCommID, RemoteCommID: r.LocalCommID})
		return
	}
	if c.q == nil || c.q.Num() != r.RemoteQPN {
		return
	}
	switch c.st {
	case stTimeWait, stDREQSent:
		if c.hasDREP {
			// The peer's DREQ again: our DREP was lost.
			m.stats.duplicates.Add(1)
			m.send(c.peer, &c.drep)
			return
		}
		if c.st == stTimeWait {
			// In time-wait after the DREP to our own DREQ: the peer's
			// DREQ crossed ours. Answer it, as the Linux CM does from
			// TIMEWAIT, so that the peer can finish too.
			c.answerDREQ(h.TID)
			return
		}
	case stREPSent, stEstablished:
		c.tid = h.TID
	default:
		return
	}
	c.setQPError()
	c.answerDREQ(h.TID)
	if c.st == stREPSent {
		c.readyErr = ErrDisconnected
	}
	c.endLocked(ErrDisconnected)
	if c.st == stDREQSent {
		// The DREQs crossed: the peer owes a DREP to ours, as we to
		// its (each side in DREQ_SENT answers the other's DREQ). Keep
		// waiting for it (or for our DREQ's retries to run out), so
		// the peer's last message finds us: a process that tore down
		// at once would leave it to arrive at a closed port.
		return
	}
	c.enterTimeWait()
}

// answerDREQ sends the DREP for the peer's DREQ of transaction tid and
// keeps it for duplicates; m.mu is held.
func (c *Conn) answerDREQ(tid uint64) {
	mad, ok := c.m.sendMsg(c.peer, tid, &DREP{LocalCommID: c.localID, RemoteCommID: c.remoteID})
	c.drep, c.hasDREP = mad, ok
}

// onDREP completes our disconnect.
func (m *Manager) onDREP(r *DREP) {
	c := m.lookup(r.RemoteCommID, r.LocalCommID)
	if c == nil {
		return
	}
	if c.st != stDREQSent {
		m.stats.duplicates.Add(1)
		return
	}
	c.enterTimeWait()
}
