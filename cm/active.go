package cm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"github.com/rxego/rxego"
)

// Ephemeral rdma_cm ports Dial picks from (Linux's default
// ip_local_port_range).
const (
	ephemeralLow  = 32768
	ephemeralHigh = 60999
)

// Dial connects q, a fresh RC QP of the manager's device (in RESET, or in
// INIT to have receives posted early), to the rdma_cm listener at raddr
// (its IP address and port, rdma_cm's TCP port space). It sends a REQ,
// retransmits it as the Config says, and on the REP moves q through RTR
// and RTS and answers with an RTU. It returns once the connection is
// established; a REJ comes back as a *RejectError, and ctx's end gives the
// attempt up (with a REJ to the peer).
func (m *Manager) Dial(ctx context.Context, raddr netip.AddrPort, q *rxego.QP, p *Params) (*Conn, error) {
	o := p.orDefault()
	if err := o.check(true); err != nil {
		return nil, err
	}
	if err := checkQP(q); err != nil {
		return nil, err
	}
	peer := raddr.Addr().Unmap()
	if !peer.IsValid() || peer.Is4() != m.local.Is4() {
		return nil, fmt.Errorf("cm: dial %v from %v: need an address of the device's family", raddr, m.local)
	}
	if q.State() == rxego.StateReset {
		// As rdma_create_qp: INIT right away, so receives can be posted.
		if err := q.Init(o.Access); err != nil {
			return nil, err
		}
	}

	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	c := m.newConn(true, peer)
	c.q = q
	c.params = o
	srcPort := o.SrcPort
	if srcPort == 0 {
		srcPort = m.ephemeralPort()
	}
	m.ports[srcPort] = true
	c.local = netip.AddrPortFrom(m.local, srcPort)
	c.remote = netip.AddrPortFrom(peer, raddr.Port())
	c.tid = m.hiTID | uint64(c.localID)
	cfg := &m.cfg
	c.timeout = 2*cmTime(cfg.PacketLifeTime) + cmTime(cfg.ResponseTimeout)
	c.maxRetries = cfg.MaxRetries
	c.ackTimeout = ackTimeout(ACKDelay, cfg.PacketLifeTime)

	hdr := IPHeader{Version: IPHeaderVersion, SrcPort: srcPort, Src: m.local, Dst: peer}
	priv := make([]byte, IPHeaderSize+len(o.PrivateData))
	if err := hdr.Marshal(priv); err != nil {
		c.closeLocked()
		m.mu.Unlock()
		return nil, err
	}
	copy(priv[IPHeaderSize:], o.PrivateData)
	req := REQ{
		LocalCommID: c.localID, ServiceID: ServiceID(PortSpaceTCP, raddr.Port()), LocalCAGUID: cfg.NodeGUID,
		LocalQPN: q.Num(), ResponderResources: o.ResponderResources, InitiatorDepth: o.InitiatorDepth,
		RemoteCMResponseTimeout: cfg.ResponseTimeout, TransportType: TransportRC,
		StartingPSN: o.psn(), LocalCMResponseTimeout: cfg.ResponseTimeout, RetryCount: o.retry(),
		PKey: 0xffff, PathMTU: uint8(o.MTU), RNRRetryCount: o.rnrRetry(), MaxCMRetries: cfg.MaxRetries,
		Primary: Path{LocalLID: 0xffff, RemoteLID: 0xffff, LocalGID: m.local.As16(), RemoteGID: peer.As16(),
			HopLimit: 64, LocalACKTimeout: c.ackTimeout},
		PrivateData: priv, FlowControl: o.FlowControl,
	}
	c.req = &req
	c.st = stREQSent
	c.sendRetry(&req, c.timeout, c.maxRetries)
	m.mu.Unlock()

	err := c.waitReady(ctx, func() {
		// As the Linux CM when a REQ_SENT ID is destroyed: REJ, timeout,
		// with our GUID as the additional information.
		c.reject(RejTimeout, guidARI(cfg.NodeGUID), nil)
		c.setQPError()
		c.failLocked(ctx.Err())
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ephemeralPort picks a free rdma_cm source port; m.mu must be held.
func (m *Manager) ephemeralPort() uint16 {
	for {
		p := uint16(ephemeralLow + rand.IntN(ephemeralHigh-ephemeralLow+1))
		if !m.ports[p] {
			return p
		}
	}
}

// onREP handles a REP: the answer to our REQ, or a duplicate of it.
func (m *Manager) onREP(from netip.Addr, r *REP) {
	c := m.lookup(r.RemoteCommID, 0)
	if c == nil || !c.active {
		return
	}
	switch c.st {
	case stREQSent, stMRAREQRcvd:
	case stEstablished, stDREQSent, stTimeWait:
		if c.remoteID == r.LocalCommID && c.hasRTU {
			// Our RTU was lost: the Linux CM answers a duplicate REP so.
			m.stats.duplicates.Add(1)
			m.send(c.peer, &c.rtu)
		}
		return
	default:
		return
	}
	c.cancelTimer()
	c.remoteID, c.remoteGUID, c.remoteQPN = r.LocalCommID, r.LocalCAGUID, r.LocalQPN
	c.priv = r.PrivateData
	// The REP's initiator depth bounds what we must accept, its
	// responder resources what we may issue (rdma_cm's cma_rep_recv).
	// The Linux CM's PSN convention: each side sends from the starting
	// PSN the other announced (the REQ's is the passive side's send PSN).
	s := qpSetup{remoteQPN: r.LocalQPN, rqPSN: c.req.StartingPSN, sqPSN: r.StartingPSN,
		mtu: rxego.MTU(c.req.PathMTU), respRes: r.InitiatorDepth, initDepth: r.ResponderResources,
		timeout: ackTimeout(r.TargetACKDelay, m.cfg.PacketLifeTime), retry: c.req.RetryCount,
		rnr: r.RNRRetryCount, minRNR: c.params.MinRNRTimer, access: c.params.Access}
	if err := c.connectQP(s); err != nil {
		rej := REJ{LocalCommID: c.localID, RemoteCommID: c.remoteID, MessageRejected: MsgREP, Reason: RejNoQP}
		m.sendMsg(c.peer, c.tid, &rej)
		c.setQPError()
		c.failLocked(err)
		return
	}
	rtu := RTU{LocalCommID: c.localID, RemoteCommID: c.remoteID}
	mad, ok := m.sendMsg(c.peer, c.tid, &rtu)
	c.rtu, c.hasRTU = mad, ok
	c.establishLocked()
}

// onMRA handles an MRA: the peer needs more time for our REQ or REP.
func (m *Manager) onMRA(r *MRA) {
	remote := r.LocalCommID
	if r.MessageMRAed == MsgREQ {
		remote = 0 // the REQ's answer is the first we hear of the peer's ID
	}
	c := m.lookup(r.RemoteCommID, remote)
	if c == nil {
		return
	}
	wait := cmTime(r.ServiceTimeout) + cmTime(c.ackTimeout)
	switch {
	case c.st == stREQSent && r.MessageMRAed == MsgREQ:
		c.st = stMRAREQRcvd
	case c.st == stREPSent && r.MessageMRAed == MsgREP:
	default:
		m.stats.duplicates.Add(1)
		return
	}
	c.arm(wait)
}
