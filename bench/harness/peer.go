package harness

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"sync/atomic"
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

// expect reads a signal and checks it is want.
func (c *ctl) expect(want string) error {
	var s signal
	if err := c.recv(&s); err != nil {
		return fmt.Errorf("control: waiting for %q: %w", want, err)
	}
	if s.Sig != want {
		return fmt.Errorf("control: got %q, want %q", s.Sig, want)
	}
	return nil
}

// watch reads signals in the background; the returned flag goes up at
// the first one (or when the connection ends).
func (c *ctl) watch() *atomic.Bool {
	var f atomic.Bool
	go func() {
		var s signal
		_ = c.recv(&s)
		f.Store(true)
	}()
	return &f
}

// peer is one side of a running case.
type peer struct {
	c      Case
	server bool
	ctl    *ctl
}

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
// both sides print "result JSON" at the end.
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
