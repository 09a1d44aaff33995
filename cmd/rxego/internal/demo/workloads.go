package demo

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/examples/allreduce"
	"github.com/rxego/rxego/examples/kvcache"
	"github.com/rxego/rxego/examples/prefixcache"
	"github.com/rxego/rxego/internal/app/job"
	"github.com/rxego/rxego/internal/app/ladder"
)

// record gives the scenario's tap to rank's device only (the others get
// the defaults), and says in the ladder's header whose it is.
func (t *Tour) record(rank int, who string) func(int) *rxego.Options {
	t.header = who + "'s device saw it"
	return func(r int) *rxego.Options {
		if r == rank && t.tap != nil {
			return &rxego.Options{Tap: t.tap}
		}
		return nil
	}
}

func workloadCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 20*time.Second)
}

func (t *Tour) kvcache() error {
	s := kvcache.Shape{Layers: 4, Tokens: 16, Width: 64, DTypeBytes: 2, BlockTokens: 8}
	c := kvcache.Config{Shape: s, Lanes: 2, Verify: true, Devices: t.record(1, "the prefill side")}
	t.say("A prefill process has computed a request's KV cache: %d layers, each %d tokens x %d values in bfloat16 = %d bytes,",
		s.Layers, s.Tokens, s.Width, s.LayerBytes())
	t.say("in blocks of %d tokens. The decode process registered a buffer for all of it and sent its address and rkey out of band.", s.BlockTokens)
	t.say("Prefill WRITEs each block straight into that buffer; the last block of a layer goes as a WRITE with immediate = the layer.")
	t.say("Layers alternate over %s. Decode posted one empty receive per layer and starts on a layer when its immediate arrives.", ladder.Count(c.Lanes, "QP"))
	ctx, cancel := workloadCtx()
	defer cancel()
	r, err := kvcache.Run(ctx, c, job.Goroutines(kvcache.Rank(c)))
	if err != nil {
		return err
	}
	t.say("Decode saw the layers become usable in the order %v: layer %d after %.0f µs, all %d after %.0f µs.",
		r.Order, r.Order[0], r.First*1e6, s.Layers, r.Total*1e6)
	t.say("It checked every layer byte for byte as it arrived; the WRITEs themselves cost it no completion, only the immediates did.")
	t.say("At full size (go run ./examples/kvcache/cmd/kvcache: 61 layers x 4096 tokens x 512 values, 244 MiB) the same happens in bulk.")
	return nil
}

func (t *Tour) prefix() error {
	c := prefixcache.Config{Bytes: 8 << 10, Readers: 2, Rounds: 1, Chunk: 4 << 10, Depth: 2, Verify: true,
		Devices: t.record(0, "the owner")}
	t.say("An owner process registers a shared prefix's KV cache (%d KiB) for remote READ, gives %d readers its address and rkey,",
		c.Bytes>>10, c.Readers)
	t.say("and then does nothing: its application posts no receive and polls no completion.")
	t.say("Each reader pulls the whole prefix with READs of %d KiB.", c.Chunk>>10)
	ctx, cancel := workloadCtx()
	defer cancel()
	r, err := prefixcache.Run(ctx, c, job.Goroutines(prefixcache.Rank(c)))
	if err != nil {
		return err
	}
	t.say("The readers have %d bytes between them, each copy checked byte for byte (%v).", r.Served, r.Verified)
	t.say("The owner's application never ran. Its device did: with rxego, as with the kernel's rdma_rxe, the owner host's CPU")
	t.say("runs the transport (takes the READ requests, sends the responses); only an RDMA NIC would leave that CPU out entirely.")
	t.say("The capture below is the owner's, the responder's: it sees a READ arrive and its response leave, so what it")
	t.say("measures for each READ is the owner's turnaround, not the readers' round trip (its statistics say so).")
	return nil
}

func (t *Tour) allreduce() error {
	c := allreduce.Config{Count: 16, Ranks: 4, Iters: 1, Devices: t.record(0, "rank 0")}
	t.say("%d ranks on a ring each hold %d float32s (rank r's element j is (31j+7r) mod 64) and want the element-wise sum.", c.Ranks, c.Count)
	t.say("The buffer is cut into %d chunks. Reduce-scatter: %d steps, each rank WRITEs one chunk into the next rank's staging",
		c.Ranks, c.Ranks-1)
	t.say("slot with immediate = (phase, step); the next rank adds it in when the immediate arrives and passes the sum on.")
	t.say("All-gather: %d more steps carry the reduced chunks round the ring, straight to their final place.", c.Ranks-1)
	ctx, cancel := workloadCtx()
	defer cancel()
	r, err := allreduce.Run(ctx, c, job.Goroutines(allreduce.Rank(c)))
	if err != nil {
		return err
	}
	var e0 []string
	var sum float32
	for rk := range c.Ranks {
		v := allreduce.Input(rk, 0)
		e0, sum = append(e0, fmt.Sprint(v)), sum+v
	}
	t.say("Every rank checked all its elements exactly against a local sum (%d checks); element 0, for one, is %v = %v.",
		r.Checked, strings.Join(e0, " + "), sum)
	t.say("Each rank sent %d WRITEs with immediate and took %d immediates; rank 0's device saw its WRITEs to rank 1 and rank 3's to it.",
		2*(c.Ranks-1), 2*(c.Ranks-1))
	t.say("For rank 3's WRITEs rank 0 is the responder: the time from a WRITE's arrival to its ACK is rank 0's turnaround,")
	t.say("not a round trip (the statistics of that QP pair say so).")
	return nil
}
