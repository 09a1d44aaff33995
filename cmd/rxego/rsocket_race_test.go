//go:build race

package main

// raceEnabled tells tests the race detector is on.
const raceEnabled = true
