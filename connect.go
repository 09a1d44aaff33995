package rxego

import (
	"fmt"
	"net/netip"

	"github.com/rxego/rxego/qp"
)

// RemoteQP is what one side of a connection learns of the other out of
// band: what ibv_rc_pingpong and perftest exchange over TCP.
type RemoteQP struct {
	Addr netip.AddrPort // the peer device's address (its GID) and UDP port
	QPN  uint32
	PSN  uint32 // the peer's starting send PSN
	QKey uint32 // UD only
	// SGIDIndex is the local GID the connection's packets leave from (the
	// sgid_index of ibv_ah_attr's GRH; see Device.QueryGID). 0 is Open's
	// address.
	SGIDIndex int
}

// ConnectOptions tune ConnectRC (and ConnectRC on a UC QP).
//
// Every verbs value can be expressed. Start from DefaultConnectOptions,
// which sets Exact, and change what you need: each field is then used as
// it is, zeros included (rnr_retry 0 fails at the first RNR NAK, timeout
// 0 waits forever):
//
//	o := rxego.DefaultConnectOptions()
//	o.RNRRetry, o.Timeout = 0, 0
//	err := rxego.ConnectRC(q, remote, &o)
//
// In a ConnectOptions without Exact (a literal naming a few fields, as
// &rxego.ConnectOptions{LocalPSN: psn, Timeout: 12}), a zero MTU, Timeout,
// RetryCnt, RNRRetry, MinRNRTimer, MaxRdAtomic or Access stands for its
// default, so such a literal changes only the fields it names. LocalPSN
// and TrafficClass are always used as given. A nil *ConnectOptions means
// the defaults.
//
// RetryCnt 7 retries a lost packet forever, as rdma_rxe does (rxe's rule;
// on ConnectX 7 is seven retries and then RETRY_EXC_ERR): with the
// default, a peer that has gone away never fails the QP, it keeps
// resending. Give RetryCnt 1 to 6 to have such work fail with
// RETRY_EXC_ERR after that many retransmissions. RNRRetry 7 is "forever"
// on every device. docs/rnic.md and docs/reliability.md give the timings.
type ConnectOptions struct {
	MTU          MTU    // path_mtu (default MTU 1024)
	LocalPSN     uint32 // sq_psn, this side's first send PSN
	Timeout      uint8  // local ACK timeout: 4.096 us << Timeout, 0 infinite (default 14)
	RetryCnt     uint8  // retry_cnt, 7 infinite (default 7): see below
	RNRRetry     uint8  // rnr_retry, 7 infinite (default 7)
	MinRNRTimer  uint8  // min_rnr_timer, the IB RNR timer code (default 12)
	MaxRdAtomic  uint8  // max_rd_atomic and max_dest_rd_atomic (default 1)
	Access       Access // qp_access_flags (default: local write and all remote access)
	TrafficClass uint8  // the IP TOS of the QP's packets (0 unless set)
	// Exact makes every field count as given, zeros included.
	Exact bool
}

// DefaultConnectOptions returns the defaults of ibv_rc_pingpong, with
// Exact set: MTU 1024, timeout 14, retry_cnt 7, rnr_retry 7,
// min_rnr_timer 12, one outstanding READ or atomic, all remote access.
func DefaultConnectOptions() ConnectOptions {
	return ConnectOptions{MTU: qp.MTU1024, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxRdAtomic: 1,
		Access: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic, Exact: true}
}

// withDefaults returns the options to use: o itself when Exact, else o
// with its zero fields (those with a default) filled in.
func (o *ConnectOptions) withDefaults() ConnectOptions {
	c := DefaultConnectOptions()
	if o == nil {
		return c
	}
	if o.Exact {
		return *o
	}
	pick := func(v, def uint8) uint8 {
		if v != 0 {
			return v
		}
		return def
	}
	if o.MTU != 0 {
		c.MTU = o.MTU
	}
	c.LocalPSN = o.LocalPSN
	c.Timeout = pick(o.Timeout, c.Timeout)
	c.RetryCnt = pick(o.RetryCnt, c.RetryCnt)
	c.RNRRetry = pick(o.RNRRetry, c.RNRRetry)
	c.MinRNRTimer = pick(o.MinRNRTimer, c.MinRNRTimer)
	c.MaxRdAtomic = pick(o.MaxRdAtomic, c.MaxRdAtomic)
	if o.Access != 0 {
		c.Access = o.Access
	}
	c.TrafficClass = o.TrafficClass
	return c
}

// ConnectRC moves a fresh RC (or UC) QP through INIT, RTR and RTS towards
// the remote QP, with the attribute masks ibv_rc_pingpong uses. A QP
// already in INIT (InitQP, to post receives early) starts from there.
//
// When a step fails (a value out of range, an MTU above the port's), the
// error says which attribute and where the QP is: one that was in RESET
// is moved back to RESET; one that was in INIT stays in INIT or, when the
// move to RTS failed, in RTR (its posted receives are kept; the way back
// is a move to RESET, which drops them).
func ConnectRC(q *QP, remote RemoteQP, opts *ConnectOptions) error {
	o := opts.withDefaults()
	remote.Addr = peerAddr(remote.Addr)
	if err := connectRoute(q, remote); err != nil {
		return fmt.Errorf("rxego: connect QP %d: %w", q.Num(), err)
	}
	rc := q.Type() == qp.RC
	steps := []struct {
		attr qp.Attr
		mask qp.AttrMask
	}{
		{qp.Attr{State: qp.Init, Port: 1, AccessFlags: o.Access},
			qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
		{qp.Attr{State: qp.RTR, PathMTU: o.MTU, DestQPN: remote.QPN, RQPSN: remote.PSN, Dest: remote.Addr,
			TrafficClass: o.TrafficClass, MaxDestRdAtomic: o.MaxRdAtomic, MinRNRTimer: o.MinRNRTimer},
			qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN},
		{qp.Attr{State: qp.RTS, SQPSN: o.LocalPSN, Timeout: o.Timeout, RetryCnt: o.RetryCnt, RNRRetry: o.RNRRetry,
			MaxRdAtomic: o.MaxRdAtomic}, qp.AttrState | qp.AttrSQPSN},
	}
	if rc {
		steps[1].mask |= qp.AttrMaxDestRdAtomic | qp.AttrMinRNRTimer
		steps[2].mask |= qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRdAtomic
	}
	start := q.State()
	if start == qp.Init {
		steps = steps[1:] // already initialised, e.g. to post receives early
	}
	for i := range steps {
		if err := q.Modify(&steps[i].attr, steps[i].mask); err != nil {
			return fmt.Errorf("rxego: connect QP %d (%s): %w", q.Num(), rollBack(q, start), err)
		}
	}
	return nil
}

// rollBack undoes a ConnectRC that failed part way, as far as verbs
// allows, and says where the QP is: one that started in RESET goes back
// to RESET (nothing can have been posted); one that started in INIT stays
// where the failed step left it, INIT or RTR, because the only way back
// is RESET, which would drop the receives the application posted.
func rollBack(q *QP, start qp.State) string {
	now := q.State()
	if now == start {
		return "left in " + now.String()
	}
	if start == qp.Reset {
		if err := q.Modify(&qp.Attr{State: qp.Reset}, qp.AttrState); err == nil {
			return "moved back to RESET"
		}
	}
	return "left in " + now.String() + ", not moved back: its posted receives would be dropped"
}

// SetSourceGID makes q's packets to the remote QP leave from the
// device's GID remote.SGIDIndex, for a QP moved to RTR with QP.Modify by
// hand (the sgid_index of the ibv_ah_attr given to ibv_modify_qp);
// ConnectRC does the same itself.
func SetSourceGID(q *QP, remote RemoteQP) error {
	remote.Addr = peerAddr(remote.Addr)
	if err := connectRoute(q, remote); err != nil {
		return fmt.Errorf("rxego: QP %d: %w", q.Num(), err)
	}
	return nil
}

// InitQP moves a fresh RC or UC QP to INIT with the given remote access
// (all of it when 0), so receives can be posted before the connection is
// made, as the rdma-core examples do.
func InitQP(q *QP, access Access) error {
	if access == 0 {
		access = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
	}
	a := qp.Attr{State: qp.Init, Port: 1, AccessFlags: access}
	if err := q.Modify(&a, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags); err != nil {
		return fmt.Errorf("rxego: init QP %d: %w", q.Num(), err)
	}
	return nil
}

// ActivateUD moves a fresh UD QP to RTS with the given Q_Key.
func ActivateUD(q *QP, qkey uint32, sqPSN uint32) error {
	steps := []struct {
		attr qp.Attr
		mask qp.AttrMask
	}{
		{qp.Attr{State: qp.Init, Port: 1, QKey: qkey}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrQKey},
		{qp.Attr{State: qp.RTR}, qp.AttrState},
		{qp.Attr{State: qp.RTS, SQPSN: sqPSN}, qp.AttrState | qp.AttrSQPSN},
	}
	for i := range steps {
		if err := q.Modify(&steps[i].attr, steps[i].mask); err != nil {
			return fmt.Errorf("rxego: activate UD QP %d: %w", q.Num(), err)
		}
	}
	return nil
}
