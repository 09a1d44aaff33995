// Package mckey is rxego's peer for librdmacm's mckey (mckey.c): UD QPs
// joined to an IP multicast group with rdma_cm's multicast join
// (cm.Manager.JoinMulticast), one sending a burst of datagrams to the
// group and the others receiving it.
//
// As mckey does, per connection (-c): a UD QP with Q_Key cm.UDPQKey, Count
// receives of Size+40 bytes posted before the join (receivers), the join,
// a pause (mckey sleeps 3 s "to give SM chance to configure switches"),
// then Count SEND with Immediate datagrams of Size bytes to the group,
// the immediate being the sender QP's number (sender), or Count arrivals
// awaited (receiver); then the group is left.
//
// mckey sends an uninitialised buffer; rxego's sender fills each
// datagram with a pattern derived from its immediate, so that rxego's
// receiver can check what it got came whole from an rxego sender (such
// datagrams count as verified; a C sender's cannot be).
package mckey

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/cmd/rxego/internal/exchange"
	"github.com/rxego/rxego/cmd/rxego/internal/udnode"
)

// Defaults of mckey.
const (
	DefaultConnections = exchange.DefaultConnections
	DefaultCount       = exchange.DefaultCount
	DefaultSize        = exchange.DefaultSize
	DefaultPause       = 3 * time.Second
)

// Config is what a run takes; zero fields take mckey's defaults.
type Config struct {
	// Params holds -c (QPs, each joined), -C (datagrams per connection),
	// -S (datagram size, at most the path MTU) and the progress output.
	exchange.Params
	Group    netip.Addr // -m: the IP multicast group (-M: an IPv6 MGID)
	Source   netip.Addr // -b: the device address to join from; zero: its first GID of the group's family
	Sender   bool       // -s
	SendOnly bool       // -o: a send-only join (senders only)
	// Pause is the wait between the joins and the sends (or the start of
	// receiving); 0 means DefaultPause, a negative value none.
	Pause time.Duration
}

// Check reports whether c is usable (after the defaults), so a command
// can refuse bad arguments before it opens anything.
func (c Config) Check() error {
	_, err := c.withDefaults()
	return err
}

func (c Config) withDefaults() (Config, error) {
	if c.Pause == 0 {
		c.Pause = DefaultPause
	}
	if _, err := cm.MGID(c.Group); err != nil {
		return c, fmt.Errorf("mckey: %w", err)
	}
	if c.SendOnly && !c.Sender {
		return c, errors.New("mckey: a send-only join (-o) receives nothing: it is for senders (-s)")
	}
	var err error
	c.Params, err = c.Params.WithDefaults(exchange.Tool{Name: "mckey", MaxSize: 4096, SizeText: "4096"})
	return c, err
}

// Result counts what a run did over all connections.
type Result struct {
	Connections int // QPs joined
	Sent        int // datagrams sent to the group
	Received    int // datagrams received from it
	Verified    int // received datagrams that carried an rxego sender's pattern
}

// ErrMismatch is returned when a datagram is not what mckey sends.
var ErrMismatch = errors.New("mckey: unexpected datagram")

// pattern is byte i of the datagrams the QP numbered qpn sends.
func pattern(qpn uint32, i int) byte { return byte(qpn) + byte(i*7+1) }

// Run joins cfg.Connections QPs of m's device to the group and sends to
// it or receives from it, as mckey; the groups are left at the end,
// whatever happened.
func Run(ctx context.Context, m *cm.Manager, cfg Config) (res Result, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return res, err
	}
	role := "server"
	if cfg.Sender {
		role = "client"
	}
	fmt.Fprintf(cfg.Out, "mckey: starting %s\n", role)
	if mtu := m.Device().ActiveMTU().Bytes(); cfg.Size > mtu {
		return res, fmt.Errorf("mckey: message_size %d is larger than active mtu %d", cfg.Size, mtu)
	}
	fmt.Fprintln(cfg.Out, "mckey: joining")
	type member struct {
		n  *udnode.Node
		ms *cm.Membership
	}
	var members []member
	defer func() {
		for _, mb := range members {
			if mb.ms != nil {
				if lerr := mb.ms.Leave(); lerr != nil {
					err = errors.Join(err, fmt.Errorf("mckey: failure leaving: %w", lerr))
				}
			}
			mb.n.Close()
		}
	}()
	for range cfg.Connections {
		n, err := udnode.New(m.Device(), "mckey", cfg.Count, cfg.Size)
		if err != nil {
			return res, err
		}
		members = append(members, member{n: n})
		ms, err := m.JoinMulticast(n.PD, n.QP, cfg.Group, &cm.JoinOptions{SendOnly: cfg.SendOnly, Source: cfg.Source})
		if err != nil {
			return res, fmt.Errorf("mckey: failure joining: %w", err)
		}
		members[len(members)-1].ms = ms
		n.AH, n.QPN = ms.AH, ms.QPN
		fmt.Fprintf(cfg.Out, "mckey: joined dgid: %s mlid 0x0 sl 0\n", ms.MGID)
		res.Connections++
	}
	if cfg.Pause > 0 {
		select {
		case <-time.After(cfg.Pause):
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	if cfg.Sender {
		fmt.Fprintln(cfg.Out, "initiating data transfers")
		for _, mb := range members {
			src := mb.n.At(cfg.Count)
			for i := range cfg.Size {
				src[i] = pattern(mb.n.QP.Num(), i)
			}
			if err := mb.n.Send(cfg.Count, cfg.Count, cfg.Size); err != nil {
				return res, err
			}
			// Unlike mckey, wait for the last send to complete: a QP
			// destroyed with sends queued may never put them on the wire.
			if err := mb.n.Poll(ctx, 1, rxego.WCSend, func(rxego.WC) error { return nil }); err != nil {
				return res, err
			}
			res.Sent += cfg.Count
		}
	} else {
		fmt.Fprintln(cfg.Out, "receiving data transfers")
		for _, mb := range members {
			err := mb.n.Poll(ctx, cfg.Count, rxego.WCRecv, func(wc rxego.WC) error {
				if wc.ByteLen != uint32(cfg.Size+rxego.GRHLen) || wc.Flags&rxego.WCWithImm == 0 {
					return fmt.Errorf("%w: %d bytes, flags %#x (want %d with an immediate)", ErrMismatch, wc.ByteLen, wc.Flags, cfg.Size+rxego.GRHLen)
				}
				res.Received++
				data := mb.n.At(int(wc.ID))[rxego.GRHLen:]
				for i, b := range data {
					if b != pattern(wc.Imm, i) {
						return nil // not an rxego sender's: cannot be checked
					}
				}
				res.Verified++
				return nil
			})
			if err != nil {
				return res, err
			}
		}
	}
	fmt.Fprintln(cfg.Out, "data transfers complete")
	return res, nil
}
