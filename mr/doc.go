// Package mr implements protection domains (PDs) and memory regions (MRs)
// for the rxego engine: registration of application-owned []byte buffers,
// lkey/rkey allocation, and the access checks every local SGE and every
// remote RDMA READ, WRITE and ATOMIC must pass before a byte is touched.
//
// # Keys
//
// A key is 32 bits: the upper 24 bits are the MR's index in its [Table],
// the low 8 bits a random key byte, as RNICs and rdma_rxe do:
//
//	key = index<<8 | keyByte
//
// Index 0 is never used, so key 0 (what peers put in the RETH of a
// zero-length transfer) never matches an MR. Indices handed out in
// sequence with a random key byte (as rxe does, and rxego did) let a
// stale key name the live MR again after a median of about 21
// re-registrations of one MR (about 1 in 255 per registration). Here an index is drawn at random
// among at least four times as many indices as there are live MRs (4095
// for one MR), and the key byte at an index walks a secret shuffle of the
// 256 bytes from a random start. An index hands out at most 255 key bytes
// in its chunk's life; chunks whose indices are half spent retire, and new
// ones take the 4,096 chunk positions in a secret cyclic order, so a key
// comes back only after about 2^31 registrations (none in 20,000,000 with
// one or 1,000 MRs live; docs/reliability.md). The shape index<<8 | key byte is
// kept, so a consumer's key byte (ib_inc_rkey, [MR.Revalidate]) works as
// in verbs; a byte chosen by Revalidate is skipped by the next
// registration at its index.
//
// The lkey and the rkey of an MR are the same value (rxe zeroes the rkey
// of an MR without remote access; here such an MR refuses remote access
// through its access flags instead).
//
// # IOVA
//
// Every MR has an IOVA, the address peers use on the wire. By default it
// is the real address of the buffer's first byte, as with ibv_reg_mr; it
// can be chosen with [WithIOVA] (ibv_reg_mr_iova), or is 0 with
// [ZeroBased]. The IOVA is only arithmetic: memory is reached by slicing
// the registered buffer, never through the address itself.
//
// # Checks
//
// [Table.Remote], [Table.Local] and [Table.Atomic64] check the same things
// as rxe (lookup_mr, then mr_check_range, then the alignment test of
// atomic_reply), in this order, and return the first failure:
//
//  1. key: index in use and key byte equal        -> [ErrInvalidKey]
//  2. state: MR not invalidated                   -> [ErrInvalidated]
//  3. PD: the MR's PD is the QP's PD              -> [ErrWrongPD]
//  4. access: every needed flag granted           -> [ErrAccessDenied]
//  5. bounds: [va, va+length) inside the MR        -> [ErrOutOfBounds]
//  6. atomics only: va and the memory 8-aligned   -> [ErrMisaligned]
//
// rxe folds 1-5 into one "rkey violation" (NAK Remote Access Error,
// IBV_WC_REM_ACCESS_ERR for the requester) and reports a misaligned atomic
// as NAK Invalid Request; the distinct errors here let the engine count
// each reason. Bounds arithmetic is overflow-safe: a range that would wrap
// past 2^64 is out of bounds, length is a full uint32 (a RETH DMA length of
// up to 2^31 is an ordinary case), and a zero-length range that starts
// inside the MR or at its end is always within bounds.
//
// A zero-length RDMA READ or WRITE need not carry a valid rkey or address
// (IBA C9-88; rxe skips check_rkey for it). This package does not apply
// that rule: Remote checks whatever it is given, and the engine is
// expected to skip the call for zero-length transfers.
//
// # Invalidation
//
// Verbs fast-register MRs (IB_WR_REG_MR, IB_WR_LOCAL_INV, SEND with
// Invalidate) are modelled in a simplified way: an MR registered with
// [WithInvalidate] can be invalidated by [Table.Invalidate], after which
// every access fails with [ErrInvalidated] until [MR.Revalidate] makes it
// valid again under a new key byte. The buffer, IOVA and access flags stay
// those given at registration; there is no page-list re-mapping.
//
// # Memory windows
//
// A [MW] (ibv_alloc_mw) has an rkey in the same index space as the MRs.
// [Table.Bind] (a BIND_MW work request; ibv_bind_mw for type 1) points it
// at a range of an MR registered with [MWBind], with rights of its own and
// a new key byte; from then on the window's rkey reaches exactly that
// range with exactly those rights (RemoteRead, RemoteWrite, RemoteAtomic,
// and ZeroBased for type 2 windows, which then start at address 0). The
// lookups check the window as they check an MR, plus: a window key is
// never an lkey, and a type 2 window answers only the QP that bound it
// ([ErrWrongQP]; [Table.RemoteQP] and [Table.Atomic64QP] carry the QP's
// [QPID], which a later QP with the same number does not share), until
// [Table.ReleaseQP] (the QP's destroy or reset) unbinds it. A type 1
// window bound through [MW.NextRKey]'s keys moves to a fresh index after
// 255 rebinds, so its rkeys do not wrap.
// [Table.Invalidate] on a type 2 window's key unbinds it (LOCAL_INV, SEND
// with Invalidate); type 1 windows refuse it (IBA o10-37.2.26) and are
// unbound by a bind of length 0. An MR with bound windows can be neither
// deregistered nor invalidated ([ErrBusy]), so a bound window's memory is
// always that of a valid MR. rxe differs in one point: its responder checks
// the range of a window access against the MR, not the window.
//
// # Concurrency
//
// All methods are safe for concurrent use. Lookups take no lock and do not
// allocate: each index has an atomic pointer to an immutable snapshot of
// its MR, and registration, deregistration, invalidation and revalidation
// (serialised by a mutex) publish a new snapshot. A lookup that starts
// after Deregister or Invalidate has returned fails; a lookup that
// overlapped the call may still succeed, as an in-flight DMA on an RNIC
// may. Buffers are ordinary Go memory, so a slice handed out earlier stays
// memory-safe after deregistration.
package mr
