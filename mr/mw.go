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

// QPID identifies one QP, for type 2 windows, which serve only the QP
// that bound them. Unlike a QP number it is never reused: not by a QP
// created later under the same number, nor by the same QP after a reset
// (the qp package hands out a new one each time), so a window bound by a
// QP cannot serve whatever comes after it (rxe holds a reference to the
// QP object). 0 is no QP.
type QPID uint64

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
	// Type 1 only, guarded by t.mu: binds counts the key bytes used at idx,
	// and next is a key at a fresh index NextRKey reserved (0: none).
	binds int
	next  uint32
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
	w := &MW{t: t, idx: idx, typ: typ, binds: 1}
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
	if w.next != 0 {
		t.slot(w.next >> 8).Store(nil)
		t.freeIndex(w.next>>8, uint8(w.next))
		w.next = 0
	}
	e.pd.nMW--
	return nil
}

// NextRKey returns the rkey the next ibv_bind_mw of type 1 window w
// gives it: ibv_inc_rkey of the current one, except when that would
// bring back a key byte already used at the window's index (after 255
// rebinds there), when it is a key at a fresh index, reserved for w until
// a bind uses it (rxe's keys come back after 256 rebinds). It fails with
// ErrInvalidArgument for a type 2 window (its keys are the binder's) or a
// deallocated one, and with ErrTableFull when no index is free.
func (w *MW) NextRKey() (uint32, error) {
	t := w.t
	t.mu.Lock()
	defer t.mu.Unlock()
	e := w.cur.Load()
	switch {
	case w.typ != MWType1:
		return 0, fmt.Errorf("%w: type 2 window keys are chosen by the binder", ErrInvalidArgument)
	case e.state == stateDeregistered:
		return 0, fmt.Errorf("%w: memory window deallocated", ErrInvalidArgument)
	case w.next != 0:
		return w.next, nil
	case w.binds < 256:
		return e.key&^0xff | (e.key+1)&0xff, nil
	}
	idx, keyByte, err := t.allocIndex()
	if err != nil {
		return 0, err
	}
	w.next = idx<<8 | uint32(keyByte)
	// The reserved index holds an unbound snapshot of w, so that no MR
	// takes it and its key is refused as invalidated until the bind.
	r := *e
	r.key, r.state = w.next, stateInvalidated
	r.bound, r.buf, r.iova, r.access, r.qp = nil, nil, 0, 0, 0
	t.slot(idx).Store(&r)
	return w.next, nil
}

// Binding describes a BIND_MW work request (ibv_mw_bind and the bind_mw
// member of ibv_send_wr).
type Binding struct {
	// MW is the window's current rkey.
	MW uint32
	// RKey, when it is the key MW.NextRKey reserved for a type 1 window,
	// moves the window there; otherwise only KeyByte counts.
	RKey uint32
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

// Bind executes a BIND_MW work request posted on QP qp of pd and returns
// the window's new rkey. The checks are rxe's (rxe_check_bind_mw) plus the
// PDs: the window and the MR must belong to pd; a type 2 window must be
// unbound (invalidate it first) and the range non-empty; a type 1 window
// cannot be zero-based; the MR must have been registered with MWBind, not
// be zero-based, have LocalWrite if the window grants RemoteWrite or
// RemoteAtomic, and hold [Addr, Addr+Length). A failed bind changes
// nothing.
func (t *Table) Bind(pd *PD, qp QPID, b Binding) (uint32, error) {
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
	case e == nil || e.mw == nil || e.key != b.MW || e.mw.cur.Load() != e: // not a key NextRKey reserved
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
	move := e.mwType == MWType1 && e.mw.next != 0 && b.RKey == e.mw.next
	if move {
		key = b.RKey
	}
	var ne *entry
	if b.Length > 0 {
		m, err := t.bindTarget(pd, b)
		if err != nil {
			return 0, err
		}
		me := m.cur.Load()
		off := b.Addr - me.iova
		c := *e
		c.key, c.state, c.access, c.qp = key, stateValid, b.Access, 0
		c.bound, c.buf, c.iova = m, me.buf[off:off+b.Length:off+b.Length], b.Addr
		if b.Access&ZeroBased != 0 {
			c.iova = 0
		}
		if e.mwType == MWType2 {
			c.qp = qp
		}
		ne = &c
	}
	if move {
		e = t.moveWindowLocked(e)
	} else if key != e.key {
		e.mw.binds++
	}
	if ne == nil { // type 1 unbind
		t.publishWindowLocked(e, key, stateInvalidated, nil)
	} else {
		t.publishWindowLocked(e, key, stateValid, ne)
	}
	return key, nil
}

// moveWindowLocked moves the window of snapshot e to the index NextRKey
// reserved and frees its old index; it returns the snapshot now at the
// new index, to be replaced by the bind. Caller holds t.mu.
func (t *Table) moveWindowLocked(e *entry) *entry {
	w := e.mw
	t.slot(w.idx).Store(nil)
	t.freeIndex(w.idx, uint8(e.key))
	r := *e // keeps e's binding, so that publishing keeps the MR counts
	r.key = w.next
	w.idx, w.next, w.binds = w.next>>8, 0, 1
	return &r
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
		c.bound, c.buf, c.iova, c.access, c.qp = nil, nil, 0, 0, 0
		ne = &c
	}
	if e.bound != nil {
		e.bound.nMW--
	}
	if ne.bound != nil {
		ne.bound.nMW++
	}
	w := e.mw
	if e.qp != 0 {
		delete(t.qpWindows[e.qp], w)
		if len(t.qpWindows[e.qp]) == 0 {
			delete(t.qpWindows, e.qp)
		}
	}
	if ne.qp != 0 {
		ws := t.qpWindows[ne.qp]
		if ws == nil {
			ws = make(map[*MW]struct{})
			t.qpWindows[ne.qp] = ws
		}
		ws[w] = struct{}{}
	}
	w.cur.Store(ne)
	if s == stateDeregistered {
		t.slot(w.idx).Store(nil)
		return
	}
	t.slot(w.idx).Store(ne)
}

// ReleaseQP invalidates every type 2 window bound to QP qp, for a QP that
// is destroyed or reset: a window must not outlive the QP that bound it
// (IBA 10.6.7.2.5; rxe keeps the QP object alive instead, and the window
// bound to it). The windows stay allocated, unbound; it returns how many
// there were.
func (t *Table) ReleaseQP(qp QPID) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	ws := t.qpWindows[qp]
	for w := range ws {
		e := w.cur.Load()
		t.publishWindowLocked(e, e.key, stateInvalidated, nil)
	}
	return len(ws)
}
