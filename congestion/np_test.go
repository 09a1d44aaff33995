package congestion

import (
	"testing"
	"time"
)

func TestNPRateLimitsCNPs(t *testing.T) {
	np := NewNP(4 * us)
	steps := []struct {
		at   time.Duration
		send bool
	}{
		{0, true},       // first mark: CNP at once
		{1 * us, false}, // 1us after the last CNP
		{3999 * time.Nanosecond, false},
		{4 * us, true},  // exactly the gap
		{5 * us, false}, // 1us after 4us
		{7999 * time.Nanosecond, false},
		{20 * us, true},  // long after
		{19 * us, false}, // earlier than the last CNP
		{24 * us, true},
	}
	for _, s := range steps {
		if got := np.OnCE(s.at); got != s.send {
			t.Fatalf("OnCE(%v) = %v, want %v", s.at, got, s.send)
		}
	}
	if st := np.Stats(); st.Marked != 9 || st.CNPs != 4 {
		t.Fatalf("stats %+v, want 9 marked, 4 CNPs", st)
	}
}

func TestNPZeroGapSendsEveryMark(t *testing.T) {
	np := NewNP(-time.Second) // treated as 0
	for i := range 3 {
		if !np.OnCE(time.Duration(i)) {
			t.Fatalf("mark %d: no CNP with a zero gap", i)
		}
	}
	if !np.OnCE(2) {
		t.Fatal("same instant: no CNP with a zero gap")
	}
}

// Each QP has its own NP: a CNP for one does not silence another.
func TestNPPerQP(t *testing.T) {
	a, b := NewNP(50*us), NewNP(50*us)
	if !a.OnCE(0) || !b.OnCE(1*us) || a.OnCE(2*us) || b.OnCE(3*us) {
		t.Fatal("NPs of two QPs interfere")
	}
}
