// Command kvcache moves one request's KV cache from a prefill process to
// a decode process on loopback, over RDMA (WRITE for each layer's blocks,
// WRITE with immediate for each layer's signal, layers spread over
// several QPs) and then over one and several TCP connections, each side
// in its own process, and prints total time, time to the first usable
// layer and Gbit/s for each. See package examples/kvcache.
//
//	go run ./examples/kvcache/cmd/kvcache                 # DeepSeek-V3 shape, 244 MiB
//	go run ./examples/kvcache/cmd/kvcache -layers 4 -tokens 256
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/rxego/rxego/examples/kvcache"
	"github.com/rxego/rxego/internal/app/job"
)

func main() {
	if job.IsRank(os.Args[1:]) {
		os.Exit(job.RankMain(os.Args[1:], kvcache.Rank))
	}
	s := kvcache.DeepSeekV3
	flag.IntVar(&s.Layers, "layers", s.Layers, "transformer layers")
	flag.IntVar(&s.Tokens, "tokens", s.Tokens, "prompt tokens")
	flag.IntVar(&s.Width, "width", s.Width, "KV values per token per layer (MLA's compressed latent: 512)")
	flag.IntVar(&s.DTypeBytes, "dtype-bytes", s.DTypeBytes, "bytes per value (2: bfloat16)")
	flag.IntVar(&s.BlockTokens, "block-tokens", s.BlockTokens, "tokens per KV block (one RDMA WRITE each)")
	qps := flag.Int("qps", 4, "RDMA QPs the layers are spread over")
	conns := flag.Int("conns", 4, "TCP connections of the multi-connection run (1 runs only the single-connection one)")
	verify := flag.Bool("verify", true, "the decode side checks every layer byte for byte as it arrives")
	warm := flag.Bool("warm", false, "send the cache once untimed over the same QPs or connections before the measured transfer")
	inproc := flag.Bool("inproc", false, "run both sides as goroutines of this process instead of two processes")
	flag.Parse()
	start := func(c kvcache.Config) job.Starter { return job.Processes(nil, c) }
	if *inproc {
		start = func(c kvcache.Config) job.Starter { return job.Goroutines(kvcache.Rank(c)) }
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rs, err := kvcache.Compare(ctx, s, *qps, *conns, *verify, *warm, start)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvcache:", err)
		os.Exit(1)
	}
	kvcache.Table(os.Stdout, s, rs)
}
