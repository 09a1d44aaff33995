package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rxego/rxego/conformance/agentproto"
)

const (
	// defaultWait is how long OpWait blocks when the request names no
	// timeout; the host loops, so this only bounds one round trip.
	defaultWait = 30 * time.Second
	// maxWait caps what one OpWait may ask for.
	maxWait = 10 * time.Minute
	// pipeDrain bounds how long a finished command's output pipes may stay
	// open (held by a grandchild it left behind) before Wait gives up on them.
	pipeDrain = 2 * time.Second
)

// capBuf is an io.Writer that keeps the first agentproto.MaxOutput bytes.
type capBuf struct {
	mu        sync.Mutex
	b         []byte
	truncated bool
}

func (c *capBuf) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	room := agentproto.MaxOutput - len(c.b)
	if len(p) > room {
		c.b = append(c.b, p[:max(room, 0)]...)
		c.truncated = true
	} else {
		c.b = append(c.b, p...)
	}
	return len(p), nil
}

// snapshot returns a copy of the bytes so far.
func (c *capBuf) snapshot() ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.b), c.truncated
}

// proc is one command started by the agent.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr capBuf
	started        time.Time
	done           chan struct{} // closed once the fields below are set

	exitCode int
	signal   string
	timedOut bool
	dur      time.Duration
}

// result renders p's state; p must be done.
func (p *proc) result() *agentproto.Response {
	r := &agentproto.Response{Done: true, ExitCode: p.exitCode, Signal: p.signal,
		TimedOut: p.timedOut, DurationNS: int64(p.dur)}
	var t1, t2 bool
	r.Stdout, t1 = p.stdout.snapshot()
	r.Stderr, t2 = p.stderr.snapshot()
	r.Truncated = t1 || t2
	return r
}

// killGroup signals p's process group (each command gets its own, so that
// helpers a tool forks die with it).
func (p *proc) killGroup(sig syscall.Signal) error {
	err := syscall.Kill(-p.cmd.Process.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// procTable holds the background processes by ID and the PIDs of every
// live command the agent started (so that the orphan reaper leaves them to
// os/exec).
type procTable struct {
	mu     sync.Mutex
	procs  map[uint64]*proc
	pids   map[int]bool
	nextID uint64
}

func newProcTable() *procTable {
	return &procTable{procs: make(map[uint64]*proc), pids: make(map[int]bool)}
}

// launch starts req.Argv and a goroutine that records its end.
func (t *procTable) launch(req *agentproto.Request) (*proc, error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, errors.New("empty argv")
	}
	p := &proc{done: make(chan struct{})}
	cmd := exec.Command(req.Argv[0], req.Argv[1:]...)
	cmd.Env = append(os.Environ(), req.Env...)
	cmd.Dir = req.Dir
	if len(req.Stdin) > 0 {
		cmd.Stdin = bytes.NewReader(req.Stdin)
	}
	cmd.Stdout = &p.stdout
	cmd.Stderr = &p.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = pipeDrain
	p.cmd = cmd

	// Start and registration happen under mu so the reaper never sees an
	// unregistered child of ours.
	t.mu.Lock()
	p.started = time.Now()
	err := cmd.Start()
	if err == nil {
		t.pids[cmd.Process.Pid] = true
	}
	t.mu.Unlock()
	if err != nil {
		return nil, err
	}
	go func() {
		cmd.Wait()
		p.dur = time.Since(p.started)
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.exitCode = -1
			p.signal = ws.Signal().String()
		} else {
			p.exitCode = cmd.ProcessState.ExitCode()
		}
		t.mu.Lock()
		delete(t.pids, cmd.Process.Pid)
		t.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// run executes req to completion, killing it after req.TimeoutMS.
func (t *procTable) run(req *agentproto.Request) *agentproto.Response {
	p, err := t.launch(req)
	if err != nil {
		return errResp(err)
	}
	if req.TimeoutMS > 0 {
		timer := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer timer.Stop()
		select {
		case <-p.done:
		case <-timer.C:
			p.timedOut = true
			p.killGroup(syscall.SIGKILL)
			<-p.done
		}
	} else {
		<-p.done
	}
	return p.result()
}

func (t *procTable) start(req *agentproto.Request) *agentproto.Response {
	p, err := t.launch(req)
	if err != nil {
		return errResp(err)
	}
	t.mu.Lock()
	t.nextID++
	id := t.nextID
	t.procs[id] = p
	t.mu.Unlock()
	return &agentproto.Response{ID: id}
}

func (t *procTable) lookup(id uint64) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.procs[id]
	if !ok {
		return nil, fmt.Errorf("no process with id %d", id)
	}
	return p, nil
}

func (t *procTable) wait(req *agentproto.Request) *agentproto.Response {
	p, err := t.lookup(req.ID)
	if err != nil {
		return errResp(err)
	}
	d := defaultWait
	if req.TimeoutMS > 0 {
		d = min(time.Duration(req.TimeoutMS)*time.Millisecond, maxWait)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		return &agentproto.Response{ID: req.ID, Done: false}
	}
	t.mu.Lock()
	delete(t.procs, req.ID)
	t.mu.Unlock()
	r := p.result()
	r.ID = req.ID
	return r
}

func (t *procTable) kill(req *agentproto.Request) *agentproto.Response {
	p, err := t.lookup(req.ID)
	if err != nil {
		return errResp(err)
	}
	sig := syscall.SIGKILL
	if req.Signal != 0 {
		sig = syscall.Signal(req.Signal)
	}
	select {
	case <-p.done:
		return &agentproto.Response{ID: req.ID}
	default:
	}
	if err := p.killGroup(sig); err != nil {
		return errResp(err)
	}
	return &agentproto.Response{ID: req.ID}
}

func (t *procTable) output(req *agentproto.Request) *agentproto.Response {
	p, err := t.lookup(req.ID)
	if err != nil {
		return errResp(err)
	}
	r := &agentproto.Response{ID: req.ID}
	var t1, t2 bool
	r.Stdout, t1 = p.stdout.snapshot()
	r.Stderr, t2 = p.stderr.snapshot()
	r.Truncated = t1 || t2
	return r
}

// reapOrphans runs forever when the agent is PID 1: processes whose parent
// died are re-parented to it, and without a wait they stay zombies. Only
// zombies the agent did not start itself are reaped; its own children are
// left to os/exec.
func (t *procTable) reapOrphans() {
	for {
		time.Sleep(time.Second)
		t.reapOnce()
	}
}

func (t *procTable) reapOnce() {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, st := range stats {
		data, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		// "pid (comm) S ppid ...": comm may hold spaces, so split after ')'.
		s := string(data)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] != "Z" || f[1] != "1" {
			continue
		}
		pid, err := strconv.Atoi(strings.Fields(s)[0])
		if err != nil || t.pids[pid] {
			continue
		}
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	}
}
