package perftest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/rxego/rxego"
)

// Result is what a run measured and checked.
type Result struct {
	// BW holds one report per size of a BW test: rxego's own measurement
	// (a client, or a SEND server) or the client's (a write, read or
	// atomic server, which only waits).
	BW []Report
	// Lat holds one line per size of a latency test.
	Lat []LatStats
	// Checked counts the self-checks rxego made on data the peer wrote,
	// sent, returned or changed; Mismatches those that failed (the run
	// then also returns an error).
	Checked, Mismatches int
	// What describes what the checks covered, for the printed verify line.
	What string
	// Local and Remote are the key records of QP 0 of each side.
	Local, Remote Dest
	// Mem is rxego's registered buffer after the run and MemAddr its
	// address as the peer sees it, so a test running two rxego peers can
	// evaluate one side's PeerChecks against the other side's memory.
	Mem     []byte
	MemAddr uint64
	// CM holds the connection manager's counters of a -R run (cm_sent_req,
	// ...), taken when it closed.
	CM map[string]uint64
	// Device is the device the run used, for its counters. Run closes a
	// device it opened itself unless Config.KeepDevice.
	Device *rxego.Device
}

// PeerCheck is a range of the peer's memory whose content rxego knows at
// the final synchronisation point: bytes rxego wrote or sent there, or
// bytes the peer read or fetched from rxego, or the peer's own bytes that
// rxego received. Addr is a virtual address in the peer process.
type PeerCheck struct {
	Addr uint64
	Data []byte
	What string
}

// session is one run's state.
type session struct {
	cfg    normalised
	client bool
	ex     *Exchange
	lay    layout
	dev    *rxego.Device
	pd     *rxego.PD
	mr     *rxego.MR
	buf    []byte
	scq    *rxego.CQ // send completions
	rcq    *rxego.CQ // receive completions (SEND tests)
	qps    []*rxego.QP
	my     []Dest
	rem    []Dest
	res    Result
	// fill is the pattern rxego's buffer started with, to tell bytes the
	// peer changed from bytes it left alone.
	fill []byte
	// rcvdBase is the engine's received payload count before the QPs
	// were connected: write_lat counts the peer's writes from it.
	rcvdBase uint64
	out      *printer
	ctx      context.Context
	// cm is the rdma_cm state of a -R run.
	cm *cmState
}

// Run performs one perftest exchange and test as server (cfg.Server
// empty) or client, prints perftest's report to cfg.Out and checks what
// it can of the data (see the package documentation).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	n, err := normalise(cfg)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(n.Timeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	s := &session{cfg: n, client: n.Server != "", ctx: ctx, out: &printer{w: n.Out, gbits: n.ReportGbits}}
	if n.noPeak {
		fmt.Fprint(n.Out, noPeakWarning)
	}
	if n.RDMACM {
		err = s.openDevice(n.Local)
		if err == nil {
			err = s.startCM()
		}
		if err == nil {
			err = s.run()
		}
		if cerr := s.closeCM(); err == nil && cerr != nil {
			fmt.Fprintf(n.Out, "rxego: rdma_cm teardown: %v\n", cerr)
		}
	} else {
		var conn net.Conn
		if conn, err = s.connectTCP(ctx); err != nil {
			return nil, err
		}
		defer conn.Close()
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		defer stop()
		s.ex = NewExchange(conn, s.client, deadline)
		if err = s.openDevice(localOf(conn)); err == nil {
			err = s.run()
		}
	}
	if s.dev != nil {
		if err == nil {
			s.quiesce()
		}
		s.res.Device = s.dev
		if n.Device == nil && !n.KeepDevice {
			s.dev.Close()
		}
	}
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("%w (the %v timeout ran out)", err, n.Timeout)
	} else if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (%v)", err, ctx.Err())
	}
	return &s.res, err
}

// maxBuffer bounds the registered buffer, whose size the peer's page size
// helps decide.
const maxBuffer = 1 << 30

// Bounds of quiesce: the device must be silent for quietFor, and quiesce
// gives up after quietMax.
const (
	quietFor = 20 * time.Millisecond
	quietMax = time.Second
)

// quiesce waits until the device has neither sent nor received a packet
// for quietFor (at most quietMax), so that what the run still owes the
// peer leaves before the device closes: above all the ACK of the peer's
// last write_lat WRITE, which perftest follows with no exchange at all
// (rxe ACKs from the kernel even after the process ends; rxego's device
// ends with the run).
func (s *session) quiesce() {
	moved := func() uint64 {
		st := s.dev.Transport().Stats()
		return st.SentPackets + st.RecvPackets
	}
	last := moved()
	for end := time.Now().Add(quietMax); time.Now().Before(end); {
		time.Sleep(quietFor)
		now := moved()
		if now == last {
			return
		}
		last = now
	}
}

// connectTCP dials the server or accepts one client. The client tries
// once, as perftest's ethernet_client_connect does: a server that does
// not listen is "couldn't connect" at once, not a wait.
func (s *session) connectTCP(ctx context.Context) (net.Conn, error) {
	c := s.cfg
	if s.client {
		addr := net.JoinHostPort(c.Server, strconv.Itoa(c.Port))
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("perftest: couldn't connect to %s: %w", addr, err)
		}
		return conn, nil
	}
	ln := c.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", ":"+strconv.Itoa(c.Port)); err != nil {
			return nil, fmt.Errorf("perftest: couldn't listen to port %d: %w", c.Port, err)
		}
		defer ln.Close()
	}
	fmt.Fprintf(s.cfg.Out, "\n************************************\n* Waiting for client to connect... *\n************************************\n")
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	conn, err := ln.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("perftest: no client connected on port %d within the %v timeout", c.Port, c.Timeout)
		}
		return nil, err
	}
	return conn, nil
}

// run does everything after the exchange's connection is up.
func (s *session) run() error {
	c := &s.cfg
	if err := s.ex.Versions(); err != nil {
		return err
	}
	cycle, cacheLine, err := s.ex.SysData(os.Getpagesize(), defCacheLine)
	if err != nil {
		return err
	}
	code, err := s.ex.MTU(int(c.mtu))
	if err != nil {
		return err
	}
	c.mtu = rxego.MTU(code)
	s.lay = layout{ctxSize: c.bufSizeFor(), cycle: cycle, cacheLine: cacheLine, numQPs: c.NumQPs}
	if s.lay.total() > maxBuffer {
		return fmt.Errorf("perftest: a %d-byte buffer (page size %d, %d QPs, size %d) exceeds %d bytes",
			s.lay.total(), cycle, c.NumQPs, s.lay.ctxSize, maxBuffer)
	}
	if err := s.setup(); err != nil {
		return err
	}
	if s.cm != nil {
		if err := s.connectCM(); err != nil {
			return err
		}
		if err := s.setQPTimeout(); err != nil {
			return err
		}
	}
	s.printHeader()
	if err := s.connect(); err != nil {
		return err
	}
	switch {
	case c.Test == SendBW:
		err = s.sendBW()
	case c.Test == SendLat:
		err = s.sendLat()
	case c.Test == WriteLat:
		err = s.writeLat()
	case c.Test.Lat():
		err = s.readAtomicLat()
	default:
		err = s.rdmaBW()
	}
	if err != nil {
		return err
	}
	s.res.Mem, s.res.MemAddr = s.buf, s.mr.IOVA()
	if s.res.Checked > 0 || s.res.Mismatches > 0 {
		fmt.Fprintf(c.Out, "verify: %d of %d checks passed (%s)\n", s.res.Checked-s.res.Mismatches, s.res.Checked, s.res.What)
	}
	if s.res.Mismatches > 0 {
		return fmt.Errorf("perftest: %d of %d data checks failed (%s)", s.res.Mismatches, s.res.Checked, s.res.What)
	}
	return nil
}

// localOf returns the local address of the exchange's TCP connection: by
// default rxego's RoCE address, as rxe's IPv4 GID would be.
func localOf(conn net.Conn) netip.Addr {
	ap, err := netip.ParseAddrPort(conn.LocalAddr().String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap().WithZone("")
}

// openDevice uses the configured device or opens one on Config.Local, or
// else on local.
func (s *session) openDevice(local netip.Addr) error {
	c := &s.cfg
	if s.dev = c.Device; s.dev == nil {
		if c.Local.IsValid() {
			local = c.Local
		}
		if !local.IsValid() {
			return errors.New("perftest: no local address for the device")
		}
		var err error
		if s.dev, err = rxego.Open(netip.AddrPortFrom(local, rxego.DefaultPort).String(), c.DeviceOptions); err != nil {
			return err
		}
	}
	if _, err := s.dev.QueryGID(c.GIDIndex); err != nil {
		return fmt.Errorf("perftest: %w", err)
	}
	s.clampMTU()
	return nil
}

// gid is the GID the QPs send from: Config.GIDIndex's (checked in
// openDevice).
func (s *session) gid() [16]byte {
	g, _ := s.dev.QueryGID(s.cfg.GIDIndex)
	return g
}

// clampMTU lowers -m to the port's active MTU, as perftest's set_mtu does
// (a 1500-byte link carries 1024), so a pasted "-m 4096" still runs.
func (s *session) clampMTU() {
	c := &s.cfg
	if active := s.dev.ActiveMTU(); c.mtu > active {
		fmt.Fprintf(c.Out, "Requested mtu is higher than active mtu \nChanging to active mtu - %d\n", active.Bytes())
		c.mtu = active
	}
}

// setup creates the buffer, MR, CQ and QPs in INIT, and this side's key
// records.
func (s *session) setup() error {
	c := &s.cfg
	s.rcvdBase = s.dev.Stats().RcvdBytes
	var err error
	if s.pd == nil {
		if s.pd, err = s.dev.AllocPD(); err != nil {
			return err
		}
	}
	s.buf = make([]byte, s.lay.total())
	s.fill = make([]byte, len(s.buf))
	if c.Test != WriteLat { // write_lat polls on bytes that must start at 0
		pattern(s.fill, c.Seed)
	}
	copy(s.buf, s.fill)
	access := rxego.AccessLocalWrite | rxego.AccessRemoteWrite | rxego.AccessRemoteRead | rxego.AccessRemoteAtomic
	if s.mr, err = s.pd.RegMR(s.buf, access); err != nil {
		return err
	}
	recv := 0
	if c.Test.verb() == send {
		recv = c.RxDepth
	}
	if s.scq, err = s.dev.CreateCQ(c.NumQPs*c.TxDepth + 16); err != nil {
		return err
	}
	if s.rcq, err = s.dev.CreateCQ(c.NumQPs*recv + 16); err != nil {
		return err
	}
	psn := rand.Uint32() & 0xffffff
	for i := 0; i < c.NumQPs; i++ {
		q, err := s.pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: s.scq, RecvCQ: s.rcq,
			Caps: rxego.Caps{MaxSendWR: c.TxDepth, MaxRecvWR: max(recv, 1), MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			return err
		}
		if err := q.Init(access); err != nil {
			return err
		}
		s.qps = append(s.qps, q)
		s.my = append(s.my, Dest{OutReads: uint16(c.OutReads), QPN: q.Num(), PSN: (psn + uint32(i)*0x1111) & 0xffffff,
			RKey: s.mr.RKey(), VAddr: s.mr.IOVA() + uint64(s.lay.vaddr(i)), GID: s.gid()})
	}
	s.res.Local = s.my[0]
	return nil
}

// connect runs the handshakes before the test, in each test's order, and
// moves the QPs to RTS between them as perftest does.
func (s *session) connect() error {
	c := &s.cfg
	n := c.NumQPs
	shakeAll := func() error {
		for i := 0; i < n; i++ {
			r, err := s.ex.HandShake(s.my[i])
			if err != nil {
				return err
			}
			s.rem[i] = r
		}
		return nil
	}
	shakeOne := func() error {
		_, err := s.ex.HandShake(s.my[0])
		return err
	}
	// With -R the CM has moved the QPs to RTS already.
	modify := s.modify
	if s.cm != nil {
		modify = func() error { return nil }
	}
	s.rem = make([]Dest, n)
	var steps []func() error
	switch c.Test {
	case WriteBW, ReadBW, AtomicBW:
		steps = []func() error{shakeAll, modify, s.printDests, shakeAll, shakeOne}
	case SendBW, SendLat:
		steps = []func() error{shakeAll, modify, shakeOne, s.printDests, shakeAll}
	default: // write, read and atomic latency
		steps = []func() error{shakeOne, shakeAll, modify, s.printDests, shakeAll, shakeOne}
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	s.printRemote()
	s.res.Remote = s.rem[0]
	return nil
}

// modify moves every QP to RTR and RTS towards the peer's records, with
// perftest's attributes: max_dest_rd_atomic from this side's out_reads,
// max_rd_atomic from the peer's, timeout 14, retry 7, RNR retry 7,
// min_rnr_timer 12.
func (s *session) modify() error {
	for i, r := range s.rem {
		mine := netip.AddrFrom16(s.my[i].GID).Is4In6()
		if mine != netip.AddrFrom16(r.GID).Is4In6() {
			return errors.New("perftest: found incompatibility issue with GID types (one side IPv4, the other IPv6); use the same IP version on both")
		}
		if r.QPN == 0 || r.QPN > 0xffffff {
			return fmt.Errorf("perftest: peer QP number %#x", r.QPN)
		}
		rtr := rxego.QPAttr{State: rxego.StateRTR, PathMTU: s.cfg.mtu, DestQPN: r.QPN, RQPSN: r.PSN,
			Dest: netip.AddrPortFrom(r.Addr(), rxego.DefaultPort), HopLimit: 0xff,
			MaxDestRdAtomic: uint8(s.my[i].OutReads), MinRNRTimer: minRNRTimer}
		if err := s.qps[i].SetSourceGID(rxego.RemoteQP{Addr: rtr.Dest, QPN: r.QPN, SGIDIndex: s.cfg.GIDIndex}); err != nil {
			return fmt.Errorf("perftest: %w", err)
		}
		if err := s.qps[i].Modify(&rtr, rxego.AttrState|rxego.AttrAV|rxego.AttrPathMTU|rxego.AttrDestQPN|rxego.AttrRQPSN|
			rxego.AttrMaxDestRdAtomic|rxego.AttrMinRNRTimer); err != nil {
			return fmt.Errorf("perftest: QP %d to RTR: %w", s.qps[i].Num(), err)
		}
		out := r.OutReads
		if out == 0 || out > rxego.MaxRdAtomicLimit {
			out = min(max(out, 1), rxego.MaxRdAtomicLimit)
		}
		timeout := uint8(defQPTimeout)
		if s.cfg.QPTimeout != nil {
			timeout = *s.cfg.QPTimeout
		}
		rts := rxego.QPAttr{State: rxego.StateRTS, SQPSN: s.my[i].PSN, Timeout: timeout, RetryCnt: 7, RNRRetry: 7,
			MaxRdAtomic: uint8(out)}
		if err := s.qps[i].Modify(&rts, rxego.AttrState|rxego.AttrSQPSN|rxego.AttrTimeout|rxego.AttrRetryCnt|
			rxego.AttrRNRRetry|rxego.AttrMaxQPRdAtomic); err != nil {
			return fmt.Errorf("perftest: QP %d to RTS: %w", s.qps[i].Num(), err)
		}
	}
	return nil
}

// setQPTimeout applies -u to the QPs the CM connected, RTS to RTS (the CM
// sets its own ACK timeout when it moves them).
func (s *session) setQPTimeout() error {
	if s.cfg.QPTimeout == nil {
		return nil
	}
	for _, q := range s.qps {
		if err := q.Modify(&rxego.QPAttr{State: rxego.StateRTS, Timeout: *s.cfg.QPTimeout}, rxego.AttrState|rxego.AttrTimeout); err != nil {
			return fmt.Errorf("perftest: -u %d: %w", *s.cfg.QPTimeout, err)
		}
	}
	return nil
}

// poll waits for at least one completion on cq. It blocks rather than
// spins (after the device's busy-poll spin, if it has one): rxego's engine
// runs on goroutines of this process, and a poller burning the CPU it
// needs delays the very packets it waits for, enough on a loaded host to
// time out a peer's responses.
func (s *session) poll(cq *rxego.CQ, wcs []rxego.WC) (int, error) {
	n, err := cq.PollWait(s.ctx, wcs)
	if err != nil {
		return 0, fmt.Errorf("perftest: waiting for completions: %w", err)
	}
	for _, wc := range wcs[:n] {
		if wc.Status != rxego.WCSuccess {
			return 0, fmt.Errorf("perftest: completion with error: status %s (%d), wr_id %#x, QP %#x",
				wc.Status, wc.Status, wc.ID, wc.QPN)
		}
	}
	return n, nil
}

// qpIndex returns the index of the QP numbered num.
func (s *session) qpIndex(num uint32) (int, error) {
	for i, q := range s.qps {
		if q.Num() == num {
			return i, nil
		}
	}
	return 0, fmt.Errorf("perftest: completion for unknown QP %#x", num)
}

// closeHold ends the exchange; the hold hook runs at the final handshake.
func (s *session) closeHold(checks func() []PeerCheck) error {
	return s.ex.Close(s.my[0], s.holdFunc(checks))
}

// holdFunc returns the hook for the final handshake, or nil without
// cfg.Hold. The checks are computed when the peer is known to be done.
func (s *session) holdFunc(checks func() []PeerCheck) func() error {
	if s.cfg.Hold == nil || checks == nil {
		return nil
	}
	return func() error {
		s.dev.Sync()
		return s.cfg.Hold(checks())
	}
}

// randomSeed returns a non-zero seed.
func randomSeed() uint64 {
	for {
		if v := rand.Uint64(); v != 0 {
			return v
		}
	}
}

// pattern fills b with a pseudo-random sequence from seed (xorshift64*),
// so rxego's buffer is not constant, as perftest's rand() fill is not, and
// bytes a peer overwrote can be told from untouched ones.
func pattern(b []byte, seed uint64) {
	x := seed | 1
	for i := 0; i < len(b); {
		x ^= x >> 12
		x ^= x << 25
		x ^= x >> 27
		v := x * 0x2545f4914f6cdd1d
		for k := 0; k < 8 && i < len(b); k++ {
			b[i] = byte(v >> (8 * k))
			i++
		}
	}
}
