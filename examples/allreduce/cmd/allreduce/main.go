// Command allreduce runs a ring all-reduce of float32 buffers over N
// processes on loopback, first with every chunk moved by RDMA WRITE with
// immediate, then over TCP connections in the same ring, checks every
// result exactly, and prints the algorithm bandwidth of each. See
// package examples/allreduce.
//
//	go run ./examples/allreduce/cmd/allreduce                 # 4 ranks, 64 MiB each
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/rxego/rxego/examples/allreduce"
	"github.com/rxego/rxego/internal/app/job"
)

func main() {
	if job.IsRank(os.Args[1:]) {
		os.Exit(job.RankMain(os.Args[1:], allreduce.Rank))
	}
	var c allreduce.Config
	flag.IntVar(&c.Ranks, "ranks", 4, "processes in the ring")
	flag.IntVar(&c.Count, "count", 16<<20, "float32 elements per rank")
	flag.IntVar(&c.Iters, "iters", 3, "all-reduces to time (the median is reported)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rs, err := allreduce.Compare(ctx, c, func(c allreduce.Config) job.Starter { return job.Processes(nil, c) })
	if err != nil {
		fmt.Fprintln(os.Stderr, "allreduce:", err)
		os.Exit(1)
	}
	allreduce.Table(os.Stdout, c, rs)
}
