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
}

// ConnectOptions tune ConnectRC and ConnectUC; nil means the defaults of
// ibv_rc_pingpong: MTU 1024, timeout 14, retry 7, rnr_retry 7,
// min_rnr_timer 12, one outstanding READ/atomic, all remote access.
type ConnectOptions struct {
	MTU          MTU
	LocalPSN     uint32
	Timeout      uint8
	RetryCnt     uint8
	RNRRetry     uint8
	MinRNRTimer  uint8
	MaxRdAtomic  uint8
	Access       Access
	TrafficClass uint8
}

func (o *ConnectOptions) withDefaults() ConnectOptions {
	c := ConnectOptions{MTU: qp.MTU1024, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, MaxRdAtomic: 1,
		Access: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic}
	if o == nil {
		return c
	}
	if o.MTU != 0 {
		c.MTU = o.MTU
	}
	c.LocalPSN = o.LocalPSN
	if o.Timeout != 0 {
		c.Timeout = o.Timeout
	}
	if o.RetryCnt != 0 {
		c.RetryCnt = o.RetryCnt
	}
	if o.RNRRetry != 0 {
		c.RNRRetry = o.RNRRetry
	}
	if o.MinRNRTimer != 0 {
		c.MinRNRTimer = o.MinRNRTimer
	}
	if o.MaxRdAtomic != 0 {
		c.MaxRdAtomic = o.MaxRdAtomic
	}
	if o.Access != 0 {
		c.Access = o.Access
	}
	c.TrafficClass = o.TrafficClass
	return c
}

// ConnectRC moves a fresh RC (or UC) QP through INIT, RTR and RTS towards
// the remote QP, with the attribute masks ibv_rc_pingpong uses.
func ConnectRC(q *QP, remote RemoteQP, opts *ConnectOptions) error {
	o := opts.withDefaults()
	remote.Addr = Unmap(remote.Addr)
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
	if q.State() == qp.Init {
		steps = steps[1:] // already initialised, e.g. to post receives early
	}
	for i := range steps {
		if err := q.Modify(&steps[i].attr, steps[i].mask); err != nil {
			return fmt.Errorf("rxego: connect QP %d: %w", q.Num(), err)
		}
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
