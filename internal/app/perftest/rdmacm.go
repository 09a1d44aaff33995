package perftest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
)

// perftest's -R (work_rdma_cm, which implies use_rdma_cm) replaces both
// the TCP exchange and the QP set-up by rdma_cm:
//
//  1. The exchange runs over a "comm" RC QP that rdma_cm connects on the
//     test's port (rdma_client_connect / rdma_server_connect): each message
//     is one SEND into the peer's single posted receive of 56 bytes, and
//     key records travel as struct pingpong_dest (rdma_write_keys).
//  2. After the versions, system data and MTU, one key-record handshake,
//     then the data QPs connect, one rdma_cm connection each, to the same
//     port (the server listens again; the client retries while it gets a
//     REJ), then another handshake (create_rdma_cm_connection).
//  3. The test's own handshakes follow as without -R, minus the modify to
//     RTR/RTS: the CM did it. Key records carry rkey and vaddr; their QPN
//     and PSN are ignored.
//  4. At the end the client disconnects the data connections and waits for
//     the DREPs; the server, which perftest never makes disconnect, waits
//     for the client's DREQs; then both drop the comm connection.

// cmState is a run's rdma_cm state.
type cmState struct {
	m     *cm.Manager
	l     *cm.Listener // the server's, on the test's port
	comm  *cm.Conn
	ch    *cmChannel
	conns []*cm.Conn // the data QPs' connections, in QP order
}

// cmChannel carries the exchange over the comm QP (rdma_write_data and
// rdma_read_data).
type cmChannel struct {
	ctx      context.Context
	q        *rxego.QP
	scq, rcq *rxego.CQ
	mr       *rxego.MR
	buf      []byte // [0, binaryRecordLen): receives; the rest: sends
	sends    uint64
	// received counts the payload bytes received, which the engine's
	// RcvdBytes counts too: write_lat tells the peer's WRITEs by that.
	received uint64
}

// newCMChannel creates the comm QP in INIT with its one receive posted,
// as perftest posts it before connecting.
func newCMChannel(ctx context.Context, dev *rxego.Device, pd *rxego.PD) (*cmChannel, error) {
	c := &cmChannel{ctx: ctx, buf: make([]byte, 2*binaryRecordLen)}
	var err error
	if c.mr, err = pd.RegMR(c.buf, rxego.AccessLocalWrite); err != nil {
		return nil, err
	}
	if c.scq, err = dev.CreateCQ(4); err != nil {
		return nil, err
	}
	if c.rcq, err = dev.CreateCQ(4); err != nil {
		return nil, err
	}
	if c.q, err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: c.scq, RecvCQ: c.rcq,
		Caps: rxego.Caps{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return nil, err
	}
	if err := c.q.Init(rxego.AccessLocalWrite); err != nil {
		return nil, err
	}
	return c, c.postRecv()
}

// reset restores the comm QP after a rejected connection attempt left it
// in ERR and then RESET: the flushed receive's completion is dropped, and
// the QP goes to INIT with its receive posted again.
func (c *cmChannel) reset() error {
	var wc [4]rxego.WC
	for _, cq := range []*rxego.CQ{c.rcq, c.scq} {
		for n, _ := cq.Poll(wc[:]); n > 0; n, _ = cq.Poll(wc[:]) {
		}
	}
	if err := c.q.Init(rxego.AccessLocalWrite); err != nil {
		return err
	}
	return c.postRecv()
}

func (c *cmChannel) postRecv() error {
	return c.q.PostRecv(rxego.RecvWR{ID: 1, SGL: []rxego.SGE{{Addr: c.mr.IOVA(), Length: binaryRecordLen, LKey: c.mr.LKey()}}})
}

// wait returns the next completion of cq, which must be a success.
func (c *cmChannel) wait(cq *rxego.CQ, what string) (rxego.WC, error) {
	var wc [1]rxego.WC
	if _, err := cq.PollWait(c.ctx, wc[:]); err != nil {
		return wc[0], fmt.Errorf("perftest: rdma_cm exchange: waiting to %s: %w", what, err)
	}
	if wc[0].Status != rxego.WCSuccess {
		return wc[0], fmt.Errorf("perftest: rdma_cm exchange: %s: completion status %s", what, wc[0].Status)
	}
	return wc[0], nil
}

// write sends msg as one SEND and waits for its completion, as
// rdma_write_data does (the peer has one receive posted at a time).
func (c *cmChannel) write(msg []byte) error {
	if len(msg) > binaryRecordLen {
		return fmt.Errorf("perftest: rdma_cm exchange: a %d-byte message exceeds the peer's %d-byte receive", len(msg), binaryRecordLen)
	}
	copy(c.buf[binaryRecordLen:], msg)
	c.sends++
	err := c.q.PostSend(rxego.SendWR{ID: c.sends, Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: c.mr.IOVA() + binaryRecordLen, Length: uint32(len(msg)), LKey: c.mr.LKey()}}})
	if err != nil {
		return fmt.Errorf("perftest: rdma_cm exchange: %w", err)
	}
	_, err = c.wait(c.scq, "send")
	return err
}

// read receives one message, which must be n bytes long, and posts the
// receive again.
func (c *cmChannel) read(n int) ([]byte, error) {
	wc, err := c.wait(c.rcq, "receive")
	if err != nil {
		return nil, err
	}
	if int(wc.ByteLen) != n {
		return nil, fmt.Errorf("perftest: rdma_cm exchange: received %d bytes, want %d", wc.ByteLen, n)
	}
	c.received += uint64(n)
	out := append([]byte(nil), c.buf[:n]...)
	return out, c.postRecv()
}

// startCM opens the manager and connects the comm QP: a server listens on
// the test's port and accepts one connection, a client dials it (retrying
// while nobody listens). It returns the exchange over that QP.
func (s *session) startCM() error {
	c := &s.cfg
	m, err := cm.New(s.dev, c.CMConfig)
	if err != nil {
		return err
	}
	s.cm = &cmState{m: m}
	if s.pd, err = s.dev.AllocPD(); err != nil {
		return err
	}
	if s.cm.ch, err = newCMChannel(s.ctx, s.dev, s.pd); err != nil {
		return err
	}
	p := &cm.Params{}
	if s.client {
		fmt.Fprintf(c.Out, "rxego: rdma_cm connecting to %v\n", s.cmServer())
		s.cm.comm, err = s.dialRetry(s.cm.ch.q, p, s.cm.ch.reset)
	} else {
		if s.cm.l, err = m.Listen(uint16(c.Port)); err != nil {
			return err
		}
		fmt.Fprintf(c.Out, "%s%v\n", CMListening, netip.AddrPortFrom(s.dev.Addr().Addr(), uint16(c.Port)))
		fmt.Fprintf(c.Out, "\n************************************\n* Waiting for client to connect... *\n************************************\n")
		s.cm.comm, err = s.accept(s.cm.ch.q, p)
	}
	if err != nil {
		return fmt.Errorf("perftest: rdma_cm connection of the exchange: %w", err)
	}
	s.ex = &Exchange{ch: s.cm.ch, client: s.client, binaryKeys: true}
	return nil
}

// CMListening starts the line a -R server prints once it listens on its
// rdma_cm port, for scripts and tests that start the client then.
const CMListening = "rxego: rdma_cm listening on "

// cmServer is the server's rdma_cm address.
func (s *session) cmServer() netip.AddrPort {
	return netip.AddrPortFrom(s.cfg.serverAddr, uint16(s.cfg.Port))
}

// dialRetry connects q to the server, dialling again every cm.DefaultDialRetry
// while nobody listens there (cm.Manager.DialRetry).
func (s *session) dialRetry(q *rxego.QP, p *cm.Params, rearm func() error) (*cm.Conn, error) {
	return s.cm.m.DialRetry(s.ctx, s.cmServer(), q, p, cm.DefaultDialRetry, rearm)
}

// accept answers the listener's next request with q.
func (s *session) accept(q *rxego.QP, p *cm.Params) (*cm.Conn, error) {
	req, err := s.cm.l.Accept(s.ctx)
	if err != nil {
		return nil, err
	}
	return req.Accept(s.ctx, q, p)
}

// connectCM connects the data QPs with rdma_cm between two handshakes
// (create_rdma_cm_connection). perftest's records in these two handshakes
// are still zero; rxego's say the same.
func (s *session) connectCM() error {
	if _, err := s.ex.HandShake(Dest{}); err != nil {
		return err
	}
	c := &s.cfg
	// Responder resources and initiator depth are out_reads for READ and
	// atomic tests, 0 (the CM's 1) for the others; retry and RNR retry
	// perftest's retry_count, 7; the server's QP then gets min_rnr_timer 12.
	p := &cm.Params{MTU: c.mtu, MinRNRTimer: minRNRTimer}
	if v := c.Test.verb(); v == read || v == atomic {
		p.ResponderResources, p.InitiatorDepth = uint8(c.OutReads), uint8(c.OutReads)
	}
	for _, q := range s.qps {
		var conn *cm.Conn
		var err error
		if s.client {
			conn, err = s.dialRetry(q, p, nil)
		} else {
			conn, err = s.accept(q, p)
		}
		if err != nil {
			return fmt.Errorf("perftest: rdma_cm connection of QP %#x: %w", q.Num(), err)
		}
		s.cm.conns = append(s.cm.conns, conn)
	}
	// The CM's MADs and the exchange so far are received payload too:
	// write_lat counts the peer's WRITEs from here, adding the exchange's
	// later messages (see writeLat). The count is taken when no message of
	// the exchange can be in flight: a server's after reading the client's
	// record (the client then waits for the answer), a client's after
	// reading the server's (the server then waits for the client).
	mark := func() error {
		s.rcvdBase = s.dev.Stats().RcvdBytes - s.cm.ch.received
		return nil
	}
	if s.client {
		if _, err := s.ex.HandShake(Dest{}); err != nil {
			return err
		}
		return mark()
	}
	_, err := s.ex.HandShakeHold(Dest{}, mark)
	return err
}

// closeCM tears the connections down after the test: a client disconnects
// its data connections (perftest's client does, and waits for the DREPs);
// a server gives the client cm.DefaultHangUpGrace to do so, as perftest's server
// never disconnects, and disconnects what is left; then the comm
// connection goes the same way. Errors of a peer that vanished do not
// fail a run whose test passed; they are returned for the caller to judge.
func (s *session) closeCM() error {
	st := s.cm
	if st == nil {
		return nil
	}
	if st.l != nil {
		st.l.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), cm.DefaultHangUpWait)
	defer cancel()
	peerFirst := cm.DefaultHangUpGrace
	if s.client {
		peerFirst = 0
	}
	err := cm.HangUp(ctx, st.conns, peerFirst)
	if st.comm != nil {
		err = errors.Join(err, cm.HangUp(ctx, []*cm.Conn{st.comm}, peerFirst))
	}
	st.m.Close()
	s.res.CM = st.m.Counters()
	return err
}
