// Command rxego-bench measures rxego against raw UDP and TCP between two
// processes on loopback, in one sitting, and prints a markdown report with
// the ratios (progress goes to stderr). See package bench/harness and
// docs/performance.md. "rxego-bench workloads" measures the AI workloads
// of package examples against TCP instead (package bench/workloads,
// docs/ai-workloads.md).
//
//	go run ./cmd/rxego-bench > report.md
//	go run ./cmd/rxego-bench workloads > workloads.md
package main

import (
	"os"

	"github.com/rxego/rxego/bench/harness"
	"github.com/rxego/rxego/bench/workloads"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "workloads" {
		os.Exit(workloads.Main(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(harness.Main(os.Args[1:], os.Stdout, os.Stderr))
}
