package congestion

// Jain returns Jain's fairness index of x: 1 when all are equal, 1/n when
// one takes everything, 0 for an empty or all-zero x.
func Jain(x []float64) float64 {
	var sum, sq float64
	for _, v := range x {
		sum += v
		sq += v * v
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(x)) * sq)
}
