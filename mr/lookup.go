package mr

// Remote checks a peer's access to [va, va+length) of the MR named by rkey
// for a request arriving on a QP of pd, and returns exactly that part of
// the buffer (capacity capped, so appending cannot reach past it).
// need is what the request does: RemoteRead for RDMA READ, RemoteWrite for
// RDMA WRITE and ATOMIC WRITE, RemoteAtomic for CmpSwap and FetchAdd; it
// must be non-empty and remote-only (ErrInvalidArgument otherwise).
// Errors are the unwrapped sentinels listed in the package comment.
// Zero-length transfers are checked like any other; see the package
// comment for IBA C9-88. Remote does not allocate. It serves no type 2
// window (those answer only their QP): the engine calls RemoteQP.
func (t *Table) Remote(rkey uint32, pd *PD, va uint64, length uint32, need Access) ([]byte, error) {
	return t.RemoteQP(rkey, pd, 0, va, length, need)
}

// RemoteQP is Remote for a request arriving on QP qp, so that a type 2
// memory window bound to that QP serves it (ErrWrongQP for another QP).
func (t *Table) RemoteQP(rkey uint32, pd *PD, qp QPID, va uint64, length uint32, need Access) ([]byte, error) {
	if need == 0 || need&^remoteAccess != 0 {
		return nil, ErrInvalidArgument
	}
	return t.lookup(rkey, pd, qp, va, length, need)
}

// localQP stands for "a local SGE" in lookup; the qp package never issues
// it.
const localQP = ^QPID(0)

// Local checks a local SGE (lkey, addr, length) of a work request on a QP
// of pd and returns the part of the buffer it names. need is 0 to read
// from the buffer (SEND, RDMA WRITE source) or LocalWrite to write into it
// (receive buffers, RDMA READ and atomic response targets); any other bit
// is ErrInvalidArgument. Local does not allocate.
func (t *Table) Local(lkey uint32, pd *PD, va uint64, length uint32, need Access) ([]byte, error) {
	if need&^LocalWrite != 0 {
		return nil, ErrInvalidArgument
	}
	return t.lookup(lkey, pd, localQP, va, length, need)
}

// lookup runs the checks of the package comment, in order.
// A window's key is an rkey only, and a type 2 window answers only the QP
// it is bound to (rxe_lookup_mw).
func (t *Table) lookup(key uint32, pd *PD, qp QPID, va uint64, length uint32, need Access) ([]byte, error) {
	s := t.slot(key >> 8)
	if s == nil {
		return nil, ErrInvalidKey
	}
	e := s.Load()
	switch {
	case e == nil || e.key != key:
		return nil, ErrInvalidKey
	case e.state != stateValid:
		return nil, ErrInvalidated
	case e.mw != nil && qp == localQP:
		return nil, ErrInvalidKey
	case e.pd != pd:
		return nil, ErrWrongPD
	case e.mwType == MWType2 && (e.qp != qp || qp == 0):
		return nil, ErrWrongQP
	case need&^e.access != 0:
		return nil, ErrAccessDenied
	}
	off, ok := e.offset(va, length)
	if !ok {
		return nil, ErrOutOfBounds
	}
	end := off + uint64(length)
	return e.buf[off:end:end], nil
}

// offset returns va's offset in the MR if [va, va+length) lies inside it.
// Written so that nothing can overflow: Register guarantees iova+len(buf)
// does not wrap, so any range that would wrap fails the last comparison.
func (e *entry) offset(va uint64, length uint32) (uint64, bool) {
	size := uint64(len(e.buf))
	if va < e.iova {
		return 0, false
	}
	off := va - e.iova
	if off > size || uint64(length) > size-off {
		return 0, false
	}
	return off, true
}
