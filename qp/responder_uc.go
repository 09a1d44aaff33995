package qp

import (
	"github.com/rxego/rxego/bth"
)

// respondUC runs the UC responder: RC's checks and placement, with UC's
// own PSN rule and drops where RC would NAK (see refuse). UC has no
// acknowledgements, no RNR and no READ or atomics.
func (e *Engine) respondUC(q *QP, in *InPacket) {
	p := in.Pkt
	psn := p.BTH().PSN()
	if e.checkUCPSN(q, p.Info, psn) && e.checkRequest(q, p, psn) {
		e.place(q, p, psn)
	}
}

// ucDupWindow is how far behind the expected PSN a UC packet counts as a
// duplicate.
const ucDupWindow = 1 << 16

// checkUCPSN is check_psn for UC: a PSN gap gives up the message it
// damaged; a FIRST or ONLY after the gap starts a new one, anything else
// is dropped with the rest of its message.
func (e *Engine) checkUCPSN(q *QP, info *bth.Info, psn bth.PSN) bool {
	rs := &q.resp
	if d := rs.ePSN.Diff(psn); d > 0 && d <= ucDupWindow {
		// A PSN just behind is a duplicate (or a straggler the next
		// message overtook): taking it as a new message would deliver a
		// message twice. rxe starts a message at any first packet; rxego
		// drops what it has recently passed, which UC allows (it may
		// lose, never repeat). Far older PSNs still start a message, so
		// a peer that starts over at another PSN is heard, as by rxe.
		e.Stats.DuplicateRequest.Add(1)
		e.drop(DropDuplicate)
		return false
	}
	if psn != rs.ePSN {
		e.Stats.OutOfSeqRequest.Add(1)
		rs.inMsg = false
		if !info.Has(bth.First) {
			rs.ucDrop = true
			rs.ePSN = psn.Next()
			e.drop(DropOutOfSequence)
			return false
		}
	}
	rs.ePSN = psn.Next()
	return true
}
