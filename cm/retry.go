package cm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/rxego/rxego"
)

// Defaults for DialRetry and HangUp as rxego's tools use them.
const (
	// DefaultDialRetry is the interval between attempts on a server that
	// does not listen yet: perftest's client waits 100 ms.
	DefaultDialRetry = 100 * time.Millisecond
	// DefaultHangUpGrace is how long a server lets the client disconnect
	// first.
	DefaultHangUpGrace = 5 * time.Second
	// DefaultHangUpWait bounds the disconnects themselves: a few CM
	// retransmissions at rdma_cm's 4.3-second response timeout would take
	// longer, but a peer that vanished must not hold an application up.
	DefaultHangUpWait = 10 * time.Second
)

// DialRetry is Dial repeated every interval while the server rejects for
// want of a listener (REJ reason 8, which the Linux CM sends for a port
// nobody listens on), as rdma_cm clients (perftest's among them) retry a
// server that is still starting, until ctx ends. A rejection leaves q in
// ERR; it goes back to RESET before the next attempt, and rearm, if not
// nil, runs then to restore what the ERR state flushed (receives posted
// before dialling).
func (m *Manager) DialRetry(ctx context.Context, raddr netip.AddrPort, q *rxego.QP, p *Params,
	interval time.Duration, rearm func() error) (*Conn, error) {
	if interval <= 0 {
		return nil, fmt.Errorf("%w: retry interval %v", ErrField, interval)
	}
	for {
		conn, err := m.Dial(ctx, raddr, q, p)
		var rej *RejectError
		if !errors.As(err, &rej) || rej.Reason != RejInvalidServiceID {
			return conn, err
		}
		if err := q.Modify(&rxego.QPAttr{State: rxego.StateReset}, rxego.AttrState); err != nil {
			return nil, err
		}
		if rearm != nil {
			if err := rearm(); err != nil {
				return nil, err
			}
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("cm: dial %v: %w (last: %v)", raddr, ctx.Err(), err)
		case <-t.C:
		}
	}
}

// HangUp ends conns at the end of an application's run. With peerFirst
// above 0 it first gives the peer that long to disconnect them itself
// (a server's courtesy to a client that disconnects at its end, as
// perftest's and rping's clients do, so that both sides' DREQs do not
// cross); then it disconnects whatever is left, waiting for the DREPs
// until ctx ends. It returns the errors of those disconnects.
func HangUp(ctx context.Context, conns []*Conn, peerFirst time.Duration) error {
	if peerFirst > 0 {
		t := time.NewTimer(peerFirst)
	wait:
		for _, c := range conns {
			select {
			case <-c.Done():
			case <-t.C:
				break wait
			case <-ctx.Done():
				break wait
			}
		}
		t.Stop()
	}
	var errs []error
	for _, c := range conns {
		if err := c.Disconnect(ctx); err != nil {
			errs = append(errs, fmt.Errorf("cm: disconnect %v: %w", c.RemoteAddr(), err))
		}
	}
	return errors.Join(errs...)
}
