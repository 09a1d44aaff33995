package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rxego/rxego/conformance/agentproto"
)

const (
	// DefaultRunTimeout bounds a command whose context has no deadline and
	// whose Cmd names no Timeout.
	DefaultRunTimeout = 5 * time.Minute
	// fileTimeout bounds ReadFile, WriteFile and HWCounters.
	fileTimeout = 60 * time.Second
	// waitChunk is how long one wait round trip may block in the agent.
	waitChunk = 20 * time.Second
	// replyMargin is extra time the host allows past the agent's own
	// timeout for the reply to arrive.
	replyMargin = 10 * time.Second
)

// Cmd is a command to run in a guest.
type Cmd struct {
	Argv  []string
	Env   []string // KEY=VALUE, added to the agent's environment
	Dir   string
	Stdin []byte
	// Timeout kills the command (its whole process group) after this long;
	// 0 means the context's deadline or DefaultRunTimeout.
	Timeout time.Duration
}

// Result is how a guest command ended.
type Result struct {
	ExitCode  int    // -1 when ended by a signal
	Signal    string // the signal's name, if any
	TimedOut  bool   // killed by the agent at the timeout
	Truncated bool   // output beyond agentproto.MaxOutput was dropped
	Stdout    []byte
	Stderr    []byte
	Duration  time.Duration
}

// ExitError is returned when a guest command did not exit 0; it carries
// the full Result.
type ExitError struct {
	Guest  string
	Argv   []string
	Result Result
	// KernelLog is the end of the guest kernel's log, read when the
	// command died of a crash signal (crashSignal): the kernel's line for
	// a segfault names the object and offset the process died in, which
	// tells a crash in rdma-core's provider from one in the tool.
	KernelLog string
}

func (e *ExitError) Error() string {
	how := fmt.Sprintf("exit status %d", e.Result.ExitCode)
	switch {
	case e.Result.TimedOut:
		how = fmt.Sprintf("timed out after %v", e.Result.Duration.Round(time.Millisecond))
	case e.Result.Signal != "":
		how = "killed by " + e.Result.Signal
	}
	s := fmt.Sprintf("guest %s: %s: %s; stderr: %s", e.Guest, strings.Join(e.Argv, " "), how,
		tail(e.Result.Stderr, 800))
	if e.KernelLog != "" {
		s += "; the guest kernel's log ends: " + e.KernelLog
	}
	return s
}

// crashSignal reports whether sig, a signal's description as the agent
// reports it, is one a process dies of by itself (a crash) rather than
// one it was sent to end it.
func crashSignal(sig string) bool {
	switch sig {
	case syscall.SIGSEGV.String(), syscall.SIGBUS.String(), syscall.SIGILL.String(),
		syscall.SIGABRT.String(), syscall.SIGFPE.String():
		return true
	}
	return false
}

// kernelLogLines is how much of the guest kernel's log a crash's error
// carries.
const kernelLogLines = 12

// kernelLogTail returns the last lines of the guest kernel's log (busybox
// dmesg), or why it could not read them. It calls the agent directly:
// through Run, a dmesg that crashed would ask for the log again.
func (g *Guest) kernelLogTail() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := g.call(ctx, &agentproto.Request{Op: agentproto.OpRun, Argv: []string{"dmesg"}, TimeoutMS: 5000})
	if err != nil {
		return "(not read: " + err.Error() + ")"
	}
	// Joined so, they stay on the error's line.
	return strings.Join(lastLines(string(resp.Stdout), kernelLogLines), " | ")
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) []string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

// tail returns the last n bytes of b as text.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// ErrGuestExited is wrapped by the error of every call to a guest whose
// QEMU has ended: its kernel panicked (the lab boots with panic=-1 and
// -no-reboot) or powered off.
var ErrGuestExited = errors.New("the guest's QEMU has exited (did its kernel die?)")

// call sends one request over a fresh connection made inside the lab
// namespace and reads the answer; ctx bounds the whole exchange, and so
// does QEMU's exit: a dead guest neither answers nor resets the
// connection, so without that the call would wait minutes for TCP to give
// up.
func (g *Guest) call(ctx context.Context, req *agentproto.Request) (*agentproto.Response, error) {
	addr := net.JoinHostPort(g.ip.String(), strconv.Itoa(agentproto.DefaultPort))
	if g.Exited() {
		return nil, fmt.Errorf("agent %s: %s: %w", addr, req.Op, ErrGuestExited)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-g.exited:
			cancel(ErrGuestExited)
		case <-ctx.Done():
		}
	}()
	// failed names the call; once ctx has ended, by QEMU's exit or the
	// caller, that is the reason rather than the socket's error.
	failed := func(err error) error {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return fmt.Errorf("agent %s: %s: %w", addr, req.Op, err)
	}
	conn, err := g.lab.Dial(ctx, "tcp4", addr)
	if err != nil {
		return nil, failed(err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return nil, failed(err)
	}
	var resp agentproto.Response
	if err := json.NewDecoder(bufio.NewReader(conn)).Decode(&resp); err != nil {
		return nil, failed(err)
	}
	if resp.Error != "" {
		return &resp, fmt.Errorf("guest %s: %s: %s", g.ip, req.Op, resp.Error)
	}
	return &resp, nil
}

func resultOf(r *agentproto.Response) Result {
	return Result{ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut,
		Truncated: r.Truncated, Stdout: r.Stdout, Stderr: r.Stderr,
		Duration: time.Duration(r.DurationNS)}
}

// exitErr returns nil for a clean exit, else an *ExitError.
func (g *Guest) exitErr(argv []string, res Result) error {
	if res.ExitCode == 0 && res.Signal == "" && !res.TimedOut {
		return nil
	}
	e := &ExitError{Guest: g.ip.String(), Argv: argv, Result: res}
	if crashSignal(res.Signal) {
		e.KernelLog = g.kernelLogTail()
	}
	return e
}

// Run runs argv in the guest to completion, like exec.Cmd.Run: the error is
// an *ExitError when the command ran but did not exit 0 (the Result is
// filled either way), another error when it could not run. The context's
// deadline, or DefaultRunTimeout, bounds it.
func (g *Guest) Run(ctx context.Context, argv ...string) (Result, error) {
	return g.Exec(ctx, Cmd{Argv: argv})
}

// Exec is Run with environment, directory, stdin and timeout.
func (g *Guest) Exec(ctx context.Context, c Cmd) (Result, error) {
	if len(c.Argv) == 0 {
		return Result{}, errors.New("lab: empty argv")
	}
	timeout := c.Timeout
	if dl, ok := ctx.Deadline(); ok {
		// Let the agent kill it a little before the caller gives up, so the
		// caller still gets the output.
		left := time.Until(dl) - time.Second
		if left <= 0 {
			return Result{}, context.DeadlineExceeded
		}
		if timeout == 0 || left < timeout {
			timeout = left
		}
	}
	if timeout == 0 {
		timeout = DefaultRunTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout+replyMargin)
	defer cancel()
	resp, err := g.call(cctx, &agentproto.Request{Op: agentproto.OpRun, Argv: c.Argv, Env: c.Env,
		Dir: c.Dir, Stdin: c.Stdin, TimeoutMS: timeout.Milliseconds()})
	if err != nil {
		return Result{}, err
	}
	res := resultOf(resp)
	return res, g.exitErr(c.Argv, res)
}

// Proc is a command running in the background in a guest.
type Proc struct {
	g    *Guest
	id   uint64
	argv []string
}

// Start starts argv in the background in the guest.
func (g *Guest) Start(argv ...string) (*Proc, error) {
	return g.StartCmd(Cmd{Argv: argv})
}

// StartCmd is Start with environment, directory and stdin (Timeout is not
// used: bound the process with Wait's context and Kill).
func (g *Guest) StartCmd(c Cmd) (*Proc, error) {
	if len(c.Argv) == 0 {
		return nil, errors.New("lab: empty argv")
	}
	ctx, cancel := context.WithTimeout(context.Background(), fileTimeout)
	defer cancel()
	resp, err := g.call(ctx, &agentproto.Request{Op: agentproto.OpStart, Argv: c.Argv, Env: c.Env,
		Dir: c.Dir, Stdin: c.Stdin})
	if err != nil {
		return nil, err
	}
	return &Proc{g: g, id: resp.ID, argv: c.Argv}, nil
}

// Wait waits for the process to end; like Run, a non-zero exit is an
// *ExitError. When ctx ends first, Wait returns ctx's error and the process
// keeps running (Kill it). Without a deadline on ctx, DefaultRunTimeout
// bounds the wait.
func (p *Proc) Wait(ctx context.Context) (Result, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultRunTimeout)
		defer cancel()
	}
	for {
		chunk := waitChunk
		if dl, _ := ctx.Deadline(); time.Until(dl) < chunk {
			chunk = time.Until(dl)
		}
		if chunk <= 0 {
			return Result{}, ctx.Err()
		}
		cctx, cancel := context.WithTimeout(ctx, chunk+replyMargin)
		resp, err := p.g.call(cctx, &agentproto.Request{Op: agentproto.OpWait, ID: p.id,
			TimeoutMS: max(chunk.Milliseconds(), 1)})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return Result{}, ctx.Err()
			}
			return Result{}, err
		}
		if resp.Done {
			res := resultOf(resp)
			return res, p.g.exitErr(p.argv, res)
		}
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
	}
}

// Kill sends SIGKILL to the process's process group.
func (p *Proc) Kill() error { return p.Signal(syscall.SIGKILL) }

// Signal sends sig to the process's process group.
func (p *Proc) Signal(sig syscall.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), fileTimeout)
	defer cancel()
	_, err := p.g.call(ctx, &agentproto.Request{Op: agentproto.OpKill, ID: p.id, Signal: int(sig)})
	return err
}

// Output returns the process's stdout and stderr so far.
func (p *Proc) Output() (stdout, stderr []byte, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), fileTimeout)
	defer cancel()
	resp, err := p.g.call(ctx, &agentproto.Request{Op: agentproto.OpOutput, ID: p.id})
	if err != nil {
		return nil, nil, err
	}
	return resp.Stdout, resp.Stderr, nil
}

// ReadFile returns the content of a file in the guest (its root is the
// host's, read-only, with the guest's own /proc, /sys, /dev, /tmp, /run).
func (g *Guest) ReadFile(path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), fileTimeout)
	defer cancel()
	resp, err := g.call(ctx, &agentproto.Request{Op: agentproto.OpRead, Path: path})
	if err != nil {
		return nil, err
	}
	return resp.Data, nil
}

// WriteFile writes a file in the guest; only its tmpfs (/tmp, /run, /var/tmp,
// /dev/shm) and GuestShareDir are writable.
func (g *Guest) WriteFile(path string, data []byte, perm uint32) error {
	ctx, cancel := context.WithTimeout(context.Background(), fileTimeout)
	defer cancel()
	_, err := g.call(ctx, &agentproto.Request{Op: agentproto.OpWrite, Path: path, Data: data, Mode: perm})
	return err
}

// HWCounters returns rxe0's port 1 hardware counters
// (/sys/class/infiniband/rxe0/ports/1/hw_counters/*) by name, e.g.
// "rcvd_pkts", "sent_pkts", "retry_exceeded_err". "lifespan" is a setting,
// not a counter, and is left out.
func (g *Guest) HWCounters() (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), fileTimeout)
	defer cancel()
	resp, err := g.call(ctx, &agentproto.Request{Op: agentproto.OpGlob, Path: rxePort + "/hw_counters/*"})
	if err != nil {
		return nil, err
	}
	if len(resp.Files) == 0 {
		return nil, fmt.Errorf("guest %s: no rxe0 hw_counters", g.ip)
	}
	out := make(map[string]uint64, len(resp.Files))
	for path, data := range resp.Files {
		name := filepath.Base(path)
		if name == "lifespan" {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("guest %s: counter %s: %q: %w", g.ip, name, data, err)
		}
		out[name] = v
	}
	return out, nil
}

// GID returns rxe0's port 1 GID at index (0: link-local RoCEv2, 1: the
// IPv4 address as ::ffff:a.b.c.d, further ones: IPv6 addresses).
func (g *Guest) GID(index int) (net.IP, error) {
	if index < 0 {
		return nil, fmt.Errorf("GID index %d", index)
	}
	data, err := g.ReadFile(fmt.Sprintf("%s/gids/%d", rxePort, index))
	if err != nil {
		return nil, err
	}
	ip := net.ParseIP(strings.TrimSpace(string(data)))
	if ip == nil {
		return nil, fmt.Errorf("guest %s: GID %d: %q", g.ip, index, data)
	}
	return ip, nil
}

// CounterDelta returns after-before for every counter in after (counters
// missing from before count from 0; a counter that went down gives 0).
func CounterDelta(before, after map[string]uint64) map[string]uint64 {
	d := make(map[string]uint64, len(after))
	for k, a := range after {
		if b := before[k]; a >= b {
			d[k] = a - b
		}
	}
	return d
}

// WaitTCPListen waits until something in the guest listens on TCP port
// (IPv4 or IPv6), e.g. a perftest or ibv_*_pingpong server on 18515, so
// that a client started next does not race it. ctx bounds the wait
// (fileTimeout when it has no deadline).
func (g *Guest) WaitTCPListen(ctx context.Context, port int) error {
	if port <= 0 || port > 65535 {
		return fmt.Errorf("port %d", port)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, fileTimeout)
		defer cancel()
	}
	for {
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			data, err := g.ReadFile(f)
			if err != nil {
				return err
			}
			if listensOn(data, port) {
				return nil
			}
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("guest %s: nothing listens on TCP port %d: %w", g.ip, port, err)
		}
	}
}

// listensOn reports whether a /proc/net/tcp{,6} table has a socket in
// LISTEN state (0A) on local port.
func listensOn(table []byte, port int) bool {
	want := fmt.Sprintf(":%04X", port)
	for _, line := range strings.Split(string(table), "\n") {
		f := strings.Fields(line)
		// sl local_address rem_address st ...
		if len(f) > 3 && strings.HasSuffix(f[1], want) && f[3] == "0A" {
			return true
		}
	}
	return false
}
