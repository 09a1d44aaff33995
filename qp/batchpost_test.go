package qp

import (
	"runtime"
	"testing"
)

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

// TestBatchHalves checks BeginBatch/EndBatch/RunBatch, the halves a
// device uses to send each engine's batch on a goroutine of its own: the
// posts of a batch build no packet on the poster's goroutine (the old
// Batch built them there and only held the sending), EndBatch says there
// is work, and RunBatch builds and sends it all in one Emit.
func TestBatchHalves(t *testing.T) {
	p := newAllocPair(t, MTU1024)
	e := p.a.n.e
	emits := 0
	p.wa.onEmit = func() { emits++ }
	e.BeginBatch()
	for i := range 3 {
		p.a.post(t, SendWR{ID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGL: sge(p.amr, 0, 2048),
			RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()})
	}
	e.mu.Lock()
	built, ready := len(e.outq), len(e.ready)
	e.mu.Unlock()
	if built != 0 || ready != 1 || emits != 0 {
		t.Fatalf("inside the batch: %d packets built, %d QPs ready, %d Emits; want 0, 1, 0", built, ready, emits)
	}
	if !e.EndBatch() {
		t.Fatal("EndBatch reported no work after three posts")
	}
	if emits != 0 {
		t.Fatalf("EndBatch sent (%d Emits); RunBatch should", emits)
	}
	e.RunBatch()
	if emits != 1 || len(p.wa.in) != 6 {
		t.Fatalf("RunBatch: %d Emits with %d packets, want 1 with 6", emits, len(p.wa.in))
	}
	if e.posted.Load() {
		t.Error("the work flag stayed set after EndBatch")
	}
	p.exchange(t)
	if wcs := pollAll(p.a.scq); len(wcs) != 3 || wcs[2].Status != WCSuccess {
		t.Fatalf("completions %s, want 3 successes", fmtWCs(wcs))
	}
	// A batch without posts leaves no work.
	e.BeginBatch()
	if e.EndBatch() {
		t.Error("EndBatch reported work for an empty batch")
	}
}

// TestBatchEndRacesPosts races each post against one batch that another
// goroutine opens and ends around it: the post is either sent by its own
// PostSend (it saw the batch over) or reported by EndBatch and sent by
// RunBatch. Each WRITE must complete with no later batch or post to
// rescue it, since in a real program nothing else may come.
func TestBatchEndRacesPosts(t *testing.T) {
	p := newAllocPair(t, MTU1024)
	e := p.a.n.e
	const posts = 3000
	for i := range posts {
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			e.BeginBatch()
			runtime.Gosched()
			if e.EndBatch() {
				e.RunBatch()
			}
		}()
		runtime.Gosched()
		if err := p.a.qp.PostSend(SendWR{ID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, SGL: sge(p.amr, 0, 64),
			RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()}); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
		<-ended
		p.exchangeLocked(t)
		if wcs := pollAllCheck(t, p.a.scq); len(wcs) != 1 {
			t.Fatalf("post %d: %d completions, want 1: the post was left queued", i, len(wcs))
		}
	}
}

// exchangeLocked is exchange for a pair whose engine a may emit from
// another goroutine: a's wire is read under a's lock, which its Emits
// hold.
func (p *allocPair) exchangeLocked(t *testing.T) {
	t.Helper()
	ea := p.a.n.e
	for range 100 {
		ea.mu.Lock()
		n := p.wa.deliver(p.b.n.e)
		ea.mu.Unlock()
		if n+p.wb.deliver(ea) == 0 {
			return
		}
	}
	t.Fatal("the engines never went quiet")
}
