package qp

import "testing"

// TestCountersAdd checks Add sums every counter, the drop array included.
func TestCountersAdd(t *testing.T) {
	var a, b Counters
	a.SentPkts.Store(3)
	b.SentPkts.Store(4)
	b.ECNMarkedPktsReceived.Store(5)
	b.Drops[DropBusy].Store(6)
	a.Add(&b)
	if a.SentPkts.Load() != 7 || a.ECNMarkedPktsReceived.Load() != 5 || a.Drops[DropBusy].Load() != 6 {
		t.Errorf("sum: sent %d, ecn %d, busy drops %d; want 7, 5, 6",
			a.SentPkts.Load(), a.ECNMarkedPktsReceived.Load(), a.Drops[DropBusy].Load())
	}
}
