// Package prefixcache is a shared prefix cache served by one-sided RDMA
// READ: an owner process holds the KV cache of a long system prompt that
// many requests share, registers it for remote READ, hands its address
// and rkey out, and then does nothing: its application code posts no
// receive and polls no completion. Reader processes (decode workers that
// need the prefix) pull it with READs. The owner's process CPU is taken
// with getrusage over the pull, and the same is done for a TCP server
// that must send the bytes itself.
//
// What to expect: with an RDMA NIC the owner's CPU would not be involved
// at all; the NIC answers the READs from memory. rxego is a software
// RoCE stack (as is the kernel's rdma_rxe): the owner host's CPU still
// runs the transport (receives the READ requests, builds and sends the
// responses, takes the ACKs), so the owner process spends CPU; what stays
// idle is the owner's application.
//
// Rank 0 is the owner, ranks 1..Readers the readers.
package prefixcache

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

// Config is one run.
type Config struct {
	// Bytes is the prefix's KV size.
	Bytes int
	// Readers pull it, Rounds times each.
	Readers, Rounds int
	// Chunk is the size of one READ, Depth how many each reader keeps
	// outstanding (at most 16: the QPs' max_rd_atomic).
	Chunk, Depth int
	// TCP serves the prefix from a TCP server instead.
	TCP bool
	// Verify makes each reader check its copy byte for byte.
	Verify bool
	// Devices, when set, gives each rank's RDMA device options (a Tap);
	// in-process runs only.
	Devices func(rank int) *rxego.Options `json:"-"`
}

// Result is one rank's view.
type Result struct {
	Transport string
	Readers   int
	Served    int     // bytes the owner served in all (readers x rounds x Bytes)
	Wall      float64 // seconds a reader pulled (Run: the slowest reader)
	CPU       float64 // this process's CPU seconds (owner: from the start until every reader was done)
	ReaderCPU float64 // the readers' CPU seconds, summed (owner's result)
	Drops     uint64  // datagrams the sockets dropped (Run: all ranks')
	Verified  bool
}

// Gbps is the readers' aggregate rate.
func (r Result) Gbps() float64 { return float64(r.Served) * 8 / r.Wall / 1e9 }

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Bytes < 1 || c.Bytes > 8<<30 || c.Readers < 1 || c.Readers > 64 || c.Rounds < 1 ||
		c.Chunk < 1 || c.Chunk > 1<<30 || c.Depth < 1 || c.Depth > 16 {
		return fmt.Errorf("prefixcache: bad configuration %+v", c)
	}
	return nil
}

const seed = 0x7072

// Run runs the owner and the readers started by start and returns the
// owner's result (with the readers' CPU and verification folded in).
func Run(ctx context.Context, c Config, start job.Starter) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	var rs []Result
	if err := job.Launch(ctx, 1+c.Readers, start, &rs); err != nil {
		return Result{}, err
	}
	// The wall time is the slowest reader's pull (the owner's interval
	// also holds the readers' checks).
	own := rs[0]
	own.Verified, own.Wall = c.Verify, 0
	for _, r := range rs[1:] {
		own.ReaderCPU += r.CPU
		own.Verified = own.Verified && r.Verified
		own.Wall = max(own.Wall, r.Wall)
		own.Drops += r.Drops
	}
	return own, nil
}

// Rank is the work of the owner (rank 0) or a reader.
func Rank(c Config) job.RankFunc {
	return func(ctx context.Context, r *job.Rank) (any, error) {
		if err := c.Validate(); err != nil {
			return nil, err
		}
		switch {
		case r.ID == 0 && c.TCP:
			return ownTCP(ctx, c, r)
		case r.ID == 0:
			return ownRDMA(c, r)
		case c.TCP:
			return readTCP(ctx, c, r)
		}
		return readRDMA(ctx, c, r)
	}
}

// meter takes the wall time and this process's CPU over the pull.
type meter struct {
	t0   time.Time
	cpu0 time.Duration
}

func startMeter() meter { return meter{time.Now(), job.CPU()} }

func (m meter) result(c Config, transport string) Result {
	return Result{Transport: transport, Readers: c.Readers, Served: c.Readers * c.Rounds * c.Bytes,
		Wall: time.Since(m.t0).Seconds(), CPU: (job.CPU() - m.cpu0).Seconds()}
}

// ownRDMA registers the prefix, connects one QP per reader and then
// only waits on the job's out-of-band channel (a blocking TCP read) until
// the readers are done: no receive, no poll, no work request.
func ownRDMA(c Config, r *job.Rank) (any, error) {
	buf := make([]byte, c.Bytes)
	job.Fill(buf, seed, 0)
	var links []job.Link // QP i serves reader i+1
	for i := range c.Readers {
		links = append(links, job.Link{Local: i, Rank: 1 + i, QP: 0})
	}
	n, _, err := job.OpenLinked(r, job.NodeConfig{Buf: buf, Access: rxego.AccessRemoteRead, QPs: c.Readers,
		Options: job.DeviceOptions(c.Devices, r.ID)}, links)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	if err := r.Barrier(); err != nil { // connected: the readers start
		return nil, err
	}
	m := startMeter()
	if err := r.Barrier(); err != nil { // every reader is done
		return nil, err
	}
	res := m.result(c, "rdma")
	res.Drops = n.Drops()
	return res, nil
}

func readRDMA(ctx context.Context, c Config, r *job.Rank) (any, error) {
	buf := make([]byte, c.Bytes)
	job.Touch(buf)
	n, eps, err := job.OpenLinked(r, job.NodeConfig{Buf: buf, QPs: 1, SendDepth: c.Depth, CQDepth: c.Depth,
		Options: job.DeviceOptions(c.Devices, r.ID)}, []job.Link{{Local: 0, Rank: 0, QP: r.ID - 1}})
	if err != nil {
		return nil, err
	}
	defer n.Close()
	owner := eps[0]
	if err := r.Barrier(); err != nil {
		return nil, err
	}
	m := startMeter()
	chunks := (c.Bytes + c.Chunk - 1) / c.Chunk
	total := chunks * c.Rounds
	wcs := make([]rxego.WC, c.Depth)
	posted, done := 0, 0
	for done < total {
		for posted < total && posted-done < c.Depth {
			off := (posted % chunks) * c.Chunk
			size := min(c.Chunk, c.Bytes-off)
			if err := n.QPs[0].PostSend(rxego.SendWR{ID: uint64(posted), Opcode: rxego.WRRead, Flags: rxego.SendSignaled,
				SGL: n.SGE(off, size), RemoteAddr: owner.VA + uint64(off), RKey: owner.RKey}); err != nil {
				return nil, err
			}
			posted++
		}
		k, err := job.Poll(ctx, n.SendCQ, wcs)
		if err != nil {
			return nil, err
		}
		done += k
	}
	res := m.result(c, "rdma")
	res.Drops = n.Drops()
	if c.Verify {
		if err := job.Check(buf, seed, 0); err != nil {
			return nil, fmt.Errorf("prefixcache: reader %d: %w", r.ID, err)
		}
		res.Verified = true
	}
	return res, r.Barrier()
}

// TCP: a reader asks for the whole prefix (8-byte offset, 8-byte length)
// once a round; the server writes it from its buffer.

func ownTCP(ctx context.Context, c Config, r *job.Rank) (any, error) {
	buf := make([]byte, c.Bytes)
	job.Fill(buf, seed, 0)
	_, conns, done, err := r.TCP(ctx, nil, 0, c.Readers)
	if err != nil {
		return nil, err
	}
	defer done()
	errs := make(chan error, len(conns))
	for _, cn := range conns {
		go func() { errs <- serve(cn, buf) }()
	}
	if err := r.Barrier(); err != nil {
		return nil, err
	}
	m := startMeter()
	if err := r.Barrier(); err != nil {
		return nil, err
	}
	res := m.result(c, "tcp")
	done() // the readers are done: end the serving goroutines
	for range conns {
		if err := <-errs; err != nil && !errors.Is(err, net.ErrClosed) {
			return nil, err
		}
	}
	return res, nil
}

// serve answers one reader's requests until it goes away.
func serve(cn net.Conn, buf []byte) error {
	var req [16]byte
	for {
		if _, err := io.ReadFull(cn, req[:]); err != nil {
			return nil // the reader is done (or the owner closed the connection)
		}
		off, n := binary.BigEndian.Uint64(req[:]), binary.BigEndian.Uint64(req[8:])
		if off > uint64(len(buf)) || n > uint64(len(buf))-off {
			return fmt.Errorf("prefixcache: request for %d bytes at %d", n, off)
		}
		if _, err := cn.Write(buf[off : off+n]); err != nil {
			return err
		}
	}
}

func readTCP(ctx context.Context, c Config, r *job.Rank) (any, error) {
	buf := make([]byte, c.Bytes)
	job.Touch(buf)
	conns, _, done, err := r.TCP(ctx, []int{0}, 1, 0)
	if err != nil {
		return nil, err
	}
	defer done()
	if err := r.Barrier(); err != nil {
		return nil, err
	}
	m := startMeter()
	var req [16]byte
	binary.BigEndian.PutUint64(req[8:], uint64(c.Bytes))
	for range c.Rounds {
		if _, err := conns[0].Write(req[:]); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(conns[0], buf); err != nil {
			return nil, err
		}
	}
	res := m.result(c, "tcp")
	if c.Verify {
		if err := job.Check(buf, seed, 0); err != nil {
			return nil, fmt.Errorf("prefixcache: reader %d: %w", r.ID, err)
		}
		res.Verified = true
	}
	return res, r.Barrier()
}

// Compare runs the RDMA owner and then the TCP server with the same
// configuration.
func Compare(ctx context.Context, c Config, start func(Config) job.Starter) ([]Result, error) {
	return job.BothWays(c, Config.withTCP, func(c Config) (Result, error) { return Run(ctx, c, start(c)) })
}

func (c Config) withTCP(tcp bool) Config { c.TCP = tcp; return c }

// Table writes results as a markdown table.
func Table(w io.Writer, c Config, rs []Result) {
	fmt.Fprintf(w, "Prefix: %.1f MiB, %d readers x %d rounds (READs of %d KiB, %d outstanding per reader)\n\n",
		float64(c.Bytes)/(1<<20), c.Readers, c.Rounds, c.Chunk>>10, c.Depth)
	fmt.Fprintln(w, "| owner | served MiB | wall ms | Gbit/s (all readers) | owner process CPU s | owner CPU s per GiB | readers' CPU s | socket drops | checked |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, r := range rs {
		name := "RDMA: registers, then idle (no receive, no poll)"
		if r.Transport == "tcp" {
			name = "TCP server: writes the bytes"
		}
		fmt.Fprintf(w, "| %s | %d | %.1f | %.2f | %.3f | %.3f | %.3f | %d | %v |\n", name, r.Served>>20, r.Wall*1e3, r.Gbps(),
			r.CPU, r.CPU/(float64(r.Served)/(1<<30)), r.ReaderCPU, r.Drops, r.Verified)
	}
}
