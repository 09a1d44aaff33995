package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/app/devstats"
)

// statsPrefix starts the one line --stats prints, so tests can find it in
// a tool's output.
const statsPrefix = "rxego-stats "

// How long printStatsWith waits for the device to go quiet by default, and at
// most.
const (
	defaultStatsQuiet = 250 * time.Millisecond
	settleMax         = 5 * time.Second
)

// printStatsQuiet is printStatsWith without more counters.
func printStatsQuiet(w io.Writer, dev *rxego.Device, quiet time.Duration) error {
	return printStatsWith(w, dev, quiet, nil)
}

// printStatsWith writes dev's engine and transport counters, and extra
// (a connection manager's), as one line: statsPrefix then a JSON object of
// name to value (package devstats names them). It first waits until the
// device has neither sent nor received a packet for quiet (at most
// settleMax; 0 prints at once): the ACK of the last message received goes
// out after the run ends, and a peer's last packets may still be arriving.
func printStatsWith(w io.Writer, dev *rxego.Device, quiet time.Duration, extra map[string]uint64) error {
	if quiet > 0 {
		devstats.Settle(dev, quiet, settleMax)
	}
	st := devstats.Map(dev)
	maps.Copy(st, extra)
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s%s\n", statsPrefix, b)
	return err
}

// engineStats and transportStats name counters as printStatsWith does (see
// package devstats).
var (
	engineStats    = devstats.Engine
	transportStats = devstats.Transport
)
