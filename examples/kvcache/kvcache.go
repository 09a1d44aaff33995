// Package kvcache is the KV-cache hand-off of disaggregated inference: a
// prefill process computes a request's attention keys and values layer
// by layer and a decode process, on another machine, needs them to
// generate tokens. The prefill side RDMA-WRITEs each layer's KV blocks
// straight into the decode side's registered buffer and ends each layer
// with a WRITE with immediate whose immediate is the layer's index:
// "WRITE for the data, the immediate for the signal". RC delivers a QP's
// WRITEs in order, so when the decode side's receive completes with
// immediate L, layer L is whole in its memory and it can start on it
// while later layers are still on the wire. Layers are spread
// round-robin over several QPs. The same transfer runs over one or more
// TCP connections for comparison.
//
// The default shape is a DeepSeek-V3 request: 61 layers, 4,096 tokens,
// and multi-head latent attention's compressed KV of 512 values per
// token per layer (the 64 decoupled RoPE values it also caches are left
// out), in bfloat16 (2 bytes): 4 MiB a layer, 244 MiB in all.
//
// Rank 0 is the decode side, rank 1 the prefill side; see package
// internal/app/job for how they meet.
package kvcache

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/app/job"
)

// Shape is the KV cache of one request.
type Shape struct {
	Layers      int // transformer layers
	Tokens      int // tokens in the prompt
	Width       int // KV values per token per layer
	DTypeBytes  int // bytes per value (2: bfloat16)
	BlockTokens int // tokens per KV block: one RDMA WRITE each
}

// DeepSeekV3 is the default shape.
var DeepSeekV3 = Shape{Layers: 61, Tokens: 4096, Width: 512, DTypeBytes: 2, BlockTokens: 64}

// LayerBytes is one layer's KV size.
func (s Shape) LayerBytes() int { return s.Tokens * s.Width * s.DTypeBytes }

// Bytes is the whole cache's size.
func (s Shape) Bytes() int { return s.Layers * s.LayerBytes() }

// blockBytes is one block's size.
func (s Shape) blockBytes() int { return s.BlockTokens * s.Width * s.DTypeBytes }

// Validate checks the shape.
func (s Shape) Validate() error {
	if s.Layers < 1 || s.Tokens < 1 || s.Width < 1 || s.DTypeBytes < 1 || s.BlockTokens < 1 {
		return fmt.Errorf("kvcache: bad shape %+v", s)
	}
	if s.Layers > 1<<20 || s.LayerBytes() > 1<<30 || s.Bytes() > 16<<30 {
		return fmt.Errorf("kvcache: shape %+v too large", s)
	}
	return nil
}

// Config is one transfer.
type Config struct {
	Shape
	// TCP sends over TCP instead of RDMA.
	TCP bool
	// Lanes is how many QPs (RDMA) or connections (TCP) carry the
	// layers, round-robin.
	Lanes int
	// Verify makes the decode side check each layer byte for byte as it
	// arrives (its "start on the layer").
	Verify bool
	// Warm sends the whole cache once, untimed, over the same QPs or
	// connections into the same memory before the measured transfer, as
	// a long-lived prefill-decode pair runs warm: the first pass's time is
	// Result.Cold.
	Warm bool
	// Devices, when set, gives each rank's RDMA device options (a Tap);
	// in-process runs only.
	Devices func(rank int) *rxego.Options `json:"-"`
}

// Result is what the decode side saw.
type Result struct {
	Transport string  // "rdma" or "tcp"
	Lanes     int     // QPs or connections
	Bytes     int     // bytes moved
	Total     float64 // seconds from the start until the last layer was usable
	First     float64 // seconds until the first layer was usable
	Gbps      float64 // Bytes*8/Total
	Verified  bool    // every byte checked
	CPU       float64 // the decode process's CPU seconds during the transfer
	SendCPU   float64 // the prefill process's (Run), over its own sending
	Drops     uint64  // datagrams the decode side's socket dropped (RDMA)
	Order     []int   // layers in the order they became usable
	Cold      float64 // with Config.Warm: the untimed first pass's Total
}

// seed is the pattern the prefill side's KV is filled with.
const seed = 0x6b76

// sendDepth is the prefill side's send queue per QP.
const sendDepth = 512

// Run runs a transfer with its two ranks started by start and returns the
// decode side's result.
func Run(ctx context.Context, c Config, start job.Starter) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	var res []Result
	if err := job.Launch(ctx, 2, start, &res); err != nil {
		return Result{}, err
	}
	out := res[0]
	out.SendCPU = res[1].CPU
	return out, nil
}

// Rank is the work of rank 0 (decode) or 1 (prefill).
func Rank(c Config) job.RankFunc {
	return func(ctx context.Context, r *job.Rank) (any, error) {
		if err := c.Validate(); err != nil {
			return nil, err
		}
		if c.Lanes < 1 || c.Lanes > 256 {
			return nil, fmt.Errorf("kvcache: %d lanes", c.Lanes)
		}
		if c.TCP {
			if r.ID == 0 {
				return decodeTCP(ctx, c, r)
			}
			return sent(prefillTCP(ctx, c, r))
		}
		if r.ID == 0 {
			return decodeRDMA(ctx, c, r)
		}
		return sent(prefillRDMA(ctx, c, r))
	}
}

// lanes joins QP i to the other side's QP i.
func lanes(c Config, peer int) []job.Link {
	var ls []job.Link
	for i := range c.Lanes {
		ls = append(ls, job.Link{Local: i, Rank: peer, QP: i})
	}
	return ls
}

// sent is the prefill side's result: the CPU it spent from the start to
// its last completion.
func sent(cpu time.Duration, err error) (any, error) {
	return Result{CPU: cpu.Seconds()}, err
}

// decoder follows layers becoming usable.
type decoder struct {
	c     Config
	buf   []byte
	t0    time.Time
	cpu0  time.Duration
	res   Result
	ready []bool
}

func newDecoder(c Config, buf []byte, transport string) *decoder {
	return &decoder{c: c, buf: buf, res: Result{Transport: transport, Lanes: c.Lanes, Bytes: c.Bytes(), Verified: c.Verify},
		ready: make([]bool, c.Layers)}
}

func (d *decoder) start() { d.t0, d.cpu0 = time.Now(), job.CPU() }

// layer is the decode side starting on layer l, whose signal came at t.
func (d *decoder) layer(l int, t time.Time) error {
	if l < 0 || l >= d.c.Layers || d.ready[l] {
		return fmt.Errorf("kvcache: unexpected signal for layer %d", l)
	}
	d.ready[l] = true
	if len(d.res.Order) == 0 {
		d.res.First = t.Sub(d.t0).Seconds()
	}
	d.res.Order = append(d.res.Order, l)
	d.res.Total = t.Sub(d.t0).Seconds()
	if d.c.Verify {
		lb := d.c.LayerBytes()
		if err := job.Check(d.buf[l*lb:(l+1)*lb], seed, l*lb); err != nil {
			return fmt.Errorf("kvcache: layer %d: %w", l, err)
		}
	}
	return nil
}

func (d *decoder) finish() Result {
	d.res.CPU = (job.CPU() - d.cpu0).Seconds()
	d.res.Gbps = float64(d.res.Bytes) * 8 / d.res.Total / 1e9
	return d.res
}

// passes is how many times the cache goes over: twice when warming up.
func (c Config) passes() int {
	if c.Warm {
		return 2
	}
	return 1
}

// timePass times one pass on the decode side: the clock starts before the
// barrier that lets prefill go, so the decode side never starts it late
// (a descheduled decode process would otherwise see layers that came
// before its start); take calls d.layer for each layer as it becomes
// usable. The last pass's result is returned, with an earlier pass's
// time in Cold.
func timePass(c Config, r *job.Rank, buf []byte, transport string, take func(d *decoder) error) (Result, error) {
	var res Result
	for pass := range c.passes() {
		pc := c
		// Only the measured pass checks the bytes: a check during the
		// untimed one would read memory the next pass's WRITEs then
		// overwrite, ordered only by the barrier's packets.
		pc.Verify = c.Verify && pass == c.passes()-1
		d := newDecoder(pc, buf, transport)
		d.start()
		if err := r.Barrier(); err != nil {
			return res, err
		}
		if err := take(d); err != nil {
			return res, err
		}
		cold := res.Total
		res = d.finish()
		if pass > 0 {
			res.Cold = cold
		}
	}
	return res, nil
}

// sendPasses runs send once a pass on the prefill side, each after the
// barrier the decode side starts its clock at, and returns the CPU time
// of the last.
func sendPasses(c Config, r *job.Rank, send func() error) (time.Duration, error) {
	var cpu time.Duration
	for range c.passes() {
		if err := r.Barrier(); err != nil {
			return 0, err
		}
		cpu0 := job.CPU()
		if err := send(); err != nil {
			return 0, err
		}
		cpu = job.CPU() - cpu0
	}
	return cpu, nil
}

func decodeRDMA(ctx context.Context, c Config, r *job.Rank) (any, error) {
	buf := make([]byte, c.Bytes())
	job.Touch(buf)
	layers := c.Layers * c.passes()
	n, _, err := job.OpenLinked(r, job.NodeConfig{Buf: buf, Access: rxego.AccessRemoteWrite, QPs: c.Lanes,
		RecvDepth: c.passes() * (c.Layers/c.Lanes + 1), CQDepth: layers + 1, Options: job.DeviceOptions(c.Devices, r.ID)}, lanes(c, 1))
	if err != nil {
		return nil, err
	}
	defer n.Close()
	// One receive per layer and pass on the QP that carries it: the
	// WRITE with immediate consumes it (its data went where the WRITE
	// pointed).
	for l := 0; l < layers; l++ {
		if err := n.QPs[l%c.Layers%c.Lanes].PostRecv(rxego.RecvWR{ID: uint64(l)}); err != nil {
			return nil, err
		}
	}
	wcs := make([]rxego.WC, 64)
	res, err := timePass(c, r, buf, "rdma", func(d *decoder) error {
		for got := 0; got < c.Layers; {
			k, err := job.Poll(ctx, n.RecvCQ, wcs)
			if err != nil {
				return err
			}
			now := time.Now()
			for _, wc := range wcs[:k] {
				if err := d.layer(int(wc.Imm), now); err != nil {
					return err
				}
				got++
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.Drops = n.Drops()
	return res, nil
}

func prefillRDMA(ctx context.Context, c Config, r *job.Rank) (time.Duration, error) {
	buf := make([]byte, c.Bytes())
	job.Fill(buf, seed, 0)
	// The QPs share one window's worth in flight: the decode side's
	// socket buffer holds that much (see job.DefaultWindow).
	n, eps, err := job.OpenLinked(r, job.NodeConfig{Buf: buf, QPs: c.Lanes, SendDepth: sendDepth, CQDepth: c.Layers + 1,
		Window: max(job.DefaultWindow/c.Lanes, 16), Options: job.DeviceOptions(c.Devices, r.ID)}, lanes(c, 0))
	if err != nil {
		return 0, err
	}
	defer n.Close()
	dst := eps[0]
	lb, bb := c.LayerBytes(), c.blockBytes()
	nb := (lb + bb - 1) / bb
	if nb > sendDepth {
		return 0, fmt.Errorf("kvcache: %d blocks a layer, more than the send queue's %d", nb, sendDepth)
	}
	wcs := make([]rxego.WC, 64)
	wrs := make([]rxego.SendWR, nb)
	return sendPasses(c, r, func() error {
		outstanding := make([]int, c.Lanes) // WRs posted and not yet known complete, per QP
		done := 0
		reap := func() error {
			k, err := job.Poll(ctx, n.SendCQ, wcs)
			for _, wc := range wcs[:k] {
				// The layer's signaled WRITE with immediate completes
				// after its unsignaled block WRITEs: all of them left
				// the queue.
				outstanding[int(wc.ID)%c.Lanes] -= nb
				done++
			}
			return err
		}
		for l := 0; l < c.Layers; l++ {
			q := l % c.Lanes
			for outstanding[q]+nb > sendDepth {
				if err := reap(); err != nil {
					return err
				}
			}
			for b := range nb {
				off := l*lb + b*bb
				size := min(bb, lb-b*bb)
				wrs[b] = rxego.SendWR{ID: uint64(l), Opcode: rxego.WRWrite, SGL: n.SGE(off, size),
					RemoteAddr: dst.VA + uint64(off), RKey: dst.RKey}
			}
			// The last block carries the layer's signal.
			wrs[nb-1].Opcode, wrs[nb-1].Imm, wrs[nb-1].Flags = rxego.WRWriteImm, uint32(l), rxego.SendSignaled
			if err := n.QPs[q].PostSend(wrs...); err != nil {
				return err
			}
			outstanding[q] += nb
		}
		for done < c.Layers {
			if err := reap(); err != nil {
				return err
			}
		}
		return nil
	})
}

// TCP: each layer goes as an 8-byte header (layer, length) and its bytes
// in one writev, on connection layer % Lanes; the decode side reads it
// straight into the layer's place in its buffer.

func decodeTCP(ctx context.Context, c Config, r *job.Rank) (any, error) {
	buf := make([]byte, c.Bytes())
	job.Touch(buf)
	_, conns, done, err := r.TCP(ctx, nil, 0, c.Lanes)
	if err != nil {
		return nil, err
	}
	defer done()
	type arrival struct {
		layer int
		at    time.Time
		err   error
	}
	arrivals := make(chan arrival, c.Layers)
	lb := c.LayerBytes()
	res, err := timePass(c, r, buf, "tcp", func(d *decoder) error {
		for i, cn := range conns {
			go func() {
				var hdr [8]byte
				for l := i; l < c.Layers; l += c.Lanes {
					if _, err := io.ReadFull(cn, hdr[:]); err != nil {
						arrivals <- arrival{err: err}
						return
					}
					got, size := int(binary.BigEndian.Uint32(hdr[:])), int(binary.BigEndian.Uint32(hdr[4:]))
					if got != l || size != lb {
						arrivals <- arrival{err: fmt.Errorf("kvcache: header for layer %d size %d, want %d size %d", got, size, l, lb)}
						return
					}
					if _, err := io.ReadFull(cn, buf[l*lb:(l+1)*lb]); err != nil {
						arrivals <- arrival{err: err}
						return
					}
					arrivals <- arrival{layer: l, at: time.Now()}
				}
			}()
		}
		for range c.Layers {
			var a arrival
			select {
			case a = <-arrivals:
			case <-ctx.Done():
				return ctx.Err()
			}
			if a.err != nil {
				return a.err
			}
			if err := d.layer(a.layer, a.at); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func prefillTCP(ctx context.Context, c Config, r *job.Rank) (time.Duration, error) {
	buf := make([]byte, c.Bytes())
	job.Fill(buf, seed, 0)
	conns, _, done, err := r.TCP(ctx, []int{0}, c.Lanes, 0)
	if err != nil {
		return 0, err
	}
	defer done()
	lb := c.LayerBytes()
	return sendPasses(c, r, func() error {
		errs := make(chan error, c.Lanes)
		for i, cn := range conns {
			go func() {
				var hdr [8]byte
				for l := i; l < c.Layers; l += c.Lanes {
					binary.BigEndian.PutUint32(hdr[:], uint32(l))
					binary.BigEndian.PutUint32(hdr[4:], uint32(lb))
					// Header and layer in one writev: no 8-byte segment
					// of its own (TCP_NODELAY sends it at once), so the
					// decode side is not woken for the header alone.
					bufs := net.Buffers{hdr[:], buf[l*lb : (l+1)*lb]}
					if _, err := bufs.WriteTo(cn); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		var all error
		for range conns {
			all = errors.Join(all, <-errs)
		}
		return all
	})
}

// Compare runs the transfer over RDMA with qps QPs and (when qps > 1)
// with one, then over one TCP connection and (when conns > 1) over
// conns, each job's ranks started by start; verify and warm set
// Config.Verify and Config.Warm of each.
func Compare(ctx context.Context, s Shape, qps, conns int, verify, warm bool, start func(Config) job.Starter) ([]Result, error) {
	cs := []Config{{Shape: s, Lanes: qps}}
	if qps > 1 {
		// One QP delivers the layers in order: the first is usable soonest.
		cs = append(cs, Config{Shape: s, Lanes: 1})
	}
	cs = append(cs, Config{Shape: s, TCP: true, Lanes: 1})
	if conns > 1 {
		cs = append(cs, Config{Shape: s, TCP: true, Lanes: conns})
	}
	for i := range cs {
		cs[i].Verify, cs[i].Warm = verify, warm
	}
	return job.Each(cs, func(c Config) string {
		return fmt.Sprintf("%s over %d", map[bool]string{false: "rdma", true: "tcp"}[c.TCP], c.Lanes)
	},
		func(c Config) (Result, error) { return Run(ctx, c, start(c)) })
}

// Table writes results as a markdown table.
func Table(w io.Writer, s Shape, rs []Result) {
	fmt.Fprintf(w, "KV cache: %d layers x %d tokens x %d values x %d bytes = %.1f MiB (%.2f MiB a layer, blocks of %d tokens)\n\n",
		s.Layers, s.Tokens, s.Width, s.DTypeBytes, float64(s.Bytes())/(1<<20), float64(s.LayerBytes())/(1<<20), s.BlockTokens)
	fmt.Fprintln(w, "| transfer | total ms | first layer usable ms | Gbit/s | untimed first pass ms | prefill CPU s | decode CPU s | socket drops | checked |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, r := range rs {
		lanes := fmt.Sprintf("RDMA WRITE + WRITE_IMM, %d QPs", r.Lanes)
		if r.Transport == "tcp" {
			lanes = fmt.Sprintf("TCP, %d connection(s)", r.Lanes)
		}
		cold := "–"
		if r.Cold > 0 {
			cold = fmt.Sprintf("%.1f", r.Cold*1e3)
		}
		fmt.Fprintf(w, "| %s | %.1f | %.2f | %.2f | %s | %.3f | %.3f | %d | %v |\n", lanes, r.Total*1e3, r.First*1e3, r.Gbps, cold, r.SendCPU, r.CPU, r.Drops, r.Verified)
	}
}
