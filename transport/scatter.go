package transport

import (
	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/icrc"
)

// Scatterer is implemented by Conns whose Send accepts scattered messages
// (Message.Payload set) and sends their pieces with scatter-gather I/O,
// never copying the payload. Send of a Conn that does not implement it
// (or whose Scatters says false) rejects them with ErrScattered: its
// caller builds whole packets for it instead.
type Scatterer interface {
	// Scatters reports whether Send takes scattered messages.
	Scatters() bool
}

// Len returns the bytes m puts on the wire (UDP payloads): len(Buf), plus
// len(Payload) for a scattered message.
func (m *Message) Len() int { return len(m.Buf) + len(m.Payload) }

// Gather appends the packets of m to dst as a message that is not
// scattered would hold them (each packet's header, payload and trailer
// back to back) and returns the extended slice. It is how a Conn that
// needs whole packets (a pipe, a shim that rewrites them, a Tap) sends a
// scattered message; m is not changed. A malformed scattered message
// appends what it can and returns ErrScattered.
func (m *Message) Gather(dst []byte) ([]byte, error) {
	if m.Payload == nil {
		return append(dst, m.Buf...), nil
	}
	w := scatterWalk{buf: m.Buf, payload: m.Payload, seg: m.Seg}
	for !w.done() {
		hdr, pay, tr, err := w.next()
		if err != nil {
			return dst, err
		}
		dst = append(append(append(dst, hdr...), pay...), tr...)
	}
	return dst, nil
}

// scatterWalk walks the packets of a scattered message: Buf holds each
// packet's header (BTH through its last extension header, the opcode's
// HdrLen) and trailer (pad and ICRC, the BTH's pad count plus four)
// packet after packet, Payload their payloads back to back, and seg is
// the wire length of every packet but the last (0: one packet).
type scatterWalk struct {
	buf, payload []byte
	seg          int
}

// done reports whether every packet has been walked.
func (w *scatterWalk) done() bool { return len(w.buf) == 0 && len(w.payload) == 0 }

// next returns the next packet's pieces, or ErrScattered when Buf and
// Payload do not split into packets as the BTHs say.
func (w *scatterWalk) next() (hdr, payload, trailer []byte, err error) {
	n := len(w.buf) + len(w.payload)
	if w.seg > 0 {
		n = min(n, w.seg)
	}
	if len(w.buf) < bth.Len {
		return nil, nil, nil, ErrScattered
	}
	b := bth.BTH(w.buf)
	in, ok := bth.Lookup(b.Opcode())
	if !ok {
		return nil, nil, nil, ErrScattered
	}
	h, t := in.HdrLen, b.PadCount()+icrc.Len
	p := n - h - t
	if h+t > len(w.buf) || p < 0 || p > len(w.payload) {
		return nil, nil, nil, ErrScattered
	}
	hdr, trailer, payload = w.buf[:h:h], w.buf[h:h+t:h+t], w.payload[:p:p]
	w.buf, w.payload = w.buf[h+t:], w.payload[p:]
	return hdr, payload, trailer, nil
}

// checkScattered validates every packet of a scattered message of Seg
// seg before anything of it is sent.
func checkScattered(m *Message, seg int) error {
	w := scatterWalk{buf: m.Buf, payload: m.Payload, seg: seg}
	for !w.done() {
		if _, _, _, err := w.next(); err != nil {
			return err
		}
	}
	return nil
}

// fillScattered writes the ICRC of the packet hdr, payload, trailer into
// trailer's last four bytes, for IPv4 ID id, as fill does for a whole
// packet. flow is outbound(peer), made once for a run's packets.
func (e *endpoint) fillScattered(hdr, payload, trailer []byte, flow icrc.Flow, id uint16) {
	icrc.Put(trailer, flow.SumScattered(id, hdr, payload, trailer))
}
