// Package udaddy is rxego's peer for librdmacm's udaddy (udaddy.c): UD QPs
// "connected" through rdma_cm's UDP port space (SIDR, see package cm),
// each carrying a burst of datagrams each way.
//
// The protocol, per connection: both sides post Count receives of
// Size+40 bytes (the GRH first) before resolving. The client sends Count
// SEND with Immediate messages of Size bytes, the immediate being its own
// QPN, to the QPN and Q_Key the SIDR reply named, then waits for Count
// replies. The server waits for Count messages, addresses its replies to
// the first one's source and immediate (ibv_create_ah_from_wc), and
// sends Count back.
//
// udaddy sends from the buffer it receives into, so a server's replies
// hold the GRH it received and then the client's message: rxego's client
// sends a pattern and checks that each reply carries it after those 40
// bytes. The server cannot check a C client's data (udaddy sends an
// uninitialised buffer); it checks sizes and that every message names
// the same QPN.
package udaddy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cmd/rxego/internal/exchange"
	"github.com/rxego/rxego/cmd/rxego/internal/udnode"
)

// Defaults of udaddy.
const (
	DefaultPort        = 7174
	DefaultConnections = exchange.DefaultConnections
	DefaultCount       = exchange.DefaultCount
	DefaultSize        = exchange.DefaultSize
)

// Config is what both roles take: Connections (-c), Count (-C: messages
// each way per connection), Size (-S: message size, at most 4096 and the
// path MTU) and Out (udaddy's progress lines; nil discards them). Zero
// fields take udaddy's defaults.
type Config = exchange.Params

// Tool names udaddy in its errors and sets its largest message (4096);
// Tool.Check refuses a Config before anything listens or dials.
var Tool = exchange.Tool{Name: "udaddy", MaxSize: 4096, SizeText: "4096"}

// Result counts what a run did over all connections.
type Result = exchange.Result

// ErrMismatch is returned when a reply or message is not what udaddy sends.
var ErrMismatch = errors.New("udaddy: unexpected datagram")

// pattern is what rxego's client sends: byte i of a message.
func pattern(i int) byte { return byte(i*7 + 1) }

// Serve answers cfg.Connections SIDR requests on l, as udaddy's server:
// it receives Count messages on each, then replies with Count.
func Serve(ctx context.Context, m *cm.Manager, l *cm.UDListener, cfg Config) (Result, error) {
	cfg, err := cfg.WithDefaults(Tool)
	if err != nil {
		return Result{}, err
	}
	fmt.Fprintln(cfg.Out, "udaddy: starting server")
	var res Result
	nodes := make([]*udnode.Node, 0, cfg.Connections)
	for len(nodes) < cfg.Connections {
		r, err := l.Accept(ctx)
		if err != nil {
			return res, err
		}
		n, err := udnode.New(m.Device(), "udaddy", cfg.Count, cfg.Size)
		if err != nil {
			r.Reject()
			return res, err
		}
		if err := r.Accept(n.QP, nil); err != nil {
			return res, err
		}
		nodes = append(nodes, n)
		res.Connections++
	}
	fmt.Fprintln(cfg.Out, "receiving data transfers")
	for _, n := range nodes {
		err := n.Poll(ctx, cfg.Count, rxego.WCRecv, func(wc rxego.WC) error {
			if wc.ByteLen != uint32(cfg.Size+rxego.GRHLen) || wc.Flags&rxego.WCWithImm == 0 || (n.AH != nil && wc.Imm != n.QPN) {
				return fmt.Errorf("%w: %d bytes, immediate %#x (flags %#x)", ErrMismatch, wc.ByteLen, wc.Imm, wc.Flags)
			}
			if n.AH == nil { // create_reply_ah
				n.AH = &rxego.AH{Dest: netip.AddrPortFrom(wc.Src.Addr(), rxego.DefaultPort)}
				n.QPN = wc.Imm
			}
			res.Received++
			return nil
		})
		if err != nil {
			return res, err
		}
	}
	fmt.Fprintln(cfg.Out, "sending replies")
	for _, n := range nodes {
		// From the first message's slot: what udaddy's single buffer
		// holds, the GRH and then the client's data.
		if err := n.Send(0, cfg.Count, cfg.Size); err != nil {
			return res, err
		}
		if err := n.Poll(ctx, 1, rxego.WCSend, func(rxego.WC) error { return nil }); err != nil {
			return res, err
		}
		res.Sent += cfg.Count
	}
	fmt.Fprintln(cfg.Out, "data transfers complete")
	return res, nil
}

// Dial resolves cfg.Connections UD "connections" to raddr, as udaddy's
// client, sends Count messages on each and waits for Count replies,
// checking each carries its message back after the server's GRH.
func Dial(ctx context.Context, m *cm.Manager, raddr netip.AddrPort, cfg Config) (Result, error) {
	cfg, err := cfg.WithDefaults(Tool)
	if err != nil {
		return Result{}, err
	}
	fmt.Fprintln(cfg.Out, "udaddy: starting client")
	fmt.Fprintln(cfg.Out, "udaddy: connecting")
	var res Result
	nodes := make([]*udnode.Node, 0, cfg.Connections)
	for range cfg.Connections {
		n, err := udnode.New(m.Device(), "udaddy", cfg.Count, cfg.Size)
		if err != nil {
			return res, err
		}
		peer, err := m.DialUD(ctx, raddr, nil)
		if err != nil {
			return res, err
		}
		if peer.QKey != cm.UDPQKey {
			return res, fmt.Errorf("%w: SIDR reply Q_Key %#x", ErrMismatch, peer.QKey)
		}
		n.AH, n.QPN = &rxego.AH{Dest: peer.Addr}, peer.QPN
		src := n.At(cfg.Count)
		for i := range cfg.Size {
			src[i] = pattern(i)
		}
		nodes = append(nodes, n)
		res.Connections++
	}
	fmt.Fprintln(cfg.Out, "initiating data transfers")
	for _, n := range nodes {
		if err := n.Send(cfg.Count, cfg.Count, cfg.Size); err != nil {
			return res, err
		}
		res.Sent += cfg.Count
	}
	fmt.Fprintln(cfg.Out, "receiving data transfers")
	want := make([]byte, max(cfg.Size-rxego.GRHLen, 0))
	for i := range want {
		want[i] = pattern(i)
	}
	for _, n := range nodes {
		err := n.Poll(ctx, cfg.Count, rxego.WCRecv, func(wc rxego.WC) error {
			if wc.ByteLen != uint32(cfg.Size+rxego.GRHLen) {
				return fmt.Errorf("%w: reply of %d bytes", ErrMismatch, wc.ByteLen)
			}
			res.Received++
			// The reply is the server's buffer: the GRH it received, then
			// our message; it landed after our own GRH.
			if !bytes.Equal(n.At(int(wc.ID))[2*rxego.GRHLen:rxego.GRHLen+cfg.Size], want) {
				return fmt.Errorf("%w: reply does not carry our message", ErrMismatch)
			}
			res.Verified++
			return nil
		})
		if err != nil {
			return res, err
		}
	}
	fmt.Fprintln(cfg.Out, "data transfers complete")
	return res, nil
}
