package qp

import (
	"encoding/binary"
	"errors"

	"github.com/rxego/rxego/mr"
)

// gather copies message bytes [off, off+len(dst)) of w into dst.
func (e *Engine) gather(q *QP, w *sendWQE, off uint32, dst []byte) error {
	if w.wr.Flags&SendInline != 0 {
		copy(dst, w.inline[off:])
		return nil
	}
	for _, s := range w.sgl {
		if len(dst) == 0 {
			break
		}
		if off >= s.Length {
			off -= s.Length
			continue
		}
		n := min(uint32(len(dst)), s.Length-off)
		src, err := e.cfg.MRs.Local(s.LKey, q.pd, s.Addr+uint64(off), n, 0)
		if err != nil {
			return err
		}
		copy(dst, src)
		dst = dst[n:]
		off = 0
	}
	return nil
}

// inPlace returns message bytes [off, off+n) of w where they lie in
// registered memory, for a packet whose payload need not be copied
// (OutPacket.Payload), or nil when they must be copied: the Output does
// not take such packets, the payload is short (ZeroCopyMinPayload), the
// QP is not RC (UC and UD complete a work request once sent, after which
// its memory may change), the data is inline, or the bytes span two SGEs
// or fail the access check (gather then reports the error).
func (e *Engine) inPlace(q *QP, w *sendWQE, off uint32, n int) []byte {
	if !e.scatters || n < ZeroCopyMinPayload || q.typ != RC || w.wr.Flags&SendInline != 0 {
		return nil
	}
	for _, s := range w.sgl {
		if off >= s.Length {
			off -= s.Length
			continue
		}
		if uint64(off)+uint64(n) > uint64(s.Length) {
			return nil
		}
		// The rest of the SGE is looked up, so that the payload's capacity
		// reaches over the next packet's and the Output can send the two
		// as one GSO run (as it does with the slab's packets).
		src, err := e.cfg.MRs.Local(s.LKey, q.pd, s.Addr+uint64(off), s.Length-off, 0)
		if err != nil {
			return nil
		}
		return src[:n]
	}
	return nil
}

// scatter copies src into an SGL at message offset off, with the access
// needed to write local memory.
func (e *Engine) scatter(pd *mr.PD, sgl []SGE, off uint32, src []byte) error {
	for _, s := range sgl {
		if len(src) == 0 {
			return nil
		}
		if off >= s.Length {
			off -= s.Length
			continue
		}
		n := min(uint32(len(src)), s.Length-off)
		dst, err := e.cfg.MRs.Local(s.LKey, pd, s.Addr+uint64(off), n, mr.LocalWrite)
		if err != nil {
			return err
		}
		copy(dst, src[:n])
		src = src[n:]
		off = 0
	}
	if len(src) > 0 {
		return errLength
	}
	return nil
}

var errLength = errors.New("qp: message longer than the receive buffers")

// putUint64Native stores v in host byte order, as verbs returns atomic
// results into local memory.
func putUint64Native(b []byte, v uint64) { binary.NativeEndian.PutUint64(b, v) }
