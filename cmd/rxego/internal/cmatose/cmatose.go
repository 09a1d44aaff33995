// Package cmatose is rxego's peer for librdmacm's ucmatose (cmatose.c):
// several rdma_cm connections at once, each carrying a burst of SENDs.
//
// The protocol, per connection: both sides post Count receives of Size
// bytes before connecting. Once every connection is established the
// server SENDs Count messages on each, waits for their completions, then
// for Count messages back; the client waits for the server's Count
// messages and answers with Count SENDs of its own. The server then
// disconnects every connection and the client answers the DREQs.
//
// ucmatose sends from the same buffer it receives into, so a C client
// echoes the server's data: rxego's server fills its messages with a
// pattern and checks every reply against it. rxego's client echoes what
// it received, likewise.
package cmatose

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cmd/rxego/internal/exchange"
)

// Defaults of ucmatose.
const (
	DefaultPort        = 7471
	DefaultConnections = exchange.DefaultConnections
	DefaultCount       = exchange.DefaultCount
	DefaultSize        = exchange.DefaultSize
)

// Config is what both roles take: Connections (-c), Count (-C: messages
// each way per connection), Size (-S: message size, at most 1 MiB) and
// Out (ucmatose's progress lines; nil discards them). Zero fields take
// ucmatose's defaults.
type Config = exchange.Params

// Tool names ucmatose in its errors and sets its largest message (1 MiB);
// Tool.Check refuses a Config before anything listens or dials.
var Tool = exchange.Tool{Name: "cmatose", MaxSize: 1 << 20, SizeText: "1 MiB"}

// Result counts what a run did over all connections.
type Result = exchange.Result

// ErrMismatch is returned when a reply differs from the server's data.
var ErrMismatch = errors.New("cmatose: reply differs from the data sent")

// node is one connection's resources, as cmatose's struct cmatest_node.
type node struct {
	scq, rcq *rxego.CQ
	q        *rxego.QP
	mr       *rxego.MR
	c        *cm.Conn
}

func newNode(dev *rxego.Device, cfg Config) (*node, error) {
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	n := &node{}
	if n.scq, err = dev.CreateCQ(cfg.Count); err != nil {
		return nil, err
	}
	if n.rcq, err = dev.CreateCQ(cfg.Count); err != nil {
		return nil, err
	}
	if n.q, err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: n.scq, RecvCQ: n.rcq, SigAll: true,
		Caps: rxego.Caps{MaxSendWR: cfg.Count, MaxRecvWR: cfg.Count, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return nil, err
	}
	if n.mr, err = pd.RegMR(make([]byte, cfg.Size), rxego.AccessLocalWrite); err != nil {
		return nil, err
	}
	if err := n.q.Init(0); err != nil {
		return nil, err
	}
	for range cfg.Count {
		if err := n.q.PostRecv(rxego.RecvWR{SGL: []rxego.SGE{n.sge()}}); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (n *node) sge() rxego.SGE {
	return rxego.SGE{Addr: n.mr.IOVA(), Length: uint32(n.mr.Len()), LKey: n.mr.LKey()}
}

func (n *node) postSends(count int) error {
	for range count {
		if err := n.q.PostSend(rxego.SendWR{Opcode: rxego.WRSend, SGL: []rxego.SGE{n.sge()}}); err != nil {
			return err
		}
	}
	return nil
}

// poll waits for count completions on cq; check sees each.
func poll(ctx context.Context, cq *rxego.CQ, count int, check func(rxego.WC) error) error {
	wcs := make([]rxego.WC, 8)
	for done := 0; done < count; {
		k, err := cq.PollWait(ctx, wcs[:min(len(wcs), count-done)])
		if err != nil {
			return err
		}
		for _, wc := range wcs[:k] {
			if wc.Status != rxego.WCSuccess {
				return fmt.Errorf("cmatose: completion %v: %v", wc.Opcode, wc.Status)
			}
			if err := check(wc); err != nil {
				return err
			}
		}
		done += k
	}
	return nil
}

func (n *node) destroy() {
	if n.q != nil {
		n.q.Destroy()
	}
}

func printf(out io.Writer, format string, args ...any) {
	if out != nil {
		fmt.Fprintf(out, format, args...)
	}
}

// pattern is the server's message data: byte i is i*7+1.
func pattern(b []byte) {
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
}

// receive polls n's cfg.Count receives, counting them in res; each must
// be cfg.Size bytes, and then ok, when given, is called.
func (n *node) receive(ctx context.Context, cfg Config, res *Result, ok func()) error {
	return poll(ctx, n.rcq, cfg.Count, func(wc rxego.WC) error {
		res.Received++
		if int(wc.ByteLen) != cfg.Size {
			return fmt.Errorf("%w: %d bytes, want %d", ErrMismatch, wc.ByteLen, cfg.Size)
		}
		if ok != nil {
			ok()
		}
		return nil
	})
}

// side is one role's connections while it runs: the nodes, destroyed
// at the end, and the connections being made concurrently.
type side struct {
	nodes []*node
	wg    sync.WaitGroup
	errs  []error
}

// run checks cfg, prints the role's banner and runs body with room for
// cfg's connections; the nodes body made are freed at the end.
func run(cfg Config, banner string, body func(Config, *side) (Result, error)) (Result, error) {
	cfg, err := cfg.WithDefaults(Tool)
	if err != nil {
		return Result{}, err
	}
	s := &side{nodes: make([]*node, cfg.Connections), errs: make([]error, cfg.Connections)}
	defer s.destroy()
	printf(cfg.Out, "%s", banner)
	return body(cfg, s)
}

// connect makes node i's connection through f, concurrently with the
// others (rdma_cm connects all at once).
func (s *side) connect(i int, f func() (*cm.Conn, error)) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.nodes[i].c, s.errs[i] = f()
	}()
}

// wait waits for the connections under way and joins their errors.
func (s *side) wait() error {
	s.wg.Wait()
	return errors.Join(s.errs...)
}

// destroy waits for connections under way, then frees every node made.
func (s *side) destroy() {
	s.wg.Wait()
	for _, n := range s.nodes {
		if n != nil {
			n.destroy()
		}
	}
}

// Serve accepts cfg.Connections connections on l and runs ucmatose's
// server side on them.
func Serve(ctx context.Context, m *cm.Manager, l *cm.Listener, cfg Config) (Result, error) {
	return run(cfg, "cmatose: starting server\n", func(cfg Config, s *side) (res Result, err error) {
		nodes := s.nodes
		for i := range nodes {
			req, err := l.Accept(ctx)
			if err != nil {
				return res, err
			}
			n, err := newNode(m.Device(), cfg)
			if err != nil {
				req.Reject(nil)
				return res, err
			}
			nodes[i] = n
			s.connect(i, func() (*cm.Conn, error) { return req.Accept(ctx, n.q, nil) })
		}
		if err := s.wait(); err != nil {
			return res, err
		}
		res.Connections = len(nodes)
		want := make([]byte, cfg.Size)
		pattern(want)
		if cfg.Count > 0 {
			printf(cfg.Out, "initiating data transfers\n")
			for _, n := range nodes {
				pattern(n.mr.Buffer())
				if err := n.postSends(cfg.Count); err != nil {
					return res, err
				}
			}
			printf(cfg.Out, "completing sends\n")
			for _, n := range nodes {
				if err := poll(ctx, n.scq, cfg.Count, func(rxego.WC) error { res.Sent++; return nil }); err != nil {
					return res, err
				}
			}
			printf(cfg.Out, "receiving data transfers\n")
			for _, n := range nodes {
				if err := n.receive(ctx, cfg, &res, nil); err != nil {
					return res, err
				}
				// All messages land in the one buffer: it holds the last.
				if string(n.mr.Buffer()) != string(want) {
					return res, fmt.Errorf("%w: connection to %v", ErrMismatch, n.c.RemoteAddr())
				}
				res.Verified += cfg.Count
			}
			printf(cfg.Out, "data transfers complete\n")
		}
		printf(cfg.Out, "cmatose: disconnecting\n")
		for _, n := range nodes {
			if err := n.c.Disconnect(ctx); err != nil {
				return res, err
			}
		}
		printf(cfg.Out, "disconnected\n")
		return res, nil
	})
}

// Dial makes cfg.Connections connections to the ucmatose server at addr
// and runs ucmatose's client side on them.
func Dial(ctx context.Context, m *cm.Manager, addr netip.AddrPort, cfg Config) (Result, error) {
	return run(cfg, "cmatose: starting client\ncmatose: connecting\n", func(cfg Config, s *side) (res Result, err error) {
		nodes := s.nodes
		for i := range nodes {
			if nodes[i], err = newNode(m.Device(), cfg); err != nil {
				return res, err
			}
		}
		for i, n := range nodes {
			s.connect(i, func() (*cm.Conn, error) { return m.Dial(ctx, addr, n.q, nil) })
		}
		if err := s.wait(); err != nil {
			for _, n := range nodes {
				if n.c != nil {
					n.c.Disconnect(ctx)
				}
			}
			return res, err
		}
		res.Connections = len(nodes)
		if cfg.Count > 0 {
			printf(cfg.Out, "receiving data transfers\n")
			for _, n := range nodes {
				if err := n.receive(ctx, cfg, &res, func() { res.Verified++ }); err != nil {
					return res, err
				}
			}
			printf(cfg.Out, "sending replies\n")
			for _, n := range nodes {
				if err := n.postSends(cfg.Count); err != nil {
					return res, err
				}
			}
			for _, n := range nodes {
				if err := poll(ctx, n.scq, cfg.Count, func(rxego.WC) error { res.Sent++; return nil }); err != nil {
					return res, err
				}
			}
			printf(cfg.Out, "data transfers complete\n")
		}
		// The server disconnects; the manager answers its DREQs.
		for _, n := range nodes {
			select {
			case <-n.c.Done():
			case <-ctx.Done():
				return res, fmt.Errorf("cmatose: waiting for the server to disconnect: %w", ctx.Err())
			}
		}
		return res, nil
	})
}
