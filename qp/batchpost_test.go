package qp

import "testing"

// TestEngineBatch checks that posts inside Engine.Batch reach the Output
// together when it returns, not one Emit per PostSend, and that all of
// them arrive and complete.
func TestEngineBatch(t *testing.T) {
	p := newAllocPair(t, MTU1024)
	eps := [][2]*endpoint{{p.a, p.b}}
	for range 3 {
		a, b := p.a.n.newQP(t, RC, 4), p.b.n.newQP(t, RC, 4)
		connect(t, a, b, defaultConn())
		eps = append(eps, [2]*endpoint{a, b})
	}
	emits := 0
	p.wa.onEmit = func() { emits++ }
	p.a.n.e.Batch(func() {
		for i, ep := range eps {
			ep[0].post(t, SendWR{ID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGL: sge(p.amr, 0, 2048),
				RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()})
		}
		if len(p.wa.in) != 0 {
			t.Errorf("%d packets left before Batch returned", len(p.wa.in))
		}
	})
	if emits != 1 || len(p.wa.in) != 2*len(eps) {
		t.Fatalf("%d Emit calls with %d packets, want 1 with %d", emits, len(p.wa.in), 2*len(eps))
	}
	// The packets of each WRITE (FIRST, LAST) lie back to back.
	if p.wa.runs < len(eps) {
		t.Errorf("%d packets adjacent to their predecessor, want at least %d", p.wa.runs, len(eps))
	}
	p.exchange(t)
	for i, ep := range eps {
		if wcs := pollAll(ep[0].scq); len(wcs) != 1 || wcs[0].Status != WCSuccess || wcs[0].ID != uint64(i) {
			t.Errorf("QP %d: completions %s", i, fmtWCs(wcs))
		}
	}
}
