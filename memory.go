package rxego

import "github.com/rxego/rxego/mr"

// MR is a registered memory region (ibv_mr): the application's buffer,
// named by its lkey in work requests and by its rkey in peers' RDMA
// operations. It wraps package mr's region, so the registration
// machinery behind it (the key table, lookups, atomics) is not part of
// the API, and its errors read "rxego: ..." like every other call's.
type MR struct {
	m  *mr.MR
	pd *PD
}

// LKey is the key that names the MR in local work requests (SGE.LKey).
func (m *MR) LKey() uint32 { return m.m.LKey() }

// RKey is the key a peer names the MR by in RDMA operations (equal to
// LKey, as rxe's).
func (m *MR) RKey() uint32 { return m.m.RKey() }

// IOVA is the address peers use for the MR's first byte: the buffer's
// real address, or 0 when it was registered with AccessZeroBased.
func (m *MR) IOVA() uint64 { return m.m.IOVA() }

// Len is the MR's length in bytes.
func (m *MR) Len() int { return m.m.Len() }

// Access is the rights the MR was registered with.
func (m *MR) Access() Access { return m.m.Access() }

// Buffer is the registered memory itself.
func (m *MR) Buffer() []byte { return m.m.Buffer() }

// PD is the protection domain the MR was registered in.
func (m *MR) PD() *PD { return m.pd }

// Deregister removes the MR (ibv_dereg_mr): operations that look its
// keys up from then on fail. Deregistering twice fails with
// ErrInvalidArgument.
func (m *MR) Deregister() error { return apiErr(m.m.Deregister()) }

// Revalidate makes an MR invalidated by LOCAL_INV or a SEND with
// Invalidate valid again under key byte keyByte, like a fast-register
// work request with a bumped key (ib_inc_rkey), and returns the new key.
// keyByte must differ from the current one, so keys held from before
// the invalidation keep failing; an MR that is not invalidated fails
// with ErrInvalidArgument.
func (m *MR) Revalidate(keyByte uint8) (uint32, error) {
	k, err := m.m.Revalidate(keyByte)
	return k, apiErr(err)
}

// MW is a memory window (ibv_mw): a range of an MR exposed under an rkey
// of its own. It wraps package mr's window, as MR wraps its region.
type MW struct{ w *mr.MW }

// RKey is the window's current rkey.
func (w *MW) RKey() uint32 { return w.w.RKey() }

// Type is MWType1 or MWType2.
func (w *MW) Type() MWType { return w.w.Type() }

// Bound reports whether the window is bound to an MR.
func (w *MW) Bound() bool { return w.w.Bound() }

// Dealloc unbinds and frees the window (ibv_dealloc_mw): its rkey fails
// from then on. Deallocating twice fails with ErrInvalidArgument.
func (w *MW) Dealloc() error { return apiErr(w.w.Dealloc()) }

// NextRKey returns the rkey to bind a type 1 window with, reserved for w
// until a bind uses it (see mr.MW.NextRKey for how keys come back). It
// fails with ErrInvalidArgument for a type 2 window, whose keys are the
// binder's, or a deallocated one.
func (w *MW) NextRKey() (uint32, error) {
	k, err := w.w.NextRKey()
	return k, apiErr(err)
}
