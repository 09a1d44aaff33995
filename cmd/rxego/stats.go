package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/devstats"
)

// statsPrefix starts the one line --stats prints, so tests can find it in
// a tool's output.
const statsPrefix = "rxego-stats "

// How long printStats waits for the device to go quiet by default, and at
// most.
const (
	defaultStatsQuiet = 250 * time.Millisecond
	settleMax         = 5 * time.Second
)

// printStats writes dev's engine and transport counters as one line:
// statsPrefix then a JSON object of name to value (package devstats names
// them). It first waits until the device has neither sent nor received a
// packet for defaultStatsQuiet (at most settleMax): the ACK of the last
// message received goes out after the run ends, and a peer's last packets
// may still be arriving.
func printStats(w io.Writer, dev *rxego.Device) error {
	return printStatsQuiet(w, dev, defaultStatsQuiet)
}

// printStatsQuiet is printStats with the quiet period given.
func printStatsQuiet(w io.Writer, dev *rxego.Device, quiet time.Duration) error {
	devstats.Settle(dev, quiet, settleMax)
	b, err := json.Marshal(devstats.Map(dev))
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s%s\n", statsPrefix, b)
	return err
}

// engineStats and transportStats name counters as printStats does (see
// package devstats).
var (
	engineStats    = devstats.Engine
	transportStats = devstats.Transport
)
