package mr

import (
	"fmt"
	"sync/atomic"
)

// MWType is a memory window's type (enum ibv_mw_type).
type MWType uint8

// Memory window types. A type 1 window is bound by ibv_bind_mw and
// serves every QP of its PD; a type 2 window (rxe's type 2B) is bound by
// a BIND_MW work request and serves only the QP that bound it.
const (
	MWType1 MWType = 1 // IBV_MW_TYPE_1
	MWType2 MWType = 2 // IBV_MW_TYPE_2
)

// MW is a memory window: an rkey of its own that grants remote access to
// a range of an MR, with rights of its own, and that can be bound,
// rebound and invalidated without touching the MR. Its key lives in the
// MRs' index space, so a peer's rkey names either an MR or a window.
type MW struct {
	t   *Table
	idx uint32
	typ MWType
	// cur is the window's current snapshot, also published in the table.
	cur atomic.Pointer[entry]
}

// AllocMW allocates an unbound window of type typ in the PD
// (ibv_alloc_mw). Until it is bound every access through it fails with
// ErrInvalidated.
func (pd *PD) AllocMW(typ MWType) (*MW, error) {
	if pd == nil {
		return nil, fmt.Errorf("%w: nil PD", ErrInvalidArgument)
	}
	if typ != MWType1 && typ != MWType2 {
		return nil, fmt.Errorf("%w: memory window type %d", ErrInvalidArgument, typ)
	}
	t := pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	idx, key, err := pd.allocLocked()
	if err != nil {
		return nil, err
	}
	w := &MW{t: t, idx: idx, typ: typ}
	e := &entry{key: key, state: stateInvalidated, pd: pd, mw: w, mwType: typ}
	w.cur.Store(e)
	t.slot(idx).Store(e)
	pd.nMW++
	return w, nil
}

// RKey returns the window's current rkey; a bind changes its low byte.
func (w *MW) RKey() uint32 { return w.cur.Load().key }

// Type returns the window's type.
func (w *MW) Type() MWType { return w.typ }

// Bound reports whether the window is bound to an MR.
func (w *MW) Bound() bool { return w.cur.Load().state == stateValid }

// Dealloc unbinds and frees the window (ibv_dealloc_mw). Its rkey fails
// with ErrInvalidKey from then on. Deallocating twice fails with
// ErrInvalidArgument.
func (w *MW) Dealloc() error {
	t := w.t
	t.mu.Lock()
	defer t.mu.Unlock()
	e := w.cur.Load()
	if e.state == stateDeregistered {
		return fmt.Errorf("%w: memory window already deallocated (%w)", ErrClosed, ErrInvalidArgument)
	}
	t.publishWindowLocked(e, e.key, stateDeregistered, nil)
	t.freeIndex(w.idx, uint8(e.key))
	e.pd.nMW--
	return nil
}

// Binding describes a BIND_MW work request (ibv_mw_bind and the bind_mw
// member of ibv_send_wr).
type Binding struct {
	// MW is the window's current rkey.
	MW uint32
	// KeyByte becomes the low byte of the window's rkey (verbs takes it
	// from bind_mw.rkey, which ibv_inc_rkey derives from the old one).
	KeyByte uint8
	// MR is the lkey of the MR to expose; unused when Length is 0.
	MR uint32
	// Addr and Length are the range of the MR the window exposes, in the
	// MR's IOVA space. Length 0 unbinds a type 1 window.
	Addr, Length uint64
	// Access is the window's rights: any of RemoteRead, RemoteWrite,
	// RemoteAtomic, and ZeroBased (type 2 only) to address the window
	// from 0 rather than from Addr.
	Access Access
}

// Bind executes a BIND_MW work request posted on QP qpn of pd and returns
// the window's new rkey. The checks are rxe's (rxe_check_bind_mw) plus the
// PDs: the window and the MR must belong to pd; a type 2 window must be
// unbound (invalidate it first) and the range non-empty; a type 1 window
// cannot be zero-based; the MR must have been registered with MWBind, not
// be zero-based, have LocalWrite if the window grants RemoteWrite or
// RemoteAtomic, and hold [Addr, Addr+Length). A failed bind changes
// nothing.
func (t *Table) Bind(pd *PD, qpn uint32, b Binding) (uint32, error) {
	if b.Access&^(remoteAccess|ZeroBased) != 0 {
		return 0, fmt.Errorf("%w: window access %v", ErrInvalidArgument, b.Access)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.slot(b.MW >> 8)
	if s == nil {
		return 0, ErrInvalidKey
	}
	e := s.Load()
	switch {
	case e == nil || e.mw == nil || e.key != b.MW:
		return 0, ErrInvalidKey
	case e.pd != pd:
		return 0, ErrWrongPD
	case e.mwType == MWType1 && b.Access&ZeroBased != 0:
		return 0, fmt.Errorf("%w: type 1 windows cannot be zero-based", ErrInvalidArgument)
	case e.mwType == MWType2 && e.state == stateValid:
		return 0, fmt.Errorf("%w: type 2 window is bound; invalidate it first", ErrBusy)
	case e.mwType == MWType2 && b.Length == 0:
		return 0, fmt.Errorf("%w: type 2 window bound with length 0", ErrInvalidArgument)
	}
	key := e.key&^0xff | uint32(b.KeyByte)
	if b.Length == 0 { // type 1 unbind
		t.publishWindowLocked(e, key, stateInvalidated, nil)
		return key, nil
	}
	m, err := t.bindTarget(pd, b)
	if err != nil {
		return 0, err
	}
	me := m.cur.Load()
	off := b.Addr - me.iova
	ne := *e
	ne.key, ne.state, ne.access, ne.qpn = key, stateValid, b.Access, 0
	ne.bound, ne.buf, ne.iova = m, me.buf[off:off+b.Length:off+b.Length], b.Addr
	if b.Access&ZeroBased != 0 {
		ne.iova = 0
	}
	if e.mwType == MWType2 {
		ne.qpn = qpn
	}
	t.publishWindowLocked(e, key, stateValid, &ne)
	return key, nil
}

// bindTarget finds and checks the MR a binding exposes. Caller holds t.mu.
func (t *Table) bindTarget(pd *PD, b Binding) (*MR, error) {
	s := t.slot(b.MR >> 8)
	if s == nil {
		return nil, ErrInvalidKey
	}
	e := s.Load()
	switch {
	case e == nil || e.mw != nil || e.key != b.MR:
		return nil, ErrInvalidKey
	case e.state != stateValid:
		return nil, ErrInvalidated
	case e.pd != pd:
		return nil, ErrWrongPD
	case e.access&ZeroBased != 0:
		return nil, fmt.Errorf("%w: windows cannot be bound to a zero-based MR", ErrInvalidArgument)
	case e.access&MWBind == 0:
		return nil, fmt.Errorf("%w: MR lacks MWBind", ErrAccessDenied)
	case b.Access&(RemoteWrite|RemoteAtomic) != 0 && e.access&LocalWrite == 0:
		return nil, fmt.Errorf("%w: writable window on an MR without LocalWrite", ErrAccessDenied)
	}
	size := uint64(len(e.buf))
	if b.Addr < e.iova || b.Addr-e.iova > size || b.Length > size-(b.Addr-e.iova) {
		return nil, ErrOutOfBounds
	}
	return e.owner, nil
}

// invalidateWindowLocked unbinds the window of snapshot e for a LOCAL_INV
// or a SEND with Invalidate. Type 1 windows cannot be invalidated
// (IBA o10-37.2.26): ErrAccessDenied. An unbound window stays unbound.
// Caller holds t.mu.
func (t *Table) invalidateWindowLocked(e *entry) error {
	switch {
	case e.mwType == MWType1:
		return ErrAccessDenied
	case e.state != stateValid:
		return nil
	}
	t.publishWindowLocked(e, e.key, stateInvalidated, nil)
	return nil
}

// publishWindowLocked replaces the window snapshot e: with ne when given
// (a bind), else with a copy of e under key and state, unbound. It keeps
// the bound MRs' window counts. Caller holds t.mu.
func (t *Table) publishWindowLocked(e *entry, key uint32, s state, ne *entry) {
	if ne == nil {
		c := *e
		c.key, c.state = key, s
		c.bound, c.buf, c.iova, c.access, c.qpn = nil, nil, 0, 0, 0
		ne = &c
	}
	if e.bound != nil {
		e.bound.nMW--
	}
	if ne.bound != nil {
		ne.bound.nMW++
	}
	w := e.mw
	w.cur.Store(ne)
	if s == stateDeregistered {
		t.slot(w.idx).Store(nil)
		return
	}
	t.slot(w.idx).Store(ne)
}
