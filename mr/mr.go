package mr

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// state is the life-cycle state of an MR.
type state uint8

const (
	stateValid        state = iota
	stateInvalidated        // by Invalidate; Revalidate makes it valid again
	stateDeregistered       // final
)

// entry is an immutable snapshot of an MR. Changes publish a new entry,
// so lookups read a consistent MR without a lock.
type entry struct {
	key          uint32
	state        state
	invalidating bool // may be invalidated (WithInvalidate)
	access       Access
	pd           *PD
	owner        *MR
	iova         uint64
	buf          []byte
	// Memory windows only (mw.go): the window, its type, the QP a type 2
	// window is bound to and the MR it exposes (nil while unbound).
	mw     *MW
	mwType MWType
	qp     QPID
	bound  *MR
}

// MR is a registered memory region over an application-owned buffer.
type MR struct {
	t   *Table
	idx uint32
	nMW int // windows bound to the MR; guarded by t.mu
	// cur is the MR's current snapshot; while registered it is also the
	// one published in the table.
	cur atomic.Pointer[entry]
}

// Option changes how Register sets up an MR.
type Option func(*options)

type options struct {
	iova       uint64
	iovaSet    bool
	invalidate bool
}

// WithIOVA sets the MR's IOVA, the address peers use to reach its first
// byte (ibv_reg_mr_iova). It cannot be combined with ZeroBased, and
// IOVA+len(buf) must not exceed 2^64-1.
func WithIOVA(iova uint64) Option {
	return func(o *options) { o.iova, o.iovaSet = iova, true }
}

// WithInvalidate lets Table.Invalidate (local invalidate, or SEND with
// Invalidate from a peer) invalidate the MR, modelling a verbs
// fast-register MR.
func WithInvalidate() Option {
	return func(o *options) { o.invalidate = true }
}

// Register registers buf in the PD with the given access flags. The MR's
// key is fresh (see the package comment) and its IOVA is the address of
// buf's first byte unless WithIOVA or ZeroBased says otherwise. buf may
// be empty. The application must keep buf for as long as peers may use it;
// the table keeps a reference, so the memory stays valid regardless.
func (pd *PD) Register(buf []byte, access Access, opts ...Option) (*MR, error) {
	if pd == nil {
		return nil, fmt.Errorf("%w: nil PD", ErrInvalidArgument)
	}
	if err := access.validate(); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	iova := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	switch {
	case o.iovaSet && access&ZeroBased != 0:
		return nil, fmt.Errorf("%w: WithIOVA and ZeroBased together", ErrInvalidArgument)
	case o.iovaSet:
		iova = o.iova
	case access&ZeroBased != 0:
		iova = 0
	}
	// The end address must fit in 64 bits (at most 2^64-1), so no
	// in-bounds access can wrap either.
	if iova+uint64(len(buf)) < iova {
		return nil, fmt.Errorf("%w: IOVA %#x + length %d wraps", ErrInvalidArgument, iova, len(buf))
	}

	t := pd.t
	t.mu.Lock()
	defer t.mu.Unlock()
	idx, key, err := pd.allocLocked()
	if err != nil {
		return nil, err
	}
	m := &MR{t: t, idx: idx}
	e := &entry{
		key:          key,
		state:        stateValid,
		invalidating: o.invalidate,
		access:       access,
		pd:           pd,
		owner:        m,
		iova:         iova,
		buf:          buf,
	}
	m.cur.Store(e)
	t.slot(idx).Store(e)
	pd.nMR++
	t.mrs.Add(1)
	return m, nil
}

// Deregister removes the MR. Lookups that start after it returns fail with
// ErrInvalidKey. Deregistering twice fails with ErrInvalidArgument.
func (m *MR) Deregister() error {
	t := m.t
	t.mu.Lock()
	defer t.mu.Unlock()
	e := m.cur.Load()
	if e.state == stateDeregistered {
		return fmt.Errorf("%w: MR already deregistered (%w)", ErrClosed, ErrInvalidArgument)
	}
	if m.nMW > 0 {
		// rxe refuses too: a bound window's lookups rely on its MR.
		return fmt.Errorf("%w: %d memory windows bound to the MR", ErrBusy, m.nMW)
	}
	t.publishLocked(e, e.key, stateDeregistered)
	t.freeIndex(m.idx, uint8(e.key))
	e.pd.nMR--
	t.mrs.Add(-1)
	return nil
}

// Invalidate invalidates the MR whose lkey/rkey is key, for a local
// invalidate work request or a SEND with Invalidate (IETH) received on a
// QP of pd. It fails with ErrInvalidKey, ErrWrongPD, ErrAccessDenied
// if the MR was not registered WithInvalidate, or ErrBusy while memory
// windows are bound to it. Invalidating an MR that is already invalidated
// succeeds and changes nothing (as rxe does). A key that names a memory
// window invalidates the window instead (see MW).
func (t *Table) Invalidate(key uint32, pd *PD) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.slot(key >> 8)
	if s == nil {
		return ErrInvalidKey
	}
	e := s.Load()
	switch {
	case e == nil || e.key != key:
		return ErrInvalidKey
	case e.pd != pd:
		return ErrWrongPD
	case e.mw != nil:
		return t.invalidateWindowLocked(e)
	case !e.invalidating:
		return ErrAccessDenied
	case e.owner.nMW > 0:
		return ErrBusy
	case e.state == stateInvalidated:
		return nil
	}
	t.publishLocked(e, e.key, stateInvalidated)
	return nil
}

// Revalidate makes an invalidated MR valid again under key byte keyByte,
// like a fast-register work request with a bumped key (ib_inc_rkey), and
// returns the new key. keyByte must differ from the current one, so keys
// held from before the invalidation keep failing. The MR must be
// invalidated (ErrInvalidArgument otherwise).
func (m *MR) Revalidate(keyByte uint8) (uint32, error) {
	t := m.t
	t.mu.Lock()
	defer t.mu.Unlock()
	e := m.cur.Load()
	switch {
	case e.state != stateInvalidated:
		return 0, fmt.Errorf("%w: MR is not invalidated", ErrInvalidArgument)
	case uint8(e.key) == keyByte:
		return 0, fmt.Errorf("%w: key byte %#x is the current one", ErrInvalidArgument, keyByte)
	}
	key := m.idx<<8 | uint32(keyByte)
	t.publishLocked(e, key, stateValid)
	return key, nil
}

// publishLocked makes a copy of e with a new key and state the current
// snapshot of its MR and, unless it is deregistered, of its table slot.
// Caller holds t.mu.
func (t *Table) publishLocked(e *entry, key uint32, s state) {
	ne := *e
	ne.key, ne.state = key, s
	ne.owner.cur.Store(&ne)
	if s == stateDeregistered {
		t.slot(e.owner.idx).Store(nil)
		return
	}
	t.slot(e.owner.idx).Store(&ne)
}

// LKey returns the key local SGEs use to name the MR.
func (m *MR) LKey() uint32 { return m.cur.Load().key }

// RKey returns the key peers use to name the MR; it equals LKey.
func (m *MR) RKey() uint32 { return m.cur.Load().key }

// IOVA returns the address of the MR's first byte as seen on the wire.
func (m *MR) IOVA() uint64 { return m.cur.Load().iova }

// Len returns the MR's length in bytes.
func (m *MR) Len() int { return len(m.cur.Load().buf) }

// Access returns the flags the MR was registered with.
func (m *MR) Access() Access { return m.cur.Load().access }

// Buffer returns the registered buffer.
func (m *MR) Buffer() []byte { return m.cur.Load().buf }

// PD returns the MR's protection domain.
func (m *MR) PD() *PD { return m.cur.Load().pd }
