// Package allreduce is the ring all-reduce of data-parallel training
// (NCCL's ring algorithm): N ranks each hold a float32 buffer and all end
// with the element-wise sum. The buffer is cut into N chunks. In the
// reduce-scatter phase, N-1 steps, each rank sends one chunk to the next
// rank on the ring, which adds it into its own copy and passes the sum
// on at the next step; after it, each rank holds one chunk fully reduced.
// In the all-gather phase, N-1 more steps, the reduced chunks travel
// round the ring. Every chunk moves by RDMA WRITE with immediate to the
// next rank: the WRITE puts the bytes in the next rank's memory (a
// staging slot per reduce-scatter step, the chunk's place in a gather
// area in the all-gather) and the immediate (phase and step) tells it
// they are there. The gather area keeps the all-gather's incoming WRITEs
// off the data the reduce-scatter's WRITEs read (a retransmission reads
// its source again, until acknowledged, while the previous rank is
// already gathering): the gathered chunks are copied into the data once
// every WRITE of the round is acknowledged. The same ring runs over TCP
// for comparison.
//
// The inputs are small integers (rank r's element j is (31j+7r) mod
// 64), so every sum is exact in float32 whatever the order, and each
// rank checks its result against the sum computed locally.
package allreduce

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"
	"unsafe"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/app/job"
)

// Config is one all-reduce job.
type Config struct {
	// Count is the float32 elements each rank reduces; Ranks the ring's
	// size.
	Count, Ranks int
	// Iters is how many all-reduces run (each timed; the inputs are
	// refilled and the result checked between them).
	Iters int
	// TCP runs the ring over TCP connections instead.
	TCP bool
	// Devices, when set, gives each rank's RDMA device options (a Tap);
	// in-process runs only.
	Devices func(rank int) *rxego.Options `json:"-"`
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Ranks < 2 || c.Ranks > 64 || c.Count < c.Ranks || c.Count > 1<<30 || c.Iters < 1 || c.Iters > 1000 {
		return fmt.Errorf("allreduce: bad configuration %+v", c)
	}
	return nil
}

// Result is a rank's (or, from Run, the job's) figures.
type Result struct {
	Transport string
	Ranks     int
	Bytes     int       // bytes each rank reduces (Count x 4)
	Times     []float64 // seconds per all-reduce (Run: the slowest rank's)
	Checked   int       // elements checked exactly, every rank, every iteration
	Drops     uint64    // datagrams the sockets dropped (Run: all ranks')
	CPU       float64   // process CPU seconds over the timed all-reduces (Run: all ranks', per all-reduce)
}

// Median is the median of Times.
func (r Result) Median() float64 {
	t := slices.Clone(r.Times)
	slices.Sort(t)
	return t[len(t)/2]
}

// AlgGbps is the algorithm bandwidth (NCCL's algbw, bytes reduced over
// time), in Gbit/s, at the median time.
func (r Result) AlgGbps() float64 { return float64(r.Bytes) * 8 / r.Median() / 1e9 }

// BusGbps is NCCL's bus bandwidth: algbw x 2(N-1)/N, what each link
// carried.
func (r Result) BusGbps() float64 { return r.AlgGbps() * 2 * float64(r.Ranks-1) / float64(r.Ranks) }

// Run runs the ranks started by start and returns the job's result.
func Run(ctx context.Context, c Config, start job.Starter) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	var rs []Result
	if err := job.Launch(ctx, c.Ranks, start, &rs); err != nil {
		return Result{}, err
	}
	out := rs[0]
	out.Times, out.Checked, out.Drops, out.CPU = make([]float64, c.Iters), 0, 0, 0
	for _, r := range rs {
		for i, t := range r.Times {
			out.Times[i] = max(out.Times[i], t)
		}
		out.Checked += r.Checked
		out.Drops += r.Drops
		out.CPU += r.CPU / float64(c.Iters)
	}
	return out, nil
}

// Input is rank r's element j before the all-reduce.
func Input(r, j int) float32 { return float32((31*j + 7*r) % 64) }

// ring is one rank's view of the buffer: its data, the reduce-scatter
// staging slots, the all-gather's gather area, and the chunk boundaries.
type ring struct {
	c       Config
	rank    int
	all     []float32 // data, then N-1 staging slots of a chunk each, then the gather area
	data    []float32
	gather  []float32 // as long as data: chunk k gathers at its own elements
	chunk   int       // elements per chunk (the last may be shorter or empty)
	checked int
}

func newRing(c Config, rank int) *ring {
	cs := (c.Count + c.Ranks - 1) / c.Ranks
	all := make([]float32, 2*c.Count+(c.Ranks-1)*cs)
	g := &ring{c: c, rank: rank, all: all, data: all[:c.Count], chunk: cs}
	g.gather = all[g.gatherOff():]
	job.Touch(g.bytes()) // the staging slots; fill touches the data
	return g
}

// bytes is the whole buffer as bytes, to register or read into.
func (g *ring) bytes() []byte { return unsafe.Slice((*byte)(unsafe.Pointer(&g.all[0])), len(g.all)*4) }

// span is chunk k's element range in the data.
func (g *ring) span(k int) (lo, hi int) {
	k = ((k % g.c.Ranks) + g.c.Ranks) % g.c.Ranks
	return min(k*g.chunk, g.c.Count), min((k+1)*g.chunk, g.c.Count)
}

// slot is the element offset of reduce-scatter step s's staging slot.
func (g *ring) slot(s int) int { return g.c.Count + s*g.chunk }

// gatherOff is the element offset of the gather area.
func (g *ring) gatherOff() int { return g.slot(g.c.Ranks - 1) }

// ungather copies the chunks gathered in the all-gather into the data:
// every chunk but the one this rank reduced itself.
func (g *ring) ungather() {
	for s := 0; s < g.c.Ranks-1; s++ {
		lo, hi := g.span(g.sendAG(s) - 1)
		copy(g.data[lo:hi], g.gather[lo:hi])
	}
}

// sendRS and recvRS are the chunks rank r sends and receives at
// reduce-scatter step s; sendAG and recvAG at all-gather step s.
func (g *ring) sendRS(s int) int { return g.rank - s }
func (g *ring) recvRS(s int) int { return g.rank - s - 1 }
func (g *ring) sendAG(s int) int { return g.rank + 1 - s }

// reduce adds step s's staged chunk into the data.
func (g *ring) reduce(s int) {
	lo, hi := g.span(g.recvRS(s))
	src := g.all[g.slot(s):]
	dst := g.data[lo:hi]
	for i := range dst {
		dst[i] += src[i]
	}
}

func (g *ring) fill() {
	for j := range g.data {
		g.data[j] = Input(g.rank, j)
	}
}

// check compares the result with the sum computed locally.
func (g *ring) check() error {
	for j, v := range g.data {
		want := 0
		for r := range g.c.Ranks {
			want += (31*j + 7*r) % 64
		}
		if v != float32(want) {
			return fmt.Errorf("allreduce: rank %d element %d is %v, want %d", g.rank, j, v, want)
		}
	}
	g.checked += len(g.data)
	return nil
}

// Rank is the work of one rank.
func Rank(c Config) job.RankFunc {
	return func(ctx context.Context, r *job.Rank) (any, error) {
		if err := c.Validate(); err != nil {
			return nil, err
		}
		g := newRing(c, r.ID)
		if c.TCP {
			return g.runTCP(ctx, r)
		}
		return g.runRDMA(ctx, r)
	}
}

// iterate runs the timed all-reduces: fill, barrier, allreduce, check.
func (g *ring) iterate(r *job.Rank, prepare func() error, allreduce func() error, transport string) (Result, error) {
	res := Result{Transport: transport, Ranks: g.c.Ranks, Bytes: g.c.Count * 4}
	for range g.c.Iters {
		g.fill()
		if err := prepare(); err != nil {
			return res, err
		}
		// The clock starts before the barrier: a rank descheduled just
		// after it must not start late and time less than the ring took.
		t0, cpu0 := time.Now(), job.CPU()
		if err := r.Barrier(); err != nil {
			return res, err
		}
		if err := allreduce(); err != nil {
			return res, err
		}
		res.Times = append(res.Times, time.Since(t0).Seconds())
		res.CPU += (job.CPU() - cpu0).Seconds()
		if err := g.check(); err != nil {
			return res, err
		}
	}
	res.Checked = g.checked
	return res, nil
}

// QP 0 of each rank goes to the next rank (it sends), QP 1 to the
// previous one (it receives).
const toNext, fromPrev = 0, 1

// imm names a step: phase (0 reduce-scatter, 1 all-gather) and step.
func imm(phase, s int) uint32 { return uint32(phase<<16 | s) }

func (g *ring) runRDMA(ctx context.Context, r *job.Rank) (any, error) {
	steps := 2 * (g.c.Ranks - 1)
	nextRank, prevRank := (r.ID+1)%g.c.Ranks, (r.ID+g.c.Ranks-1)%g.c.Ranks
	n, eps, err := job.OpenLinked(r, job.NodeConfig{Buf: g.bytes(), Access: rxego.AccessRemoteWrite, QPs: 2,
		SendDepth: steps, RecvDepth: steps, CQDepth: steps, Options: job.DeviceOptions(g.c.Devices, r.ID)},
		[]job.Link{{Local: toNext, Rank: nextRank, QP: fromPrev}, {Local: fromPrev, Rank: prevRank, QP: toNext}})
	if err != nil {
		return nil, err
	}
	defer n.Close()
	next := eps[nextRank]
	wcs := make([]rxego.WC, 1)
	// write sends the elements [lo, hi) of the buffer to the next rank's
	// element off.
	write := func(phase, s, lo, hi, off int) error {
		return n.QPs[toNext].PostSend(rxego.SendWR{ID: uint64(imm(phase, s)), Opcode: rxego.WRWriteImm, Imm: imm(phase, s),
			Flags: rxego.SendSignaled, SGL: n.SGE(lo*4, (hi-lo)*4), RemoteAddr: next.VA + uint64(off)*4, RKey: next.RKey})
	}
	// arrived waits for the previous rank's WRITE of (phase, s).
	arrived := func(phase, s int) error {
		if _, err := job.Poll(ctx, n.RecvCQ, wcs); err != nil {
			return err
		}
		if wcs[0].Imm != imm(phase, s) {
			return fmt.Errorf("allreduce: rank %d got immediate %#x, want %#x", r.ID, wcs[0].Imm, imm(phase, s))
		}
		return nil
	}
	prepare := func() error {
		for s := range steps {
			if err := n.QPs[fromPrev].PostRecv(rxego.RecvWR{ID: uint64(s)}); err != nil {
				return err
			}
		}
		return nil
	}
	allreduce := func() error {
		for s := 0; s < g.c.Ranks-1; s++ {
			lo, hi := g.span(g.sendRS(s))
			if err := write(0, s, lo, hi, g.slot(s)); err != nil {
				return err
			}
			if err := arrived(0, s); err != nil {
				return err
			}
			g.reduce(s)
		}
		gather := g.gatherOff()
		for s := 0; s < g.c.Ranks-1; s++ {
			// Step 0 sends the chunk this rank reduced, from the data;
			// later steps the one gathered at the step before.
			lo, hi := g.span(g.sendAG(s))
			from := 0
			if s > 0 {
				from = gather
			}
			if err := write(1, s, from+lo, from+hi, gather+lo); err != nil {
				return err
			}
			if err := arrived(1, s); err != nil {
				return err
			}
		}
		// Our own WRITEs are acknowledged too before the data they read
		// from changes: the gathered chunks now, the next round's inputs
		// after.
		for range steps {
			if _, err := job.Poll(ctx, n.SendCQ, wcs); err != nil {
				return err
			}
		}
		g.ungather()
		return nil
	}
	res, err := g.iterate(r, prepare, allreduce, "rdma")
	res.Drops = n.Drops()
	return res, err
}

func (g *ring) runTCP(ctx context.Context, r *job.Rank) (any, error) {
	out, in, done, err := r.TCP(ctx, []int{(r.ID + 1) % g.c.Ranks}, 1, 1)
	if err != nil {
		return nil, err
	}
	defer done()
	b := g.bytes()
	// step sends data [lo, hi) while it reads n elements into element off.
	step := func(lo, hi, off, n int) error {
		sent := make(chan error, 1)
		go func() { _, err := out[0].Write(b[lo*4 : hi*4]); sent <- err }()
		_, err := io.ReadFull(in[0], b[off*4:(off+n)*4])
		if serr := <-sent; err == nil {
			err = serr
		}
		return err
	}
	allreduce := func() error {
		for s := 0; s < g.c.Ranks-1; s++ {
			lo, hi := g.span(g.sendRS(s))
			rlo, rhi := g.span(g.recvRS(s))
			if err := step(lo, hi, g.slot(s), rhi-rlo); err != nil {
				return err
			}
			g.reduce(s)
		}
		for s := 0; s < g.c.Ranks-1; s++ {
			lo, hi := g.span(g.sendAG(s))
			rlo, rhi := g.span(g.sendAG(s) - 1) // what the previous rank sends
			if err := step(lo, hi, rlo, rhi-rlo); err != nil {
				return err
			}
		}
		return nil
	}
	return g.iterate(r, func() error { return nil }, allreduce, "tcp")
}

// Compare runs the ring over RDMA, then over TCP.
func Compare(ctx context.Context, c Config, start func(Config) job.Starter) ([]Result, error) {
	return job.BothWays(c, Config.withTCP, func(c Config) (Result, error) { return Run(ctx, c, start(c)) })
}

func (c Config) withTCP(tcp bool) Config { c.TCP = tcp; return c }

// Table writes results as a markdown table.
func Table(w io.Writer, c Config, rs []Result) {
	fmt.Fprintf(w, "Ring all-reduce: %d ranks, %d float32 each (%.1f MiB), %d iterations, median\n\n",
		c.Ranks, c.Count, float64(c.Count*4)/(1<<20), c.Iters)
	fmt.Fprintln(w, "| ring | median ms | algbw Gbit/s | busbw Gbit/s | CPU s per all-reduce, all ranks | socket drops | elements checked exactly |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		name := "RDMA WRITE with immediate"
		if r.Transport == "tcp" {
			name = "TCP"
		}
		fmt.Fprintf(w, "| %s | %.2f | %.2f | %.2f | %.3f | %d | %d |\n", name, r.Median()*1e3, r.AlgGbps(), r.BusGbps(), r.CPU, r.Drops, r.Checked)
	}
}
