package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"sync/atomic"
	"syscall"
	"time"
)

// ctl is the control connection between the two peers of a case: JSON
// values, one per line.
type ctl struct {
	c   net.Conn
	enc *json.Encoder
	dec *json.Decoder
}

func newCtl(c net.Conn) *ctl {
	return &ctl{c: c, enc: json.NewEncoder(c), dec: json.NewDecoder(bufio.NewReader(c))}
}

func (c *ctl) send(v any) error { return c.enc.Encode(v) }

func (c *ctl) recv(v any) error { return c.dec.Decode(v) }

// signal is a one-word message: "stop", "done", "ready".
type signal struct{ Sig string }

// watcher follows the other side's signals in the background: "mark"
// when its measured interval starts, then one final signal ("stop",
// "done") when it ends. It takes this process's CPU time at both, so the
// side that does not measure still reports its CPU over the same interval.
type watcher struct {
	stop     atomic.Bool
	ended    chan struct{}
	cpu0     time.Duration
	cpu1     time.Duration
	marked   bool
	lastSeen string
}

// watch starts a watcher on c.
func (c *ctl) watch() *watcher {
	w := &watcher{ended: make(chan struct{})}
	go func() {
		defer close(w.ended)
		for {
			var s signal
			if err := c.recv(&s); err != nil {
				w.stop.Store(true)
				return
			}
			if s.Sig == "mark" {
				w.cpu0, w.marked = cpuTime(), true
				continue
			}
			w.cpu1, w.lastSeen = cpuTime(), s.Sig
			w.stop.Store(true)
			return
		}
	}()
	return w
}

// context returns a context that ends with the other side's final signal
// (or parent), for waits that must notice it.
func (w *watcher) context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-w.ended:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// wait blocks until the final signal (or the end of the connection).
func (w *watcher) wait() error {
	<-w.ended
	if w.lastSeen == "" {
		return errors.New("control: the other side went away")
	}
	return nil
}

// cpu returns this process's CPU time between the other side's mark and
// its final signal (0 before both arrived).
func (w *watcher) cpu() time.Duration {
	select {
	case <-w.ended:
	default:
		return 0
	}
	if !w.marked || w.lastSeen == "" {
		return 0
	}
	return w.cpu1 - w.cpu0
}

// cpuTime is the user and system CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// peer is one side of a running case.
type peer struct {
	c      Case
	server bool
	ctl    *ctl
	cpu0   time.Duration // CPU time at the start of this side's measurement
}

// shards is this side's rxego device shard count (Sched; 0: the default).
func (p *peer) shards() int {
	if p.server {
		return p.c.Sched.ServerShards
	}
	return p.c.Sched.ClientShards
}

// markStart tells the other side the measured interval begins, and notes
// this process's CPU time.
func (p *peer) markStart() {
	p.cpu0 = cpuTime()
	_ = p.ctl.send(signal{"mark"})
}

// cpu returns the CPU time used since markStart.
func (p *peer) cpu() time.Duration { return cpuTime() - p.cpu0 }

func (p *peer) role() string {
	if p.server {
		return "server"
	}
	return "client"
}

// runner runs one side of a case kind.
type runner func(p *peer) (Result, error)

var runners = map[Kind]runner{}

// acceptTimeout bounds how long a server waits for its client.
const acceptTimeout = 30 * time.Second

// Peer is the child-process entry point: "peer -role server|client -case
// JSON [-ctl ADDR]". A server prints "ctl ADDR" on stdout once it listens;
// both sides print "result JSON" at the end. With $RXEGO_BENCH_PROFILE
// set to a directory, each side writes its CPU profile there
// (server.pprof, client.pprof). With $RXEGO_BENCH_TRACE set to a
// directory, each side writes an execution trace of one second, from one
// second after it starts, there (server.trace, client.trace): the
// goroutine switches and wake-ups per round trip (bench/roundtrips.sh).
func Peer(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("peer", flag.ContinueOnError)
	role := fs.String("role", "", "server or client")
	spec := fs.String("case", "", "the case, as JSON")
	addr := fs.String("ctl", "", "client: the server's control address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var c Case
	if err := json.Unmarshal([]byte(*spec), &c); err != nil {
		return fmt.Errorf("peer: bad -case: %w", err)
	}
	run, ok := runners[c.Kind]
	if !ok {
		return fmt.Errorf("peer: unknown case kind %q", c.Kind)
	}
	if err := applySched(c.Sched, *role == "server"); err != nil {
		return fmt.Errorf("peer: %w", err)
	}
	var conn net.Conn
	switch *role {
	case "server":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "ctl %s\n", ln.Addr())
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(acceptTimeout))
		conn, err = ln.Accept()
		ln.Close()
		if err != nil {
			return fmt.Errorf("peer: no client: %w", err)
		}
	case "client":
		var err error
		conn, err = net.DialTimeout("tcp", *addr, acceptTimeout)
		if err != nil {
			return err
		}
	default:
		return errors.New("peer: -role must be server or client")
	}
	defer conn.Close()
	if dir := os.Getenv("RXEGO_BENCH_PROFILE"); dir != "" {
		// A CPU profile of each side, for looking into a case.
		f, err := os.Create(filepath.Join(dir, *role+".pprof"))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if dir := os.Getenv("RXEGO_BENCH_TRACE"); dir != "" {
		stop, err := traceLater(filepath.Join(dir, *role+".trace"), time.Second, time.Second)
		if err != nil {
			return err
		}
		defer stop()
	}
	p := &peer{c: c, server: *role == "server", ctl: newCtl(conn)}
	res, err := run(p)
	res.Case, res.Role = c, p.role()
	if err != nil {
		res.Err = err.Error()
	}
	b, _ := json.Marshal(res)
	fmt.Fprintf(stdout, "result %s\n", b)
	return err
}

// traceLater writes an execution trace of the interval [after,
// after+span) from now to path; the function it returns ends it early
// and waits for the file to be written.
func traceLater(path string, after, span time.Duration) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer f.Close()
		select {
		case <-quit:
			return
		case <-time.After(after):
		}
		if trace.Start(f) != nil {
			return
		}
		select {
		case <-quit:
		case <-time.After(span):
		}
		trace.Stop()
	}()
	return func() { close(quit); <-done }, nil
}

// runPair runs both sides of c in this process, connected by a loopback
// TCP control connection: for tests.
func runPair(c Case) (Result, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Result{}, err
	}
	defer ln.Close()
	type out struct {
		r   Result
		err error
	}
	srv := make(chan out, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			srv <- out{err: err}
			return
		}
		defer conn.Close()
		r, err := runners[c.Kind](&peer{c: c, server: true, ctl: newCtl(conn)})
		r.Role = "server"
		srv <- out{r, err}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return Result{}, err
	}
	cr, cerr := runners[c.Kind](&peer{c: c, ctl: newCtl(conn)})
	cr.Role = "client"
	conn.Close()
	s := <-srv
	r := merge(cr, s.r)
	r.Case = c
	return r, errors.Join(cerr, s.err)
}
