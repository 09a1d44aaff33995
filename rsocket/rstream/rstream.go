// Package rstream is rxego's peer for librdmacm's rstream: the same
// ping-pong and streaming tests over any net.Conn (an rsocket, or TCP for
// rstream -T s), with the same output, so that rxego can face rstream in
// either role.
//
// The protocol (rdma-core librdmacm/examples/rstream.c): after a 16-byte
// exchange (client first), each test runs iterations of transfer_count
// transfers of transfer_size bytes from the client, then as many back.
// Without a custom size, count or iterations, the client runs latency
// tests (count 1, many iterations) on one connection, closes it, and
// runs bandwidth tests (iterations 1, many transfers) on a second. With
// verification (-T v) every byte sent is the next of a counter that runs
// on from test to test and connection to connection, in each direction,
// and the receiver checks it.
package rstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// DefaultPort is rstream's -p default.
const DefaultPort = 7471

// testSizes is rstream's table: sizes, and whether they run only with -S
// all.
var testSizes = []struct {
	size int
	all  bool
}{
	{1 << 6, false},
	{1 << 7, true}, {1<<7 + 1<<6, true},
	{1 << 8, true}, {1<<8 + 1<<7, true},
	{1 << 9, true}, {1<<9 + 1<<8, true},
	{1 << 10, true}, {1<<10 + 1<<9, true},
	{1 << 11, true}, {1<<11 + 1<<10, true},
	{1 << 12, false}, {1<<12 + 1<<11, true},
	{1 << 13, true}, {1<<13 + 1<<12, true},
	{1 << 14, true}, {1<<14 + 1<<13, true},
	{1 << 15, true}, {1<<15 + 1<<14, true},
	{1 << 16, false}, {1<<16 + 1<<15, true},
	{1 << 17, true}, {1<<17 + 1<<16, true},
	{1 << 18, true}, {1<<18 + 1<<17, true},
	{1 << 19, true}, {1<<19 + 1<<18, true},
	{1 << 20, false}, {1<<20 + 1<<19, true},
	{1 << 21, true}, {1<<21 + 1<<20, true},
	{1 << 22, true}, {1<<22 + 1<<21, true},
}

// Config is what both roles take: rstream's -S, -C, -I and -T v.
type Config struct {
	// Custom runs one test of Size, Count and Iterations on one
	// connection (rstream with -S size, -C or -I); otherwise the standard
	// latency and bandwidth tests run.
	Custom     bool
	Size       int  // transfer size (default 1000)
	Count      int  // transfers per iteration (default 1000)
	Iterations int  // default 1
	All        bool // -S all: every size of the table
	Verify     bool // -T v
	// Direct runs riostream's tests instead: the connections must be
	// DirectConns (rsocket connections whose peer allows an iomap entry).
	Direct bool
	Out    io.Writer
}

// ErrVerify is returned when received data is not what the peer's
// counter gives.
var ErrVerify = errors.New("rstream: data verification failed")

// Connect makes the next connection; latency says which test series it
// is for (rstream sets a larger inline size for latency).
type Connect func(ctx context.Context, latency bool) (net.Conn, error)

// run is one side's state.
type run struct {
	cfg          Config
	client       bool
	buf          []byte
	sendData     byte // format_buf's counter
	recvData     byte // verify_buf's
	recvTotal    int64
	name         string
	size, count  int
	iters        int
	start, stopT time.Time
}

// Header prints the table's header, as rstream does before connecting.
func Header(w io.Writer) {
	fmt.Fprintf(w, "%-10s%-8s%-8s%-8s%-8s%8s %10s%13s\n",
		"name", "bytes", "xfers", "iters", "total", "time", "Gb/sec", "usec/xfer")
}

// Run runs rstream's tests as client or server, connecting through
// connect, and prints a row of rstream's table to cfg.Out per test.
func Run(ctx context.Context, client bool, connect Connect, cfg Config) error {
	if cfg.Size == 0 {
		cfg.Size = 1000
	}
	if cfg.Count == 0 {
		cfg.Count = 1000
	}
	if cfg.Iterations == 0 {
		cfg.Iterations = 1
	}
	if cfg.Size < 1 || cfg.Count < 1 || cfg.Iterations < 1 || cfg.Size > 1<<30 {
		return fmt.Errorf("rstream: size %d, count %d, iterations %d out of range", cfg.Size, cfg.Count, cfg.Iterations)
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	r := &run{cfg: cfg, client: client, name: "custom", size: cfg.Size, count: cfg.Count, iters: cfg.Iterations}
	bufSize := testSizes[len(testSizes)-1].size
	if cfg.Custom {
		bufSize = cfg.Size
	}
	r.buf = make([]byte, bufSize)
	if cfg.Custom {
		return r.series(ctx, connect, true, func(int) bool { return true }, nil)
	}
	if err := r.series(ctx, connect, true, r.pick, r.latency); err != nil {
		return err
	}
	return r.series(ctx, connect, false, r.pick, r.bandwidth)
}

func (r *run) pick(i int) bool { return !testSizes[i].all || r.cfg.All }

// series runs tests on one connection: every size pick takes (or the
// custom test when setup is nil), then closes it.
func (r *run) series(ctx context.Context, connect Connect, latency bool, pick func(int) bool, setup func(int)) error {
	c, err := connect(ctx, latency)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	test := r.test
	if r.cfg.Direct {
		test = func(c net.Conn) error { return r.directTest(ctx, c) }
	}
	if setup == nil {
		return test(c)
	}
	for i := range testSizes {
		if !pick(i) {
			continue
		}
		setup(testSizes[i].size)
		if err := test(c); err != nil {
			return err
		}
	}
	return nil
}

func (r *run) latency(size int) {
	r.name = sizeStr(int64(size), 4) + "_lat"
	r.count, r.size, r.iters = 1, size, sizeToCount(size)
}

func (r *run) bandwidth(size int) {
	r.name = sizeStr(int64(size), 4) + "_bw"
	r.iters, r.size, r.count = 1, size, sizeToCount(size)
}

// test is run_test: the 16-byte sync, then the timed transfers.
func (r *run) test(c net.Conn) error {
	first, second := r.send, r.recv
	if !r.client {
		first, second = r.recv, r.send
	}
	if err := first(c, 16); err != nil {
		return err
	}
	if err := second(c, 16); err != nil {
		return err
	}
	r.start = time.Now()
	for range r.iters {
		for range r.count {
			if err := first(c, r.size); err != nil {
				return err
			}
		}
		for range r.count {
			if err := second(c, r.size); err != nil {
				return err
			}
		}
	}
	r.stopT = time.Now()
	r.show()
	return nil
}

func (r *run) send(c net.Conn, size int) error {
	b := r.buf[:size]
	if r.cfg.Verify {
		r.format(b)
	}
	return r.plainSend(c, size)
}

func (r *run) recv(c net.Conn, size int) error {
	if err := r.plainRecv(c, size); err != nil {
		return err
	}
	if r.cfg.Verify {
		return r.check(r.buf[:size])
	}
	return nil
}

// plainSend and plainRecv move size bytes of the buffer on the stream.
func (r *run) plainSend(c io.ReadWriter, size int) error {
	if _, err := c.Write(r.buf[:size]); err != nil {
		return fmt.Errorf("rsend: %w", err)
	}
	return nil
}

func (r *run) plainRecv(c io.ReadWriter, size int) error {
	if _, err := io.ReadFull(c, r.buf[:size]); err != nil {
		return fmt.Errorf("rrecv: %w", err)
	}
	return nil
}

// format fills b from the send counter (format_buf).
func (r *run) format(b []byte) {
	for i := range b {
		b[i] = r.sendData
		r.sendData++
	}
}

// check compares b with the receive counter (verify_buf).
func (r *run) check(b []byte) error {
	for i := range b {
		if b[i] != r.recvData {
			fmt.Fprintf(r.cfg.Out, "data verification failed byte %d\n", r.recvTotal)
			return fmt.Errorf("%w at byte %d: got %#x, want %#x", ErrVerify, r.recvTotal, b[i], r.recvData)
		}
		r.recvData++
		r.recvTotal++
	}
	return nil
}

// show prints one row, as show_perf.
func (r *run) show() {
	usec := float64(r.stopT.Sub(r.start).Microseconds())
	usec = max(usec, 1)
	bytes := int64(r.iters) * int64(r.count) * int64(r.size) * 2
	fmt.Fprintf(r.cfg.Out, "%-10s%-8s%-8s%-8s%-8s%8.2fs%10.2f%11.2f\n", r.name, sizeStr(int64(r.size), 31),
		cntStr(int64(r.count)), cntStr(int64(r.iters)), sizeStr(bytes, 31),
		usec/1e6, float64(bytes*8)/(1000*usec), usec/float64(r.iters)/float64(r.count*2))
}

// sizeStr is common.c's size_str, truncated to width as its buffer does.
func sizeStr(size int64, width int) string {
	base, mag := int64(1), ""
	switch {
	case size >= 1<<30:
		base, mag = 1<<30, "g"
	case size >= 1<<20:
		base, mag = 1<<20, "m"
	case size >= 1<<10:
		base, mag = 1<<10, "k"
	}
	var fraction int64
	if size/base < 10 {
		fraction = size % base * 10 / base
	}
	s := fmt.Sprintf("%d%s", size/base, mag)
	if fraction != 0 {
		s = fmt.Sprintf("%d.%d%s", size/base, fraction, mag)
	}
	if len(s) > width {
		s = s[:width]
	}
	return s
}

// cntStr is common.c's cnt_str.
func cntStr(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%db", n/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%dm", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%dk", n/1e3)
	}
	return fmt.Sprintf("%d", n)
}

// sizeToCount is common.c's size_to_count.
func sizeToCount(size int) int {
	switch {
	case size >= 1<<20:
		return 100
	case size >= 1<<16:
		return 1000
	case size >= 1<<10:
		return 10000
	}
	return 100000
}
