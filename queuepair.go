package rxego

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/qp"
)

// QP is a queue pair (ibv_qp), made by PD.CreateQP in the RESET state.
// Connect moves an RC or UC QP to RTS towards its peer, ActivateUD a UD
// QP; Modify is ibv_modify_qp for everything else. Its methods are safe
// for concurrent use.
type QP struct {
	q   *qp.QP
	dev *Device
	pd  *PD
}

// Num returns the QP number (ibv_qp.qp_num).
func (q *QP) Num() uint32 { return q.q.Num() }

// Type returns RC, UC or UD.
func (q *QP) Type() QPType { return q.q.Type() }

// PD returns the protection domain the QP was created in.
func (q *QP) PD() *PD { return q.pd }

// Caps returns the QP's queue sizes as created (ibv_qp_cap).
func (q *QP) Caps() Caps { return q.q.Caps() }

// State returns the QP's state (ibv_qp_attr.qp_state).
func (q *QP) State() QPState { return q.q.State() }

// Query returns the QP's attributes (ibv_query_qp).
func (q *QP) Query() QPAttr { return q.q.Query() }

// Modify changes the QP's state and the attributes mask selects, under
// ibv_modify_qp's rules (docs/verbs.md); on error nothing changes and the
// error wraps ErrInvalidModify. A peer's address (QPAttr.Dest) is
// normalised as everywhere (Unmap).
func (q *QP) Modify(a *QPAttr, mask AttrMask) error { return apiErr(q.q.Modify(a, mask)) }

// PostSend posts send work requests (ibv_post_send). The whole batch is
// checked first: on error (wrapping ErrInvalidWR, ErrQueueFull or
// ErrClosed) nothing is posted, where verbs would keep the WRs before the
// bad one.
func (q *QP) PostSend(wrs ...SendWR) error { return apiErr(q.q.PostSend(wrs...)) }

// PostRecv posts receive work requests (ibv_post_recv); as PostSend, all
// or nothing.
func (q *QP) PostRecv(wrs ...RecvWR) error { return apiErr(q.q.PostRecv(wrs...)) }

// BindMW binds type 1 window w to [addr, addr+length) of m with the given
// rights (ibv_bind_mw): it posts a BIND_MW work request with ID id and
// flags (SendSignaled asks for a WCBindMW completion) and returns the rkey
// the window will have once the request has executed. length 0 unbinds
// the window (m may then be nil). Type 2 windows are bound by posting a
// WRBindMW work request.
func (q *QP) BindMW(w *MW, id uint64, flags SendFlags, m *MR, addr, length uint64, access Access) (uint32, error) {
	if w == nil {
		return 0, fmt.Errorf("%w: BindMW without a window", ErrInvalidArgument)
	}
	var region *mr.MR
	if m != nil {
		region = m.m
	}
	k, err := q.q.BindMW(w.w, id, flags, region, addr, length, access)
	return k, apiErr(err)
}

// CongestionStats returns the QP's DCQCN figures; ok is false when
// congestion control is off (Options.Congestion).
func (q *QP) CongestionStats() (s CCStats, ok bool) { return q.q.CongestionStats() }

// Destroy destroys the QP (ibv_destroy_qp): outstanding work requests are
// dropped without completions (Modify it to StateErr first to have them
// complete with WR_FLUSH_ERR). It fails with ErrBusy while the QP is
// attached to a multicast group, and with ErrClosed the second time.
func (q *QP) Destroy() error {
	return apiErr(q.q.Destroy()) // the device forgets it (Options' Destroyed hook)
}

// Connect moves a fresh RC (or UC) QP through INIT, RTR and RTS towards
// the remote QP, with the attribute masks ibv_rc_pingpong uses; a QP
// already in INIT (Init, to post receives early) starts from there. Its
// packets leave from the device's GID remote.SGIDIndex.
//
// When a step fails (a value out of range, an MTU above the port's), the
// error says which attribute and where the QP is: one that was in RESET
// is moved back to RESET; one that was in INIT stays in INIT or, when the
// move to RTS failed, in RTR (its posted receives are kept; the way back
// is a move to RESET, which drops them).
func (q *QP) Connect(remote RemoteQP, opts *ConnectOptions) error {
	o := opts.withDefaults()
	remote.Addr = peerAddr(remote.Addr)
	if err := q.connectRoute(remote); err != nil {
		return fmt.Errorf("rxego: connect QP %d: %w", q.Num(), err)
	}
	rc := q.Type() == RC
	steps := []struct {
		attr QPAttr
		mask AttrMask
	}{
		{QPAttr{State: StateInit, Port: 1, AccessFlags: o.Access},
			AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{QPAttr{State: StateRTR, PathMTU: o.MTU, DestQPN: remote.QPN, RQPSN: remote.PSN, Dest: remote.Addr,
			TrafficClass: o.TrafficClass, MaxDestRdAtomic: o.MaxRdAtomic, MinRNRTimer: o.MinRNRTimer},
			AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN},
		{QPAttr{State: StateRTS, SQPSN: o.LocalPSN, Timeout: o.Timeout, RetryCnt: o.RetryCnt, RNRRetry: o.RNRRetry,
			MaxRdAtomic: o.MaxRdAtomic}, AttrState | AttrSQPSN},
	}
	if rc {
		steps[1].mask |= AttrMaxDestRdAtomic | AttrMinRNRTimer
		steps[2].mask |= AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic
	}
	start := q.State()
	if start == StateInit {
		steps = steps[1:] // already initialised, e.g. to post receives early
	}
	for i := range steps {
		if err := q.q.Modify(&steps[i].attr, steps[i].mask); err != nil {
			return apiErr(fmt.Errorf("rxego: connect QP %d (%s): %w", q.Num(), q.rollBack(start), err))
		}
	}
	return nil
}

// rollBack undoes a Connect that failed part way, as far as verbs
// allows, and says where the QP is: one that started in RESET goes back
// to RESET (nothing can have been posted); one that started in INIT stays
// where the failed step left it, INIT or RTR, because the only way back
// is RESET, which would drop the receives the application posted.
func (q *QP) rollBack(start QPState) string {
	now := q.State()
	if now == start {
		return "left in " + now.String()
	}
	if start == StateReset {
		if err := q.q.Modify(&QPAttr{State: StateReset}, AttrState); err == nil {
			return "moved back to RESET"
		}
	}
	return "left in " + now.String() + ", not moved back: its posted receives would be dropped"
}

// SetSourceGID makes the QP's packets to the remote QP leave from the
// device's GID remote.SGIDIndex, for a QP moved to RTR with Modify by
// hand (the sgid_index of the ibv_ah_attr given to ibv_modify_qp);
// Connect does the same itself.
func (q *QP) SetSourceGID(remote RemoteQP) error {
	remote.Addr = peerAddr(remote.Addr)
	if err := q.connectRoute(remote); err != nil {
		return fmt.Errorf("rxego: QP %d: %w", q.Num(), err)
	}
	return nil
}

// connectRoute records that the QP's packets to remote leave from its
// SGIDIndex; the route goes with the last QP that set it.
func (q *QP) connectRoute(remote RemoteQP) error {
	if q.q.Destroyed() {
		return fmt.Errorf("QP destroyed: %w", ErrClosed)
	}
	if err := q.dev.check(); err != nil {
		if remote.SGIDIndex != 0 {
			return fmt.Errorf("SGID index %d on a QP of no open device", remote.SGIDIndex)
		}
		return nil
	}
	if err := q.dev.dev.SetRoute(remote.Addr, remote.QPN, remote.SGIDIndex, q.q); err != nil {
		return err
	}
	if q.q.Destroyed() { // destroyed meanwhile, maybe before the route was set
		q.dev.dev.ForgetQP(q.q)
		return fmt.Errorf("QP destroyed: %w", ErrClosed)
	}
	return nil
}

// Init moves a fresh RC or UC QP to INIT with the given remote access
// (all of it when 0), so receives can be posted before the connection is
// made, as the rdma-core examples do.
func (q *QP) Init(access Access) error {
	if access == 0 {
		access = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
	}
	a := QPAttr{State: StateInit, Port: 1, AccessFlags: access}
	if err := q.q.Modify(&a, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags); err != nil {
		return apiErr(fmt.Errorf("rxego: init QP %d: %w", q.Num(), err))
	}
	return nil
}

// ActivateUD moves a fresh UD QP to RTS with the given Q_Key and first
// send PSN.
func (q *QP) ActivateUD(qkey uint32, sqPSN uint32) error {
	steps := []struct {
		attr QPAttr
		mask AttrMask
	}{
		{QPAttr{State: StateInit, Port: 1, QKey: qkey}, AttrState | AttrPKeyIndex | AttrPort | AttrQKey},
		{QPAttr{State: StateRTR}, AttrState},
		{QPAttr{State: StateRTS, SQPSN: sqPSN}, AttrState | AttrSQPSN},
	}
	for i := range steps {
		if err := q.q.Modify(&steps[i].attr, steps[i].mask); err != nil {
			return apiErr(fmt.Errorf("rxego: activate UD QP %d: %w", q.Num(), err))
		}
	}
	return nil
}

// AttachMcast attaches the UD QP to the multicast group mgid
// (ibv_attach_mcast): an IPv4-mapped (::ffff:224.0.0.0/100) or IPv6
// (ff00::/8) multicast GID, or the IPv4 group itself. The device joins
// the group on its first GID of that family; attaching a QP twice is
// allowed and changes nothing. The group's socket is made in the network
// namespace of the calling thread, as Open's are.
func (q *QP) AttachMcast(mgid netip.Addr) error {
	g, err := q.mcastArgs(mgid)
	if err != nil {
		return err
	}
	return apiErr(q.dev.dev.AttachMcast(q.q, g))
}

// DetachMcast detaches the QP from the group (ibv_detach_mcast); the
// device leaves the group when no QP is attached any more. Detaching a QP
// that is not attached fails. While the QP is attached to any group,
// Destroy fails with ErrBusy (verbs: EBUSY) and changes nothing;
// Device.Close detaches and destroys all the same.
func (q *QP) DetachMcast(mgid netip.Addr) error {
	g, err := q.mcastArgs(mgid)
	if err != nil {
		return err
	}
	return apiErr(q.dev.dev.DetachMcast(q.q, g))
}

// mcastArgs checks an attach or detach and returns the group address.
func (q *QP) mcastArgs(mgid netip.Addr) (netip.Addr, error) {
	g := mgid.Unmap()
	if !g.IsMulticast() {
		return g, fmt.Errorf("rxego: %v is not a multicast GID", mgid)
	}
	if q == nil || q.Type() != UD {
		return g, errors.New("rxego: only UD QPs attach to multicast groups")
	}
	if q.q.Destroyed() {
		return g, fmt.Errorf("rxego: QP %d was destroyed: %w", q.Num(), ErrClosed)
	}
	return g, q.dev.check()
}
