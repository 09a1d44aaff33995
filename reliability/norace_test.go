//go:build !race

package reliability_test

// raceEnabled says the race detector is on: the largest runs shrink, since
// it slows the engines several times.
const raceEnabled = false
