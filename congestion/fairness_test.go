package congestion

import "testing"

// TestJain checks the fairness index on equal, one-takes-all, uneven and
// empty inputs.
func TestJain(t *testing.T) {
	for _, tc := range []struct {
		x    []float64
		want float64
	}{
		{[]float64{5, 5, 5, 5}, 1},
		{[]float64{8, 0, 0, 0}, 0.25}, // (8)^2 / (4*64)
		{[]float64{3, 1}, 16.0 / 20},  // (3+1)^2 / (2*(9+1))
		{nil, 0},
		{[]float64{0, 0}, 0},
	} {
		if got := Jain(tc.x); got != tc.want {
			t.Errorf("Jain(%v) = %v, want %v", tc.x, got, tc.want)
		}
	}
}
