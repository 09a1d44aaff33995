package cm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/rxego/rxego"
)

// Service ID Resolution (IBA 12.11): how rdma_cm "connects" UD QPs in its
// UDP port space (udaddy, RDMA_PS_UDP). The active side sends a SIDR_REQ
// naming the service; the passive side answers with a SIDR_REP carrying
// the QPN and Q_Key to send to. There is no connection state and no
// teardown.

// Private data room of the SIDR messages (IB_CM_SIDR_*_PRIVATE_DATA_SIZE).
const (
	SIDRREQPrivateDataSize = 216
	SIDRREPPrivateDataSize = 136
	// SIDRREPInfoSize is the room for the ClassPortInfo of a redirect.
	SIDRREPInfoSize = 72
)

// SIDR_REP statuses (enum ib_cm_sidr_status).
const (
	SIDRSuccess     uint8 = 0
	SIDRUnsupported uint8 = 1 // no service with that ID
	SIDRReject      uint8 = 2
	SIDRNoQP        uint8 = 3
)

// UDPQKey is the Q_Key of every QP in rdma_cm's UDP port space
// (RDMA_UDP_QKEY); rdma_cm refuses a SIDR_REP with another.
const UDPQKey uint32 = 0x01234567

// SIDRREQ is a ServiceIDResolutionRequest.
type SIDRREQ struct {
	RequestID   uint32
	PKey        uint16
	ServiceID   uint64
	PrivateData []byte // up to SIDRREQPrivateDataSize bytes
}

// AttrID returns AttrSIDRREQ.
func (*SIDRREQ) AttrID() uint16 { return AttrSIDRREQ }

func (m *SIDRREQ) put(d []byte) error {
	if err := putPriv(d[16:232], m.PrivateData); err != nil {
		return err
	}
	binary.BigEndian.PutUint32(d[0:], m.RequestID)
	binary.BigEndian.PutUint16(d[4:], m.PKey)
	binary.BigEndian.PutUint64(d[8:], m.ServiceID)
	return nil
}

func (m *SIDRREQ) get(d []byte) {
	m.RequestID = binary.BigEndian.Uint32(d[0:])
	m.PKey = binary.BigEndian.Uint16(d[4:])
	m.ServiceID = binary.BigEndian.Uint64(d[8:])
	m.PrivateData = getPriv(d[16:232])
}

// SIDRREP is a ServiceIDResolutionResponse.
type SIDRREP struct {
	RequestID   uint32
	Status      uint8
	InfoLength  uint8
	QPN         uint32 // 24 bits
	ServiceID   uint64
	QKey        uint32
	Info        [SIDRREPInfoSize]byte
	PrivateData []byte // up to SIDRREPPrivateDataSize bytes
}

// AttrID returns AttrSIDRREP.
func (*SIDRREP) AttrID() uint16 { return AttrSIDRREP }

func (m *SIDRREP) put(d []byte) error {
	if err := fit("QPN", uint64(m.QPN), 24); err != nil {
		return err
	}
	if err := putPriv(d[96:232], m.PrivateData); err != nil {
		return err
	}
	binary.BigEndian.PutUint32(d[0:], m.RequestID)
	d[4], d[5] = m.Status, m.InfoLength
	putU24(d[8:], m.QPN)
	binary.BigEndian.PutUint64(d[12:], m.ServiceID)
	binary.BigEndian.PutUint32(d[20:], m.QKey)
	copy(d[24:96], m.Info[:])
	return nil
}

func (m *SIDRREP) get(d []byte) {
	m.RequestID = binary.BigEndian.Uint32(d[0:])
	m.Status, m.InfoLength = d[4], d[5]
	m.QPN = u24(d[8:])
	m.ServiceID = binary.BigEndian.Uint64(d[12:])
	m.QKey = binary.BigEndian.Uint32(d[20:])
	copy(m.Info[:], d[24:96])
	m.PrivateData = getPriv(d[96:232])
}

// sidrState is the manager's SIDR bookkeeping, guarded by Manager.mu.
type sidrState struct {
	listeners map[uint64]*UDListener  // by service ID
	pending   map[uint32]chan SIDRREP // active side: by request ID
	answered  map[sidrKey]*[MADSize]byte
	order     []sidrKey // answered, oldest first, for the bound
	// shed remembers the requests dropped for a full backlog (see
	// onSIDRREQ).
	shed shedSet[sidrKey]
}

// sidrKey names a request as the passive side sees it.
type sidrKey struct {
	from netip.Addr
	id   uint32
}

// sidrAnswered bounds the passive side's memory of answered requests,
// kept to answer their retransmissions with the same SIDR_REP.
const sidrAnswered = 256

func (s *sidrState) init() {
	if s.listeners == nil {
		s.listeners = make(map[uint64]*UDListener)
		s.pending = make(map[uint32]chan SIDRREP)
		s.answered = make(map[sidrKey]*[MADSize]byte)
	}
}

// UDListener receives SIDR requests for one port of rdma_cm's UDP port
// space (what udaddy's server listens on).
type UDListener struct {
	m       *Manager
	port    uint16
	sid     uint64
	backlog chan *UDRequest
	// retried holds requests that came again after being dropped for a
	// full backlog: their requesters are alive, and Accept serves them
	// first, so a flood of one-shot forged requests cannot starve them.
	retried chan *UDRequest
	done    chan struct{}
	closed  bool // guarded by m.mu
}

// ListenUD starts accepting SIDR requests for port: SIDR_REQs whose
// service ID is 0x0000000001110000 | port. A request for a port nobody
// listens on is answered with status SIDRUnsupported, as the Linux CM
// does.
func (m *Manager) ListenUD(port uint16) (*UDListener, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	m.sidr.init()
	sid := ServiceID(PortSpaceUDP, port)
	if m.sidr.listeners[sid] != nil {
		return nil, fmt.Errorf("%w: UDP %d", ErrInUse, port)
	}
	l := &UDListener{m: m, port: port, sid: sid, backlog: make(chan *UDRequest, m.cfg.Backlog),
		retried: make(chan *UDRequest, max(m.cfg.Backlog/4, 1)), done: make(chan struct{})}
	m.sidr.listeners[sid] = l
	return l, nil
}

// Accept returns the next SIDR request, a retransmitted one first (see
// Config.Backlog); answer it with UDRequest.Accept or Reject.
func (l *UDListener) Accept(ctx context.Context) (*UDRequest, error) {
	select {
	case r := <-l.retried:
		return r, nil
	default:
	}
	select {
	case r := <-l.retried:
		return r, nil
	case r := <-l.backlog:
		return r, nil
	case <-l.done:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close stops listening; requests not yet taken are rejected.
func (l *UDListener) Close() error {
	m := l.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.closed = true
	close(l.done)
	delete(m.sidr.listeners, l.sid)
	for {
		select {
		case r := <-l.backlog:
			r.answerLocked(SIDRReject, 0, nil)
		case r := <-l.retried:
			r.answerLocked(SIDRReject, 0, nil)
		default:
			return nil
		}
	}
}

// UDRequest is a SIDR request waiting for the application.
type UDRequest struct {
	m    *Manager
	key  sidrKey
	tid  uint64
	sid  uint64
	done bool // guarded by m.mu
	// Remote is the requester's IP address and rdma_cm port, Local the
	// address and port it asked for (rdma_cm's IP header).
	Remote, Local netip.AddrPort
	// PrivateData is the requester's private data after the IP header.
	PrivateData []byte
}

// Accept answers the request with q's QPN and rdma_cm's UDP Q_Key; q
// should be a UD QP of the manager's device, ready to receive, with
// Q_Key UDPQKey. privateData goes in the SIDR_REP (up to 136 bytes).
func (r *UDRequest) Accept(q *rxego.QP, privateData []byte) error {
	if len(privateData) > SIDRREPPrivateDataSize {
		return fmt.Errorf("%w: %d bytes, room for %d", ErrPrivData, len(privateData), SIDRREPPrivateDataSize)
	}
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.answerLocked(SIDRSuccess, q.Num(), privateData)
}

// Reject answers the request with status SIDRReject.
func (r *UDRequest) Reject() error {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.answerLocked(SIDRReject, 0, nil)
}

// ErrAnswered is returned when a SIDR request is answered twice.
var ErrAnswered = errors.New("cm: SIDR request already answered")

func (r *UDRequest) answerLocked(status uint8, qpn uint32, priv []byte) error {
	if r.done {
		return ErrAnswered
	}
	r.done = true
	rep := &SIDRREP{RequestID: r.key.id, Status: status, QPN: qpn, ServiceID: r.sid, PrivateData: priv}
	if status == SIDRSuccess {
		rep.QKey = UDPQKey
	}
	r.m.answerSIDRLocked(r.key, r.tid, rep)
	return nil
}

// answerSIDRLocked sends rep and remembers it for retransmitted requests.
func (m *Manager) answerSIDRLocked(k sidrKey, tid uint64, rep *SIDRREP) {
	mad, ok := m.sendMsg(k.from, tid, rep)
	if !ok {
		return
	}
	s := &m.sidr
	if len(s.order) >= sidrAnswered {
		delete(s.answered, s.order[0])
		s.order = s.order[1:]
	}
	s.answered[k] = &mad
	s.order = append(s.order, k)
}

// onSIDRREQ handles a SIDR request; m.mu is held.
func (m *Manager) onSIDRREQ(from netip.Addr, h Header, r *SIDRREQ) {
	m.sidr.init()
	k := sidrKey{from, r.RequestID}
	if mad, ok := m.sidr.answered[k]; ok {
		m.stats.duplicates.Add(1)
		if mad != nil { // nil: the application has not answered yet
			m.send(from, mad)
		}
		return
	}
	l := m.sidr.listeners[r.ServiceID]
	ip, err := ParseIPHeader(r.PrivateData)
	switch {
	case l == nil:
		m.answerSIDRLocked(k, h.TID, &SIDRREP{RequestID: r.RequestID, Status: SIDRUnsupported, ServiceID: r.ServiceID})
		return
	case err != nil || ip.Src.Is4() != m.local.Is4():
		m.logf("cm: SIDR_REQ from %v: %v", from, err)
		m.answerSIDRLocked(k, h.TID, &SIDRREP{RequestID: r.RequestID, Status: SIDRReject, ServiceID: r.ServiceID})
		return
	}
	// A full backlog drops the request without an answer (a reject would
	// end a live requester's attempt; silence makes it retransmit) and
	// remembers it; a request seen before goes to the retried lane,
	// evicting (rejecting) the oldest there when that is full. So a flood
	// of forged requests, which are never retransmitted, cannot keep a
	// live client out. As Listener does for REQs.
	queue := l.backlog
	if m.sidr.shed.take(k) {
		queue = l.retried
		if len(queue) == cap(queue) {
			select {
			case old := <-queue:
				old.answerLocked(SIDRReject, 0, nil)
			default: // Accept took one meanwhile
			}
		}
	} else if len(queue) == cap(queue) {
		m.stats.shed.Add(1)
		m.sidr.shed.add(k)
		return
	}
	req := &UDRequest{m: m, key: k, tid: h.TID, sid: r.ServiceID,
		Remote: netip.AddrPortFrom(ip.Src, ip.SrcPort), Local: netip.AddrPortFrom(ip.Dst, l.port),
		PrivateData: append([]byte(nil), r.PrivateData[IPHeaderSize:]...)}
	queue <- req // room made above; m.mu keeps other senders out
	// Until the application answers, retransmissions are dropped above as
	// duplicates of a request in the backlog.
	m.sidr.answered[k] = nil
}

// onSIDRREP hands a SIDR reply to the DialUD waiting for it; m.mu is held.
func (m *Manager) onSIDRREP(r *SIDRREP) {
	ch := m.sidr.pending[r.RequestID]
	if ch == nil {
		m.stats.unmatched.Add(1)
		return
	}
	delete(m.sidr.pending, r.RequestID)
	ch <- *r // buffered, one reply per request
}

// UDPeer is where a SIDR request resolved a service: the QP to send to.
type UDPeer struct {
	// Addr is the peer's RoCE address (UDP port 4791).
	Addr netip.AddrPort
	QPN  uint32
	QKey uint32
	// PrivateData is the SIDR_REP's private data.
	PrivateData []byte
}

// ErrSIDRStatus wraps a SIDR_REP whose status is not success.
var ErrSIDRStatus = errors.New("cm: SIDR request refused")

// ErrSIDRTimeout is returned when no SIDR_REP came after every retry.
var ErrSIDRTimeout = errors.New("cm: SIDR request timed out")

// DialUD resolves raddr (an address and a port of rdma_cm's UDP port
// space) to the QPN and Q_Key of the UD QP serving it, as rdma_connect
// does on a UDP rdma_cm ID: a SIDR_REQ with rdma_cm's IP header and
// privateData (up to 180 bytes) goes out, retransmitted with the
// manager's timeouts, until a SIDR_REP arrives or ctx ends.
func (m *Manager) DialUD(ctx context.Context, raddr netip.AddrPort, privateData []byte) (UDPeer, error) {
	peer := raddr.Addr().Unmap()
	if !peer.IsValid() || peer.Is4() != m.local.Is4() {
		return UDPeer{}, fmt.Errorf("cm: dial %v from %v: need an address of the device's family", raddr, m.local)
	}
	if len(privateData) > SIDRREQPrivateDataSize-IPHeaderSize {
		return UDPeer{}, fmt.Errorf("%w: %d bytes, room for %d", ErrPrivData, len(privateData), SIDRREQPrivateDataSize-IPHeaderSize)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return UDPeer{}, ErrClosed
	}
	m.sidr.init()
	var id uint32
	for id == 0 || m.sidr.pending[id] != nil {
		id = rand.Uint32()
	}
	ch := make(chan SIDRREP, 1)
	m.sidr.pending[id] = ch
	srcPort := m.ephemeralPort()
	cfg := m.cfg
	tid := m.hiTID | uint64(id)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.sidr.pending, id)
		m.mu.Unlock()
	}()

	hdr := IPHeader{Version: IPHeaderVersion, SrcPort: srcPort, Src: m.local, Dst: peer}
	priv := make([]byte, IPHeaderSize+len(privateData))
	if err := hdr.Marshal(priv); err != nil {
		return UDPeer{}, err
	}
	copy(priv[IPHeaderSize:], privateData)
	mad, err := Marshal(tid, &SIDRREQ{RequestID: id, PKey: 0xffff, ServiceID: ServiceID(PortSpaceUDP, raddr.Port()), PrivateData: priv})
	if err != nil {
		return UDPeer{}, err
	}
	timeout := 2*cmTime(cfg.PacketLifeTime) + cmTime(cfg.ResponseTimeout)
	for try := 0; try <= int(cfg.MaxRetries); try++ {
		m.send(peer, &mad)
		t := time.NewTimer(timeout)
		select {
		case rep := <-ch:
			t.Stop()
			if rep.Status != SIDRSuccess {
				return UDPeer{}, fmt.Errorf("%w: status %d", ErrSIDRStatus, rep.Status)
			}
			return UDPeer{Addr: netip.AddrPortFrom(peer, rxego.DefaultPort), QPN: rep.QPN, QKey: rep.QKey,
				PrivateData: rep.PrivateData}, nil
		case <-ctx.Done():
			t.Stop()
			return UDPeer{}, ctx.Err()
		case <-t.C:
		}
	}
	return UDPeer{}, ErrSIDRTimeout
}
