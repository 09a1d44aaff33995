// Command agent runs inside an rxego lab guest (a QEMU VM booted by package
// conformance/lab) and executes commands for the host: foreground runs that
// return exit status and output, and background processes the host can
// wait for, kill and read output from. It speaks the JSON-lines protocol of
// package agentproto over TCP.
//
// The guest's init execs it as PID 1 inside the chroot of the host's root
// filesystem, so it also reaps orphaned processes. It is built statically
// (CGO_ENABLED=0) by the lab before a guest boots.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strings"

	"github.com/rxego/rxego/conformance/agentproto"
)

func main() {
	listen := flag.String("listen", fmt.Sprintf(":%d", agentproto.DefaultPort), "TCP address to listen on")
	flag.Parse()
	log.SetPrefix("rxego-agent: ")
	log.SetFlags(log.Lmicroseconds)

	if os.Getenv("PATH") == "" {
		os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	s := newServer()
	if os.Getpid() == 1 {
		go s.procs.reapOrphans()
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on %s", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Printf("accept: %v", err)
			continue
		}
		go s.serve(c)
	}
}

// server answers requests; it holds the table of background processes.
type server struct {
	procs *procTable
}

func newServer() *server {
	return &server{procs: newProcTable()}
}

// serve answers requests on c in order until the peer closes it.
func (s *server) serve(c net.Conn) {
	defer c.Close()
	dec := json.NewDecoder(bufio.NewReaderSize(c, 64<<10))
	w := bufio.NewWriterSize(c, 64<<10)
	enc := json.NewEncoder(w)
	for {
		var req agentproto.Request
		if err := dec.Decode(&req); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				// A malformed request ends the connection: the stream
				// cannot be resynchronised.
				enc.Encode(agentproto.Response{Error: "bad request: " + err.Error()})
				w.Flush()
			}
			return
		}
		resp := s.handle(&req)
		if err := enc.Encode(resp); err != nil {
			return
		}
		if err := w.Flush(); err != nil {
			return
		}
	}
}

// handle dispatches one request.
func (s *server) handle(req *agentproto.Request) *agentproto.Response {
	switch req.Op {
	case agentproto.OpPing:
		return ping()
	case agentproto.OpRun:
		return s.procs.run(req)
	case agentproto.OpStart:
		return s.procs.start(req)
	case agentproto.OpWait:
		return s.procs.wait(req)
	case agentproto.OpKill:
		return s.procs.kill(req)
	case agentproto.OpOutput:
		return s.procs.output(req)
	case agentproto.OpRead:
		return readFile(req.Path)
	case agentproto.OpGlob:
		return globFiles(req.Path)
	case agentproto.OpWrite:
		return writeFile(req.Path, req.Data, req.Mode)
	}
	return errResp(fmt.Errorf("unknown op %q", req.Op))
}

func errResp(err error) *agentproto.Response {
	return &agentproto.Response{Error: err.Error()}
}

func ping() *agentproto.Response {
	rel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	host, _ := os.Hostname()
	return &agentproto.Response{Release: strings.TrimSpace(string(rel)), Hostname: host}
}
