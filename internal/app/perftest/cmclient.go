package perftest

import (
	"context"
	"io"
	"net/netip"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
)

// CMSide is one side of perftest's -R (rdma_cm) handshake for a caller
// that drives the data QPs itself (rxego probe): the comm QP, the
// exchange over it and the data QPs' CM connections are this package's,
// exactly as `rxego perf -R` makes them; what runs on the data QPs
// afterwards is the caller's.
type CMSide struct{ s *session }

// DialCM connects the exchange's comm QP on dev to a -R server's rdma_cm
// port at server:port (retrying while nobody listens there, as perftest's
// client does) and returns the client, its exchange ready for Versions.
// cmCfg tunes the connection manager (nil: rdma_cm's values); out gets the
// lines perftest's client prints (nil: none).
func DialCM(ctx context.Context, dev *rxego.Device, server netip.Addr, port int, cmCfg *cm.Config, out io.Writer) (*CMSide, error) {
	return startCMSide(ctx, dev, server, port, cmCfg, out)
}

// ListenCM is DialCM's server side: it listens on dev's rdma_cm port and
// returns once a -R client's comm QP connected.
func ListenCM(ctx context.Context, dev *rxego.Device, port int, cmCfg *cm.Config, out io.Writer) (*CMSide, error) {
	return startCMSide(ctx, dev, netip.Addr{}, port, cmCfg, out)
}

// startCMSide is DialCM (server valid) or ListenCM.
func startCMSide(ctx context.Context, dev *rxego.Device, server netip.Addr, port int, cmCfg *cm.Config, out io.Writer) (*CMSide, error) {
	if out == nil {
		out = io.Discard
	}
	s := &session{cfg: normalised{Config: Config{Port: port, CMConfig: cmCfg, Out: out}, serverAddr: server},
		client: server.IsValid(), ctx: ctx, dev: dev}
	if err := s.startCM(); err != nil {
		s.closeCM()
		return nil, err
	}
	return &CMSide{s: s}, nil
}

// Exchange is the exchange over the comm QP.
func (c *CMSide) Exchange() *Exchange { return c.s.ex }

// PD is the protection domain of the comm QP, for the data QPs.
func (c *CMSide) PD() *rxego.PD { return c.s.pd }

// Connect connects qps (RC, in INIT) to the peer's data QPs, one
// rdma_cm connection each, between the two handshakes of empty records
// that perftest's create_rdma_cm_connection makes, with the attributes
// perftest gives test's QPs (outReads: its -o; mtu: the exchanged path
// MTU). The CM moves the QPs to RTS; their Query says the numbers and
// PSNs it agreed.
func (c *CMSide) Connect(test Test, outReads int, mtu rxego.MTU, qps []*rxego.QP) error {
	c.s.cfg.Test, c.s.cfg.OutReads, c.s.cfg.mtu, c.s.qps = test, outReads, mtu, qps
	return c.s.connectCM()
}

// Close disconnects the data connections and then the comm connection, as
// perftest's client does at the end of a run (a server first gives the
// client cm.DefaultHangUpGrace to do it), and closes the manager.
// Errors of a peer that vanished are returned for the caller to judge.
func (c *CMSide) Close() error { return c.s.closeCM() }
