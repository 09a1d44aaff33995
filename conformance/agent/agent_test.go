package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/conformance/agentproto"
)

// startAgent serves the agent on a loopback port for the test's lifetime.
func startAgent(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := newServer()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	return ln.Addr().String()
}

// call sends one request on a new connection and decodes the answer.
func call(t *testing.T, addr string, req agentproto.Request) agentproto.Response {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := json.NewEncoder(c).Encode(req); err != nil {
		t.Fatal(err)
	}
	var resp agentproto.Response
	if err := json.NewDecoder(c).Decode(&resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestPing(t *testing.T) {
	addr := startAgent(t)
	r := call(t, addr, agentproto.Request{Op: agentproto.OpPing})
	want, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	if r.Error != "" || r.Release != strings.TrimSpace(string(want)) {
		t.Fatalf("ping: %+v, want release %q", r, want)
	}
}

func TestRunExitAndOutput(t *testing.T) {
	addr := startAgent(t)
	r := call(t, addr, agentproto.Request{Op: agentproto.OpRun,
		Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	if r.Error != "" || !r.Done || r.ExitCode != 3 || string(r.Stdout) != "out\n" || string(r.Stderr) != "err\n" {
		t.Fatalf("got %+v", r)
	}
}

func TestRunEnvDirStdin(t *testing.T) {
	addr := startAgent(t)
	dir := t.TempDir()
	r := call(t, addr, agentproto.Request{Op: agentproto.OpRun,
		Argv: []string{"sh", "-c", `echo "$FOO $(pwd)"; cat`}, Env: []string{"FOO=bar"},
		Dir: dir, Stdin: []byte("input")})
	want := "bar " + dir + "\ninput"
	if r.Error != "" || r.ExitCode != 0 || string(r.Stdout) != want {
		t.Fatalf("stdout %q, want %q (%+v)", r.Stdout, want, r)
	}
}

func TestRunTimeoutKillsGroup(t *testing.T) {
	addr := startAgent(t)
	// The child sleep is in the command's process group and must die too,
	// or the pipes would stay open and the run would hang past the timeout.
	r := call(t, addr, agentproto.Request{Op: agentproto.OpRun,
		Argv: []string{"sh", "-c", "sleep 30 & sleep 30"}, TimeoutMS: 200})
	if r.Error != "" || !r.TimedOut || r.ExitCode != -1 || r.Signal != "killed" {
		t.Fatalf("got %+v", r)
	}
	if d := time.Duration(r.DurationNS); d >= 30*time.Second {
		t.Fatalf("ran %v despite the timeout", d)
	}
}

func TestRunErrors(t *testing.T) {
	addr := startAgent(t)
	for _, req := range []agentproto.Request{
		{Op: agentproto.OpRun},
		{Op: agentproto.OpRun, Argv: []string{"/nonexistent/binary"}},
		{Op: agentproto.OpStart, Argv: []string{""}},
		{Op: agentproto.OpWait, ID: 999},
		{Op: agentproto.OpKill, ID: 999},
		{Op: agentproto.OpOutput, ID: 999},
		{Op: "bogus"},
		{Op: agentproto.OpRead},
		{Op: agentproto.OpRead, Path: "/nonexistent/file"},
		{Op: agentproto.OpGlob},
		{Op: agentproto.OpGlob, Path: "["},
		{Op: agentproto.OpWrite},
		{Op: agentproto.OpWrite, Path: "/nonexistent/dir/file"},
	} {
		if r := call(t, addr, req); r.Error == "" {
			t.Errorf("%+v: no error (%+v)", req, r)
		}
	}
}

func TestBadRequestClosesConnection(t *testing.T) {
	addr := startAgent(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte("{not json\n"))
	br := bufio.NewReader(c)
	line, err := br.ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	var r agentproto.Response
	if err := json.Unmarshal(line, &r); err != nil || !strings.HasPrefix(r.Error, "bad request") {
		t.Fatalf("answer %q: %v", line, err)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("connection still open after a malformed request")
	}
}

func TestSeveralRequestsOnOneConnection(t *testing.T) {
	addr := startAgent(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	enc, dec := json.NewEncoder(c), json.NewDecoder(c)
	for i, word := range []string{"a", "b", "c"} {
		if err := enc.Encode(agentproto.Request{Op: agentproto.OpRun, Argv: []string{"echo", word}}); err != nil {
			t.Fatal(err)
		}
		var r agentproto.Response
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		if string(r.Stdout) != word+"\n" {
			t.Fatalf("request %d: stdout %q", i, r.Stdout)
		}
	}
}

func TestBackgroundProcess(t *testing.T) {
	addr := startAgent(t)
	r := call(t, addr, agentproto.Request{Op: agentproto.OpStart,
		Argv: []string{"sh", "-c", "echo first; echo e >&2; sleep 30"}})
	if r.Error != "" || r.ID == 0 {
		t.Fatalf("start: %+v", r)
	}
	id := r.ID
	deadline := time.Now().Add(10 * time.Second)
	for {
		o := call(t, addr, agentproto.Request{Op: agentproto.OpOutput, ID: id})
		if o.Error != "" {
			t.Fatal(o.Error)
		}
		if string(o.Stdout) == "first\n" && string(o.Stderr) == "e\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("output never arrived: %+v", o)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if w := call(t, addr, agentproto.Request{Op: agentproto.OpWait, ID: id, TimeoutMS: 50}); w.Error != "" || w.Done {
		t.Fatalf("wait on a running process: %+v", w)
	}
	if k := call(t, addr, agentproto.Request{Op: agentproto.OpKill, ID: id}); k.Error != "" {
		t.Fatal(k.Error)
	}
	w := call(t, addr, agentproto.Request{Op: agentproto.OpWait, ID: id, TimeoutMS: 10000})
	if !w.Done || w.ExitCode != -1 || w.Signal != "killed" || string(w.Stdout) != "first\n" {
		t.Fatalf("wait after kill: %+v", w)
	}
	// A finished process is forgotten once its end was reported.
	if w := call(t, addr, agentproto.Request{Op: agentproto.OpWait, ID: id}); w.Error == "" {
		t.Fatalf("second wait: %+v", w)
	}
}

func TestSignalDefaultsAndCustom(t *testing.T) {
	addr := startAgent(t)
	r := call(t, addr, agentproto.Request{Op: agentproto.OpStart,
		Argv: []string{"sh", "-c", "trap 'echo got-term; exit 7' TERM; while :; do sleep 0.05; done"}})
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	// Give the shell time to install the trap; bounded by the loop below.
	time.Sleep(200 * time.Millisecond)
	if k := call(t, addr, agentproto.Request{Op: agentproto.OpKill, ID: r.ID, Signal: 15}); k.Error != "" {
		t.Fatal(k.Error)
	}
	w := call(t, addr, agentproto.Request{Op: agentproto.OpWait, ID: r.ID, TimeoutMS: 10000})
	if !w.Done || w.ExitCode != 7 || !bytes.Contains(w.Stdout, []byte("got-term")) {
		t.Fatalf("after SIGTERM: %+v", w)
	}
}

func TestFiles(t *testing.T) {
	addr := startAgent(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "x")
	if r := call(t, addr, agentproto.Request{Op: agentproto.OpWrite, Path: p, Data: []byte("12\n"), Mode: 0o600}); r.Error != "" {
		t.Fatal(r.Error)
	}
	if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("stat: %v %v", st, err)
	}
	os.WriteFile(filepath.Join(dir, "y"), []byte("34\n"), 0o644)
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	if r := call(t, addr, agentproto.Request{Op: agentproto.OpRead, Path: p}); string(r.Data) != "12\n" {
		t.Fatalf("read: %+v", r)
	}
	r := call(t, addr, agentproto.Request{Op: agentproto.OpGlob, Path: filepath.Join(dir, "*")})
	if len(r.Files) != 2 || string(r.Files[p]) != "12\n" || string(r.Files[filepath.Join(dir, "y")]) != "34\n" {
		t.Fatalf("glob: %+v", r.Files)
	}
}

func TestCapBufTruncates(t *testing.T) {
	var c capBuf
	big := bytes.Repeat([]byte{'x'}, agentproto.MaxOutput-3)
	if n, err := c.Write(big); n != len(big) || err != nil {
		t.Fatal(n, err)
	}
	if n, err := c.Write([]byte("abcdef")); n != 6 || err != nil {
		t.Fatal(n, err)
	}
	b, trunc := c.snapshot()
	if !trunc || len(b) != agentproto.MaxOutput || string(b[len(b)-3:]) != "abc" {
		t.Fatalf("len %d trunc %v tail %q", len(b), trunc, b[len(b)-3:])
	}
	c.Write([]byte("more"))
	if b, _ := c.snapshot(); len(b) != agentproto.MaxOutput {
		t.Fatalf("grew to %d", len(b))
	}
}
