package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/app/perftest"
	"github.com/rxego/rxego/transport"
)

// perftest's -R (rdma_cm) handshake runs on a real rxego device that
// shares the probe's port 4791 (devConn): the CM's MADs and the exchange's
// SENDs over the comm QP are rxego's own, exactly as `rxego perf -R` makes
// them (perftest.CMClient). The data QPs are rxego QPs the CM connects
// and moves to RTS; the probe then claims their numbers, so that the
// peer's packets to them reach the scenarios, and sends on them with the
// PSNs the CM agreed. The device itself never sends on a data QP: nothing
// is posted to it.

// cmSide is a run's rdma_cm side: the device on the probe's port and its
// CM client.
type cmSide struct {
	dev *rxego.Device
	cl  *perftest.CMSide
	cq  *rxego.CQ
	qps []*rxego.QP
	// stop ends the exchange's waits (ib_send_bw's server, which may
	// never answer the end of the run).
	stop context.CancelFunc
}

// toolTests are the perftest tests whose -R servers the probe rides.
var toolTests = map[string]perftest.Test{"write_bw": perftest.WriteBW, "read_bw": perftest.ReadBW,
	"atomic_bw": perftest.AtomicBW, "send_bw": perftest.SendBW}

// routeSource is the address the kernel sends to peer from, found
// without sending anything (connecting a UDP socket only routes).
func routeSource(peer netip.Addr) (netip.Addr, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer, transport.Port)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("probe: no route to %v: %w", peer, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

// openCM opens the device on the wire's address and connects the
// exchange's comm QP: to the peer's -R server at port (listen false), or
// from the peer's -R client, listening on port.
// listening, when set, is called once the CM listens (listen true).
func openCM(ctx context.Context, w *wire, port int, listen bool, listening func()) (*cmSide, error) {
	if !w.local.Addr().Is4() {
		return nil, errors.New("probe: -R runs over IPv4 only, as rxego's rdma_cm")
	}
	dev, err := rxego.Open(w.local.String(), &rxego.Options{Conn: w.attachDevice(), Shards: 1})
	if err != nil {
		return nil, fmt.Errorf("probe: the rdma_cm device on %v: %w", w.local, err)
	}
	c := &cmSide{dev: dev}
	ctx, c.stop = context.WithCancel(ctx)
	if listen {
		c.cl, err = perftest.ListenCM(ctx, dev, port, nil, listenWatch(listening))
	} else {
		c.cl, err = perftest.DialCM(ctx, dev, w.peer.Addr(), port, nil, nil)
	}
	if err != nil {
		c.stop()
		dev.Close()
		return nil, fmt.Errorf("probe: rdma_cm connection of the exchange with %v, port %d: %w", w.peer.Addr(), port, err)
	}
	return c, nil
}

// connect creates n data QPs, has the CM connect them to the peer's
// (with the attributes perftest gives test's QPs), claims them for the
// scenarios and returns the probe's and the peer's records of them, to
// which the key-record handshakes add the peer's rkey and address.
func (c *cmSide) connect(w *wire, test perftest.Test, n int, mtu int) (my, rem []perftest.Dest, err error) {
	code, err := mtuCodeOf(mtu)
	if err != nil {
		return nil, nil, err
	}
	if c.cq, err = c.dev.CreateCQ(16); err != nil {
		return nil, nil, err
	}
	for range n {
		q, err := c.cl.PD().CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: c.cq, RecvCQ: c.cq,
			Caps: rxego.Caps{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			return nil, nil, err
		}
		if err := q.Init(rxego.AccessLocalWrite); err != nil {
			return nil, nil, err
		}
		c.qps = append(c.qps, q)
	}
	if err := c.cl.Connect(test, 16, rxego.MTU(code), c.qps); err != nil {
		return nil, nil, err
	}
	gid := w.local.Addr().As16()
	for _, q := range c.qps {
		w.claim(q.Num())
		a := q.Query()
		// -R's key records carry only rkey and address; the CM agreed
		// the numbers and PSNs (the QP sends from SQPSN, the peer from
		// RQPSN).
		my = append(my, perftest.Dest{OutReads: uint16(a.MaxDestRdAtomic), QPN: q.Num(), PSN: a.SQPSN, GID: gid})
		rem = append(rem, perftest.Dest{OutReads: uint16(a.MaxRdAtomic), QPN: a.DestQPN, PSN: a.RQPSN,
			GID: a.Dest.Addr().As16()})
	}
	return my, rem, nil
}

// close hangs the CM connections up as perftest's client does and closes
// the device.
func (c *cmSide) close() error {
	err := c.cl.Close()
	c.stop()
	c.dev.Close()
	return err
}

// listenWatch is the output of perftest's -R server side: it calls
// listening once perftest says it listens (perftest.CMListening), which
// is when a client may connect; the rest is not shown.
func listenWatch(listening func()) io.Writer {
	var once sync.Once
	return writerFunc(func(p []byte) (int, error) {
		if listening != nil && bytes.Contains(p, []byte(perftest.CMListening)) {
			once.Do(listening)
		}
		return len(p), nil
	})
}

// writerFunc is an io.Writer made of a function.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
