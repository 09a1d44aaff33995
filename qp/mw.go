package qp

import (
	"fmt"

	"github.com/rxego/rxego/mr"
)

// MWBind is what a BIND_MW work request binds (ibv_send_wr's bind_mw: the
// window, its new rkey and ibv_mw_bind_info).
type MWBind struct {
	// MW is the window's current rkey.
	MW uint32
	// RKey is the window's rkey after the bind; only its low byte is
	// free to choose (ibv_inc_rkey(MW) is the usual pick), except that a
	// type 1 window takes a key its mr.MW.NextRKey reserved whole.
	RKey uint32
	// MR is the lkey of the MR the window exposes; unused when Length is
	// 0 (which unbinds a type 1 window).
	MR uint32
	// Addr and Length are the exposed range, in the MR's IOVA space.
	Addr, Length uint64
	// Access is the window's rights (remote flags, and mr.ZeroBased for a
	// type 2 window addressed from 0).
	Access mr.Access
}

// bindMW executes a BIND_MW work request.
func (e *Engine) bindMW(q *QP, b *MWBind) error {
	_, err := e.cfg.MRs.Bind(q.pd, q.id, mr.Binding{MW: b.MW, RKey: b.RKey, KeyByte: uint8(b.RKey), MR: b.MR,
		Addr: b.Addr, Length: b.Length, Access: b.Access})
	return err
}

// IncRKey returns key with its low (key) byte incremented, as
// ibv_inc_rkey: the usual new rkey of a bind.
func IncRKey(key uint32) uint32 { return key&^0xff | (key+1)&0xff }

// BindMW binds type 1 window w to [addr, addr+length) of m with the given
// rights, as ibv_bind_mw: it posts a BIND_MW work request with ID id and
// flags (SendSignaled asks for a WCBindMW completion) and returns the rkey
// the window will have once the request has executed (mr.MW.NextRKey: the
// key byte incremented, or after 255 rebinds a key at a fresh index, so
// that no rkey of the window comes back). length 0 unbinds
// the window (m may then be nil). Type 2 windows are bound by posting a
// BIND_MW work request directly.
func (q *QP) BindMW(w *mr.MW, id uint64, flags SendFlags, m *mr.MR, addr, length uint64, access mr.Access) (uint32, error) {
	if w == nil || w.Type() != mr.MWType1 {
		return 0, fmt.Errorf("%w: BindMW takes a type 1 window", ErrInvalidWR)
	}
	b := MWBind{MW: w.RKey(), Addr: addr, Length: length, Access: access}
	next, err := w.NextRKey()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalidWR, err)
	}
	b.RKey = next
	if length > 0 {
		if m == nil {
			return 0, fmt.Errorf("%w: BindMW of %d bytes without an MR", ErrInvalidWR, length)
		}
		b.MR = m.LKey()
	}
	if err := q.PostSend(SendWR{ID: id, Opcode: WRBindMW, Flags: flags, Bind: b}); err != nil {
		return 0, err
	}
	return b.RKey, nil
}
