// Command rxego-bench measures rxego against raw UDP and TCP between two
// processes on loopback, in one sitting, and prints a markdown report with
// the ratios (progress goes to stderr). See package bench/harness and
// docs/performance.md.
//
//	go run ./cmd/rxego-bench > report.md
package main

import (
	"os"

	"github.com/rxego/rxego/bench/harness"
)

func main() { os.Exit(harness.Main(os.Args[1:], os.Stdout, os.Stderr)) }
