// Command prefixcache serves a shared prefix (a system prompt's KV
// cache) from an owner process to several reader processes on loopback,
// by one-sided RDMA READ from an owner that does nothing after
// registering it, then from a TCP server, and prints the owner process's
// CPU time (getrusage) over each pull. See package examples/prefixcache.
//
//	go run ./examples/prefixcache/cmd/prefixcache            # 2,048 tokens of DeepSeek-V3 KV, 3 readers
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/rxego/rxego/examples/prefixcache"
	"github.com/rxego/rxego/internal/app/job"
)

func main() {
	if job.IsRank(os.Args[1:]) {
		os.Exit(job.RankMain(os.Args[1:], prefixcache.Rank))
	}
	layers := flag.Int("layers", 61, "transformer layers")
	tokens := flag.Int("tokens", 2048, "tokens in the shared prefix")
	width := flag.Int("width", 512, "KV values per token per layer")
	dtype := flag.Int("dtype-bytes", 2, "bytes per value (2: bfloat16)")
	c := prefixcache.Config{Verify: true}
	flag.IntVar(&c.Readers, "readers", 3, "reader processes")
	flag.IntVar(&c.Rounds, "rounds", 2, "times each reader pulls the prefix")
	flag.IntVar(&c.Chunk, "chunk", 1<<20, "bytes per READ")
	flag.IntVar(&c.Depth, "depth", 8, "READs each reader keeps outstanding (at most 16)")
	flag.BoolVar(&c.Verify, "verify", true, "readers check their copy byte for byte")
	flag.Parse()
	c.Bytes = *layers * *tokens * *width * *dtype
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rs, err := prefixcache.Compare(ctx, c, func(c prefixcache.Config) job.Starter { return job.Processes(nil, c) })
	if err != nil {
		fmt.Fprintln(os.Stderr, "prefixcache:", err)
		os.Exit(1)
	}
	prefixcache.Table(os.Stdout, c, rs)
}
