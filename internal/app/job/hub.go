// Package job runs the examples' small multi-process jobs on loopback: a
// rendezvous hub the ranks meet at over TCP (their out-of-band channel,
// the way ibv_rc_pingpong and perftest swap QP numbers and rkeys before
// the first verb), the ranks' side of it (all-gather, barrier, result),
// starting ranks as goroutines or as processes, and opening an rxego
// device with its QPs and one registered buffer. It uses only the public
// verbs API of package rxego.
package job

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// msg is one line on a rank's hub connection.
type msg struct {
	Op   string          `json:"op"` // "hello", "gather", "done", "fail"
	Rank int             `json:"rank"`
	V    json.RawMessage `json:"v,omitempty"`
	Err  string          `json:"err,omitempty"`
}

// Hub is the rendezvous of one job: every rank connects, and the hub
// relays their exchanges in lockstep (each round, one message from every
// rank) until every rank has sent its result.
type Hub struct {
	ln net.Listener
	n  int
}

// NewHub listens for the n ranks of a job on a free TCP port of
// 127.0.0.1.
func NewHub(n int) (*Hub, error) {
	if n < 1 {
		return nil, fmt.Errorf("job: %d ranks", n)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return &Hub{ln: ln, n: n}, nil
}

// Addr is the address ranks Join.
func (h *Hub) Addr() string { return h.ln.Addr().String() }

// Close stops listening.
func (h *Hub) Close() error { return h.ln.Close() }

// Run accepts the ranks, relays their all-gathers and returns each rank's
// result (indexed by rank), or the first failure a rank reports. ctx
// bounds the whole job.
func (h *Hub) Run(ctx context.Context) ([]json.RawMessage, error) {
	conns := make([]*wire, h.n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.c.Close()
			}
		}
	}()
	stop := context.AfterFunc(ctx, func() {
		h.ln.Close()
		for _, c := range conns {
			if c != nil {
				c.c.SetDeadline(time.Now())
			}
		}
	})
	defer stop()
	for got := 0; got < h.n; got++ {
		c, err := h.ln.Accept()
		if err != nil {
			return nil, fmt.Errorf("job: waiting for ranks (%d of %d came): %w", got, h.n, errors.Join(err, ctx.Err()))
		}
		w := newWire(c)
		var m msg
		if err := w.recv(&m); err != nil || m.Op != "hello" || m.Rank < 0 || m.Rank >= h.n || conns[m.Rank] != nil {
			c.Close()
			return nil, fmt.Errorf("job: bad hello %+v: %v", m, err)
		}
		conns[m.Rank] = w
	}
	for {
		round := make([]json.RawMessage, h.n)
		op := ""
		for r, w := range conns {
			var m msg
			if err := w.recv(&m); err != nil {
				return nil, fmt.Errorf("job: rank %d: %w", r, errors.Join(err, ctx.Err()))
			}
			if m.Op == "fail" {
				return nil, fmt.Errorf("job: rank %d: %s", r, m.Err)
			}
			if op != "" && m.Op != op {
				return nil, fmt.Errorf("job: rank %d sent %q while others sent %q", r, m.Op, op)
			}
			op, round[r] = m.Op, m.V
		}
		if op == "done" {
			return round, nil
		}
		all, _ := json.Marshal(round)
		for r, w := range conns {
			if err := w.send(msg{Op: "gather", V: all}); err != nil {
				return nil, fmt.Errorf("job: rank %d: %w", r, err)
			}
		}
	}
}

// wire is a connection carrying JSON values, one per line.
type wire struct {
	c   net.Conn
	enc *json.Encoder
	dec *json.Decoder
}

func newWire(c net.Conn) *wire {
	return &wire{c: c, enc: json.NewEncoder(c), dec: json.NewDecoder(bufio.NewReader(c))}
}

func (w *wire) send(v any) error { return w.enc.Encode(v) }
func (w *wire) recv(v any) error { return w.dec.Decode(v) }

// Rank is one rank's link to its job's hub.
type Rank struct {
	// ID is this rank's number, Size the job's.
	ID, Size int
	w        *wire
}

// Join connects rank id of a job of size ranks to the hub at addr,
// retrying until ctx ends (the hub may not listen yet).
func Join(ctx context.Context, addr string, id, size int) (*Rank, error) {
	if id < 0 || id >= size {
		return nil, fmt.Errorf("job: rank %d of %d", id, size)
	}
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			r := &Rank{ID: id, Size: size, w: newWire(c)}
			context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
			if err := r.w.send(msg{Op: "hello", Rank: id}); err != nil {
				c.Close()
				return nil, err
			}
			return r, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("job: joining %s: %w", addr, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// AllGather sends mine to every rank and stores every rank's value, in
// rank order, into all (a pointer to a slice). Every rank must call it
// the same number of times: it is also a barrier.
func (r *Rank) AllGather(mine any, all any) error {
	v, err := json.Marshal(mine)
	if err != nil {
		return err
	}
	if err := r.w.send(msg{Op: "gather", Rank: r.ID, V: v}); err != nil {
		return err
	}
	var m msg
	if err := r.w.recv(&m); err != nil {
		return fmt.Errorf("job: rank %d waiting for the others: %w", r.ID, err)
	}
	if all == nil {
		return nil
	}
	return json.Unmarshal(m.V, all)
}

// Barrier returns once every rank has reached it.
func (r *Rank) Barrier() error { return r.AllGather(nil, nil) }

// Finish hands this rank's result (or its failure) to the hub and closes
// the link.
func (r *Rank) Finish(result any, failure error) error {
	defer r.w.c.Close()
	if failure != nil {
		return r.w.send(msg{Op: "fail", Rank: r.ID, Err: failure.Error()})
	}
	v, err := json.Marshal(result)
	if err != nil {
		return r.w.send(msg{Op: "fail", Rank: r.ID, Err: err.Error()})
	}
	return r.w.send(msg{Op: "done", Rank: r.ID, V: v})
}
