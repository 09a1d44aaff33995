package mr

import "errors"

// Access-check failures, one per reason so the engine can count drops and
// pick NAK codes and completion statuses. Lookups return these values
// unwrapped (no allocation); compare with == or errors.Is.
var (
	// ErrInvalidKey: no MR at the key's index, or the key byte differs
	// (stale, guessed or corrupted key).
	ErrInvalidKey = errors.New("mr: invalid key")
	// ErrInvalidated: the MR has been invalidated and not revalidated.
	ErrInvalidated = errors.New("mr: memory region invalidated")
	// ErrWrongPD: the MR belongs to another protection domain.
	ErrWrongPD = errors.New("mr: protection domain mismatch")
	// ErrWrongQP: a type 2 memory window bound to another QP.
	ErrWrongQP = errors.New("mr: memory window bound to another QP")
	// ErrAccessDenied: the MR lacks a needed access flag, or the MR was
	// not registered as invalidatable.
	ErrAccessDenied = errors.New("mr: access denied")
	// ErrOutOfBounds: the range is not inside the MR.
	ErrOutOfBounds = errors.New("mr: out of bounds")
	// ErrMisaligned: an atomic's VA or the memory behind it is not
	// 8-byte aligned.
	ErrMisaligned = errors.New("mr: misaligned atomic")
)

// Errors from management calls (registration, deallocation and so on).
// They come wrapped with detail; test with errors.Is.
var (
	// ErrInvalidArgument: a malformed request, such as RemoteWrite without
	// LocalWrite, a nil or deallocated PD, or a double Deregister
	// (EINVAL in verbs).
	ErrInvalidArgument = errors.New("mr: invalid argument")
	// ErrUnsupported: an access flag this package does not implement
	// (OnDemand or an unknown bit; EOPNOTSUPP in verbs).
	ErrUnsupported = errors.New("mr: unsupported")
	// ErrBusy: a PD still has registered MRs or windows, an MR still has
	// windows bound, or a type 2 window is bound already (EBUSY in verbs).
	ErrBusy = errors.New("mr: busy")
	// ErrTableFull: all 2^24-1 MR indices are in use (ENOMEM in verbs).
	ErrTableFull = errors.New("mr: table full")
	// ErrClosed: a second Deregister or Dealloc, on the os.File rule that
	// rxego applies to every object (a second Close returns ErrClosed);
	// such errors wrap ErrInvalidArgument too, verbs' EINVAL. qp.ErrClosed
	// and rxego.ErrClosed are this error.
	ErrClosed = errors.New("rxego: closed")
)
