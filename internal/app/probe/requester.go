package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/app/perftest"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/reth"
	"github.com/rxego/rxego/transport/pcaptap"
)

// RequesterConfig is a requester-mode run: the peer runs an ib_write_bw,
// ib_send_bw or ib_read_bw client (-q NumQPs, one packet per message: -s at most
// the path MTU) against the probe as its server; the probe answers as a
// responder would, impairs one packet per QP as that QP's scenario says,
// and records how the peer's requester reacts.
type RequesterConfig struct {
	Tool   string     // write_bw (default), send_bw or read_bw: the client the peer runs
	Peer   netip.Addr // the only address the probe sends to: the client's QPs must be there
	Port   int        // TCP port to listen on (the client's -p); 0: 18515
	Local  netip.Addr // the probe's RoCE address; it listens and binds here
	NumQPs int        // the client's -q
	MTU    int        // path MTU offered, bytes (default 1024)
	// ACKTimeout is the peer's QP ACK timeout exponent (perftest's -u;
	// default 14, 67 ms; with RDMACM, the one the peer's CM REQ
	// announced): the "T" of retransmission bounds.
	ACKTimeout uint8
	// RetryCnt is the peer's retry count (the C tools set 7).
	RetryCnt int
	// TimerSlack widens every delay bound by this much on each side (0:
	// DefaultTimerSlack): the probe stamps packets when they arrive, not
	// when they left, and kernel timers tick in jiffies (rxe at HZ=250
	// can fire up to 4 ms before the time it was asked for).
	TimerSlack time.Duration
	// Pingpong does ibv_rc_pingpong's exchange (Tool Pingpong): its client
	// has one QP, so one scenario runs (pick it with --only); the probe
	// answers each of its messages with a SEND of the same length, as
	// ibv_rc_pingpong's server does.
	Pingpong  PingpongSwap
	Scenarios []*Scenario
	Wait      time.Duration // how long after the peer's last packet to keep watching; 0: 2 s
	// Gap is the least time between two of the probe's packets (0:
	// DefaultRequesterGap). The probe only answers (one ACK per packet of
	// the peer's, two for ack-twice, a READ's responses per READ
	// request), so the peer's pace bounds it too.
	Gap        time.Duration
	MaxPackets int
	Pcap       *pcaptap.Writer
	Timeout    time.Duration // the whole run; 0: 2 minutes
	// Listening, when set, is called once the probe listens (with
	// RDMACM: its rdma_cm port, as a *net.UDPAddr).
	Listening func(addr net.Addr)
	// RDMACM is perftest's -R: the peer's client runs with -R, and the
	// exchange and the QPs' connections go over rdma_cm (see rdmacm.go);
	// Port is then the probe's rdma_cm port.
	RDMACM bool
}

// reqEvent is one packet the peer's requester sent on a scenario's QP.
type reqEvent struct {
	at   time.Time
	rel  int // PSN relative to the peer's start PSN
	copy int // 1 for the first copy of this PSN, 2 for the first resend, ...
	size int // bytes, BTH to ICRC
}

// reqQP is the probe's responder for one scenario's QP.
type reqQP struct {
	s       *Scenario
	impair  *Step
	myQPN   uint32
	peerQPN uint32
	start   uint32 // the peer's first PSN
	epsn    uint32 // next PSN expected
	msn     uint32
	nakSent bool

	seen   map[int]int
	events []reqEvent
	naks   []reqEvent // sequence error NAKs the probe sent (rel = the NAK's PSN)
	cnps   []time.Time
	dupAt  time.Time // when ack-twice's second ACK left
	// holding: the probe acknowledges nothing until the peer resends
	// PSN +At (withhold, ghost-ack) or has sent it enough times
	// (withhold-many).
	holding bool
	heldAt  time.Time
	// reply: answer each complete message with a SEND of its length
	// (ibv_rc_pingpong's server), from PSN myPSN on; msgLen counts the
	// current message's bytes.
	reply  bool
	myPSN  uint32
	msgLen int

	// A CNP train's QP (impair cnp) is acknowledged coalesced: once
	// per coalesceEvery packets, or once the peer has sent nothing for
	// coalesceWait (it waits for an ACK, or its stream ended), so that
	// the peer sends at its own pace and not at that of the probe's
	// ACKs, and a slow stream costs no more ACKs than a fast one;
	// unacked counts the packets since the last ACK, flushAt is when
	// they must be acknowledged if no packet comes first.
	coalesce bool
	unacked  int
	flushAt  time.Time
	// trainDue is when the CNP train is to start: its first CNP is due
	// After the packet at +At came, its quiet window (startTrain) a
	// window before that; it starts with the peer's first packet from
	// then on, so a stream that has ended draws no CNPs.
	trainDue time.Time
	train    *cnpTrain
}

// Coalesced acknowledgement of a CNP train's QP: one ACK per
// coalesceEvery packets keeps the window of a perftest client (its tx
// depth, 128 by default, a completion asked for every 100) open with a
// fraction of the probe's own packet rate, and coalesceWait bounds how
// long a peer that waits for an ACK waits, far below any ACK timeout
// (67 ms for the C tools).
const (
	coalesceEvery = 32
	coalesceWait  = time.Millisecond
)

// cnpTrain is a train of CNPs to one of the peer's QPs, sent by a
// goroutine of its own: they are due every so often whether or not the
// peer's packets come (a reaction point raises its rate again on its
// own timers once CNPs stop), which the run's loop, woken by the peer's
// packets, cannot promise.
type cnpTrain struct {
	want int
	done chan struct{}
	mu   sync.Mutex
	sent []time.Time
	err  error
}

// startTrain sends q's peer QP count CNPs (BECN set, as a notification
// point sends them), every apart, until count or until ctx ends.
func (r *reqRun) startTrain(ctx context.Context, q *reqQP, count int, every, quiet time.Duration) *cnpTrain {
	t := &cnpTrain{want: count, done: make(chan struct{})}
	r.trains = append(r.trains, t)
	go func() {
		defer close(t.done)
		// CNPs less than a millisecond apart need a sender that spins
		// between them (sleepUntil): a Go timer wakes a millisecond
		// late, a thread sleeping in the kernel was measured 50 to 200
		// us late on a loaded VM, and a reaction point takes a gap of a
		// few hundred microseconds as the end of congestion (see
		// scenarios/requester.txt). A spinning sender takes a CPU from
		// a peer on the same host (loopback, the lab's emulated guests)
		// and slows it by itself, so it spins for quiet (the window
		// before the first CNP) first: both windows see the same load.
		// The schedule is kept: a CNP that left late (behind an ACK, the
		// probe's gap) does not delay the rest.
		next := time.Now().Add(quiet)
		wait := sleepUntil
		if every <= spinBelow {
			wait = spinUntil
		}
		if err := wait(ctx, next); err != nil {
			return
		}
		for range count {
			if err := sleepUntil(ctx, next); err != nil {
				return
			}
			at, err := r.sendCNP(ctx, q)
			t.mu.Lock()
			if err != nil {
				if ctx.Err() == nil {
					t.err = err
				}
				t.mu.Unlock()
				return
			}
			t.sent = append(t.sent, at)
			t.mu.Unlock()
			next = next.Add(every)
		}
	}()
	return t
}

// sendCNP sends a CNP to q's peer QP, giving way to the run's other
// packets (wire.sendYielding).
func (r *reqRun) sendCNP(ctx context.Context, q *reqQP) (time.Time, error) {
	pkt, err := r.packet(q, bth.Header{Opcode: bth.CNPOpcode, BECN: true}, nil)
	if err != nil {
		return time.Time{}, err
	}
	return r.w.sendYielding(ctx, pkt)
}

// stopTrains ends every CNP train still running and waits for them.
func (r *reqRun) stopTrains() {
	r.stop()
	for _, t := range r.trains {
		<-t.done
	}
}

// times returns when the train's CNPs left, and why it stopped short.
func (t *cnpTrain) times() ([]time.Time, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.sent), t.err
}

// Requester runs requester-mode scenarios against an ib_write_bw,
// ib_send_bw or ib_read_bw client.
func Requester(ctx context.Context, cfg RequesterConfig) (*Report, error) {
	if !cfg.Peer.IsValid() || !cfg.Local.IsValid() {
		return nil, errors.New("probe: requester mode needs the peer's address and a local address")
	}
	if cfg.Tool == Pingpong {
		cfg.NumQPs = 1 // ibv_rc_pingpong has one
	}
	if cfg.NumQPs < 1 || cfg.NumQPs > 1024 {
		return nil, fmt.Errorf("probe: -q %d: the peer's QP count, 1..1024", cfg.NumQPs)
	}
	if cfg.Tool == "" {
		cfg.Tool = "write_bw"
	}
	pp := cfg.Tool == Pingpong
	if pp {
		if cfg.Pingpong == nil {
			return nil, errors.New("probe: ibv_rc_pingpong's exchange (RequesterConfig.Pingpong) is not set")
		}
	}
	needs, ok := requesterToolNeeds[cfg.Tool]
	if !ok {
		return nil, fmt.Errorf("probe: requester mode: tool %q: want write_bw, send_bw, read_bw or %s", cfg.Tool, Pingpong)
	}
	var runs []*Scenario
	var skipped []Result
	for _, s := range cfg.Scenarios {
		switch {
		case !s.Requester:
			return nil, fmt.Errorf("probe: scenario %s is a responder-mode scenario", s.Name)
		case s.Needs != needs:
			skipped = append(skipped, Result{Name: s.Name, Rule: s.Rule, Requires: s.Requires, Verdict: NotApplicable,
				Detail: fmt.Sprintf("needs a client whose requests are %s; ib_%s's are %s", requestKind(s.Needs), cfg.Tool, requestKind(needs))})
		default:
			runs = append(runs, s)
		}
	}
	if len(runs) > 1 {
		// Scenarios that run alone give way to the others.
		runs = slices.DeleteFunc(runs, func(s *Scenario) bool {
			if s.RunsAlone() {
				skipped = append(skipped, Result{Name: s.Name, Rule: s.Rule, Requires: s.Requires, Verdict: Inconclusive,
					Detail: fmt.Sprintf("not run: it runs alone, with a long stream (--only %s -q 1; the peer's client with -n 20000)", s.Name)})
			}
			return s.RunsAlone()
		})
	}
	if cfg.Port == 0 {
		cfg.Port = 18515
	}
	cmTimeout := cfg.RDMACM && cfg.ACKTimeout == 0 // T as the peer's CM REQ says (below)
	if cfg.ACKTimeout == 0 {
		cfg.ACKTimeout = 14
	}
	if cfg.RetryCnt == 0 {
		cfg.RetryCnt = 7
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 2 * time.Second
	}
	if cfg.Gap <= 0 {
		cfg.Gap = DefaultRequesterGap
	}
	if cfg.TimerSlack <= 0 {
		cfg.TimerSlack = DefaultTimerSlack
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	mtuCode, err := mtuCodeOf(cfg.MTU)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	rep := &Report{Mode: "requester", Peer: cfg.Peer.String(), Tool: toolName(cfg.Tool), Started: time.Now()}

	if cfg.RDMACM && pp {
		return nil, errors.New("probe: -R is perftest's; ibv_rc_pingpong has no rdma_cm handshake")
	}
	w, err := openWire(cfg.Local, cfg.Peer, cfg.Gap, cfg.MaxPackets, cfg.Pcap)
	if err != nil {
		return nil, err
	}
	defer w.close()
	var conn net.Conn
	var cms *cmSide
	if cfg.RDMACM {
		var listening func()
		if cfg.Listening != nil {
			listening = func() { cfg.Listening(&net.UDPAddr{IP: cfg.Local.AsSlice(), Port: cfg.Port}) }
		}
		if cms, err = openCM(ctx, w, cfg.Port, true, listening); err != nil {
			return nil, err
		}
		defer func() {
			if cms != nil {
				cms.close()
			}
		}()
	} else {
		ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Local.String(), strconv.Itoa(cfg.Port)))
		if err != nil {
			return nil, fmt.Errorf("probe: listening on port %d: %w", cfg.Port, err)
		}
		defer ln.Close()
		if cfg.Listening != nil {
			cfg.Listening(ln.Addr())
		}
		stopLn := context.AfterFunc(ctx, func() { ln.Close() })
		defer stopLn()
		// The exchange may come from another address of the peer's host (on
		// loopback it does); the handshake's GIDs must be the peer's.
		conn, err = ln.Accept()
		if err != nil {
			return nil, fmt.Errorf("probe: waiting for the peer's %s client: %w", toolName(cfg.Tool), err)
		}
		defer conn.Close()
		stopConn := context.AfterFunc(ctx, func() { conn.Close() })
		defer stopConn()
	}

	var ex *perftest.Exchange
	rep.MTU = 1024
	if pp {
		if cfg.MTU != 0 {
			rep.MTU = cfg.MTU // ibv_rc_pingpong's -m: not exchanged
		}
	} else {
		if ex, rep.PeerVersion, rep.MTU, err = perftestOpening(cms, conn, false, deadline, mtuCode); err != nil {
			return nil, err
		}
	}
	my := make([]perftest.Dest, cfg.NumQPs)
	for i := range my {
		my[i] = perftest.Dest{OutReads: 16, QPN: 0x100 + uint32(i), PSN: uint32(0x200000 + i*0x1111),
			RKey: 0x1000 + uint32(i), VAddr: 0x10000000, GID: cfg.Local.As16()}
	}
	rem := make([]perftest.Dest, cfg.NumQPs)
	keys := rem
	if cms != nil {
		// The CM picks the numbers and PSNs; the records carry rkeys
		// and addresses only (the probe's are never used: it answers).
		if my, rem, err = cms.connect(w, toolTests[cfg.Tool], cfg.NumQPs, rep.MTU); err != nil {
			return nil, err
		}
		keys = make([]perftest.Dest, cfg.NumQPs)
		for i := range my {
			my[i].RKey, my[i].VAddr = 0x1000+uint32(i), 0x10000000
		}
		if cmTimeout {
			// The CM gave the peer's QPs the ACK timeout its REQ
			// announced (perftest's -u does not reach rdma_cm's
			// QPs), and the probe's QPs the same.
			cfg.ACKTimeout = cms.qps[0].Query().Timeout
			rep.Notes = append(rep.Notes, fmt.Sprintf("-R: the peer's ACK timeout is the one its CM REQ announced: %d (T = %v)",
				cfg.ACKTimeout, qpTimeout(cfg.ACKTimeout)))
		}
	}
	qps := make(map[uint32]*reqQP, cfg.NumQPs)
	var order []*reqQP
	// The QPs are set up once the first handshake told the peer's PSNs.
	setUp := func() error {
		if err := checkPeerAddrs(rem, cfg.Peer); err != nil {
			return err
		}
		for i := range my {
			q := &reqQP{myQPN: my[i].QPN, peerQPN: rem[i].QPN, start: rem[i].PSN, epsn: rem[i].PSN, seen: map[int]int{},
				reply: pp, myPSN: my[i].PSN}
			if i < len(runs) {
				q.s = runs[i]
				for j := range q.s.Steps {
					if q.s.Steps[j].Kind == StepImpair {
						q.impair = &q.s.Steps[j]
					}
				}
				q.coalesce = q.impair != nil && q.impair.Impair == ImpairCNP
			}
			qps[q.myQPN] = q
			order = append(order, q)
		}
		return nil
	}
	if pp {
		conn.SetDeadline(deadline)
		theirs, err := cfg.Pingpong(conn, false, QPRecord{QPN: my[0].QPN, PSN: my[0].PSN, GID: my[0].GID})
		if err != nil {
			return nil, err
		}
		rem[0] = perftest.Dest{QPN: theirs.QPN, PSN: theirs.PSN, GID: theirs.GID}
		if err := setUp(); err != nil {
			return nil, err
		}
	} else if err := handShakes(ex, cfg.Tool, my, keys, setUp); err != nil {
		return nil, err
	}

	// The peer's traffic runs until its final synchronisation;
	// ibv_rc_pingpong's has none: its run ends when it falls silent.
	final := make(chan error, 1)
	// With a long T (rdma_cm's: 0.5 s to 2 s) the peer's resends come
	// further apart than the default watch: watch at least 4T, the most a
	// resend may wait, and withhold ACKs long enough for 9 of them.
	T := qpTimeout(cfg.ACKTimeout)
	cfg.Wait = max(cfg.Wait, 4*T+time.Second)
	quiet := cfg.Wait / 4
	if pp {
		final, quiet = nil, cfg.Wait
	}
	go func() {
		if pp {
			return
		}
		var err error
		if cfg.Tool == "send_bw" {
			err = ex.Close(my[0], nil) // ib_send_bw swaps no reports
		} else {
			_, err = ex.HandShake(my[0])
		}
		final <- err
	}()
	r := &reqRun{w: w, ctx: ctx, qps: qps, timeoutT: T, retryCnt: cfg.RetryCnt, slack: cfg.TimerSlack, mtu: rep.MTU,
		hold: min(max(maxHold, 9*T), maxHoldLong)}
	r.trainCtx, r.stop = context.WithCancel(ctx)
	defer r.stopTrains()
	var finalErr error
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	// Coalesced ACKs (a CNP train's QP) are flushed on a short tick.
	var flush <-chan time.Time
	if slices.ContainsFunc(order, func(q *reqQP) bool { return q.coalesce }) {
		ft := time.NewTicker(coalesceWait)
		defer ft.Stop()
		flush = ft.C
	}
	last := time.Now()
loop:
	for {
		select {
		case now := <-flush:
			if err := r.flushAcks(now); err != nil {
				rep.Notes = append(rep.Notes, err.Error())
				break loop
			}
		case a, ok := <-w.in:
			if !ok {
				break loop
			}
			last = time.Now()
			if err := r.handle(a); err != nil {
				rep.Notes = append(rep.Notes, err.Error())
				break loop
			}
		case finalErr = <-final:
			final = nil
			last = time.Now()
		case <-tick.C:
			r.releaseHeld()
			if final == nil && time.Since(last) > quiet {
				break loop
			}
			if time.Since(last) > cfg.Wait && final != nil {
				// The peer went silent without ending: its QPs are
				// stuck (or in error); report what was seen.
				rep.Notes = append(rep.Notes, "the peer's client stopped sending without ending its run")
				break loop
			}
		case <-ctx.Done():
			break loop
		}
	}
	r.stopTrains()
	if final == nil && finalErr == nil && cfg.Tool != "send_bw" && !pp {
		if _, err := ex.Reports(perftest.Report{}); err == nil {
			err = ex.Close(my[0], nil)
			if err != nil {
				rep.Notes = append(rep.Notes, fmt.Sprintf("ending the peer tool's run: %v", err))
			}
		}
	} else if finalErr != nil {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the peer's client ended its run abnormally: %v", finalErr))
	}
	if cms != nil {
		if err := cms.close(); err != nil {
			rep.Notes = append(rep.Notes, fmt.Sprintf("rdma_cm teardown: %v", err))
		}
		cms = nil
	}
	for i, q := range order {
		if q.s == nil {
			continue
		}
		v, detail, obs := r.judge(q)
		rep.Results = append(rep.Results, Result{Name: q.s.Name, Rule: q.s.Rule, Requires: q.s.Requires,
			Verdict: v, Detail: detail, Observed: obs, MyQPN: q.myQPN, PeerQPN: q.peerQPN, StartPSN: rem[i].PSN})
	}
	for _, s := range runs[min(len(runs), cfg.NumQPs):] {
		why := fmt.Sprintf("not run: the peer's client has %d QPs (run it with -q %d)", cfg.NumQPs, len(runs))
		if pp {
			why = "not run: ibv_rc_pingpong has one QP, for one scenario a run (pick it with --only)"
		}
		rep.Results = append(rep.Results, Result{Name: s.Name, Rule: s.Rule, Requires: s.Requires, Verdict: Inconclusive, Detail: why})
	}
	rep.Results = append(rep.Results, skipped...)
	rep.order(cfg.Scenarios)
	rep.finish(w)
	return rep, nil
}

// DefaultTimerSlack is RequesterConfig.TimerSlack's default.
const DefaultTimerSlack = 5 * time.Millisecond

// DefaultRequesterGap is requester mode's least time between two of the
// probe's packets: short enough that its ACKs keep up with a C tool's
// burst (a late ACK would time the peer out and spoil the scenarios that
// measure timers), at most 20,000 packets a second.
const DefaultRequesterGap = 50 * time.Microsecond

// requestKind says how a requester-mode scenario's requests are answered.
func requestKind(n Needs) string {
	if n == NeedsRead {
		return "READs answered with data"
	}
	return "acknowledged (WRITEs or SENDs)"
}

// qpTimeout is the IBTA local ACK timeout 4.096 us x 2^t.
func qpTimeout(t uint8) time.Duration { return time.Duration(4096<<t) * time.Nanosecond }

// reqRun is the probe's responder side of a requester-mode run.
type reqRun struct {
	w        *wire
	ctx      context.Context
	qps      map[uint32]*reqQP
	timeoutT time.Duration
	retryCnt int
	slack    time.Duration
	mtu      int
	hold     time.Duration // how long ACKs are withheld at most

	trainCtx context.Context // the CNP trains': ends with the run's loop
	stop     context.CancelFunc
	trains   []*cnpTrain
}

// send builds h (addressed to q's peer QP), sends it and returns when it
// left.
func (r *reqRun) send(q *reqQP, h bth.Header, payload []byte, ce bool) (time.Time, error) {
	pkt, err := r.packet(q, h, payload)
	if err != nil {
		return time.Time{}, err
	}
	var tos uint8
	if ce {
		tos = 0x03 // ECN CE
	}
	return r.w.send(r.ctx, pkt, tos)
}

// packet builds h, addressed to q's peer QP, with its ICRC.
func (r *reqRun) packet(q *reqQP, h bth.Header, payload []byte) ([]byte, error) {
	h.DestQP, h.PKey = q.peerQPN, bth.DefaultPKey
	buf := make([]byte, bth.PacketLen(h.Opcode, len(payload)))
	n, err := h.Encode(buf, payload)
	if err != nil {
		return nil, err
	}
	pkt := buf[:n]
	r.w.fillICRC(pkt)
	return pkt, nil
}

// ack sends an ACK (or NAK) for PSN psn.
func (r *reqRun) ack(q *reqQP, psn uint32, syn reth.Syndrome, ce bool) error {
	_, err := r.ackAt(q, psn, syn, ce)
	return err
}

// ackAt is ack returning when the packet left.
func (r *reqRun) ackAt(q *reqQP, psn uint32, syn reth.Syndrome, ce bool) (time.Time, error) {
	return r.send(q, bth.Header{Opcode: bth.RCAck, PSN: bth.PSN(psn & bth.PSNMask),
		AETH: bth.AETHFields{Syndrome: syn, MSN: q.msn & bth.PSNMask}}, nil, ce)
}

// readPackets is how many response packets the READ request h asks for.
func (r *reqRun) readPackets(h bth.Header) int {
	return max(1, (int(h.RETH.DMALen)+r.mtu-1)/r.mtu)
}

// readResponse answers the READ request h (new or duplicate: a duplicate
// READ is executed again, C9-105) with zeros, one path MTU a packet;
// ce marks the packets ECN CE.
func (r *reqRun) readResponse(q *reqQP, h bth.Header, ce bool) error {
	n, left := r.readPackets(h), int(h.RETH.DMALen)
	for i := range n {
		var op bth.Opcode
		switch {
		case n == 1:
			op = bth.RCReadResponseOnly
		case i == 0:
			op = bth.RCReadResponseFirst
		case i == n-1:
			op = bth.RCReadResponseLast
		default:
			op = bth.RCReadResponseMiddle
		}
		chunk := min(left, r.mtu)
		left -= chunk
		resp := bth.Header{Opcode: op, PSN: bth.PSN((uint32(h.PSN) + uint32(i)) & bth.PSNMask),
			AETH: bth.AETHFields{Syndrome: reth.ACKSyndrome(reth.CreditsInvalid), MSN: q.msn & bth.PSNMask}}
		if _, err := r.send(q, resp, make([]byte, chunk), ce); err != nil {
			return err
		}
	}
	return nil
}

// handle answers one packet of the peer's.
func (r *reqRun) handle(a arrival) error {
	q, ok := r.qps[a.hdr.DestQP]
	if !ok {
		return nil
	}
	h := a.hdr
	if h.Opcode == bth.CNPOpcode {
		q.cnps = append(q.cnps, a.at)
		return nil
	}
	in, _ := bth.Lookup(h.Opcode)
	if in == nil || !in.Has(bth.Request) || in.Op != bth.OpWrite && in.Op != bth.OpSend && in.Op != bth.OpReadRequest {
		return nil // requester mode answers ib_write_bw's and ib_read_bw's traffic (and SENDs)
	}
	read := in.Op == bth.OpReadRequest
	n := 1
	if read {
		n = r.readPackets(h)
	}
	rel := int((uint32(h.PSN) - q.start) & bth.PSNMask)
	q.seen[rel]++
	q.events = append(q.events, reqEvent{at: a.at, rel: rel, copy: q.seen[rel], size: len(a.pkt)})
	if q.train == nil && !q.trainDue.IsZero() && !a.at.Before(q.trainDue) {
		q.train = r.startTrain(r.trainCtx, q, *q.impair.Count, q.impair.Every, q.s.rateWindow())
	}
	syn := reth.ACKSyndrome(reth.CreditsInvalid)
	ce := false
	if im := q.impair; im != nil && q.holding {
		limit := 2
		if im.Impair == ImpairWithholdMany {
			limit = r.retryCnt + 3
			if im.Count != nil {
				limit = *im.Count
			}
		}
		if rel != im.At || q.seen[rel] < limit {
			if int32((uint32(h.PSN)-q.epsn)<<8)>>8 == 0 {
				if err := r.take(q, h, n, a.pkt); err != nil {
					return err
				}
			}
			return nil
		}
		q.holding = false // this copy is answered as the duplicate it is
	}
	if im := q.impair; im != nil && rel == im.At {
		switch im.Impair {
		case ImpairDrop:
			if q.seen[rel] == 1 {
				return nil
			}
		case ImpairRNR:
			if q.seen[rel] == 1 {
				timer := 24
				if im.Timer != nil {
					timer = *im.Timer
				}
				// As after any NAK, what follows is dropped silently
				// until the expected PSN comes again.
				q.nakSent = true
				return r.ack(q, uint32(h.PSN), reth.RNRSyndrome(uint8(timer)), false)
			}
		case ImpairWithhold, ImpairWithholdMany:
			if q.seen[rel] == 1 && rel == int((q.epsn-q.start)&bth.PSNMask) {
				if err := r.take(q, h, n, a.pkt); err != nil {
					return err
				}
				q.holding, q.heldAt = true, a.at
				return nil
			}
		case ImpairGhostAck:
			if q.seen[rel] == 1 && rel == int((q.epsn-q.start)&bth.PSNMask) {
				if err := r.take(q, h, n, a.pkt); err != nil {
					return err
				}
				q.holding, q.heldAt = true, a.at
				return r.ack(q, uint32(h.PSN)+100, syn, false)
			}
		case ImpairAckTwice:
			if q.seen[rel] == 1 {
				if err := r.take(q, h, n, a.pkt); err != nil {
					return err
				}
				if err := r.ack(q, uint32(h.PSN), syn, false); err != nil {
					return err
				}
				at, err := r.ackAt(q, uint32(h.PSN), syn, false)
				q.dupAt = at
				return err
			}
		case ImpairCEAck, ImpairCEData:
			ce = q.seen[rel] == 1
		case ImpairCNP:
			if q.seen[rel] == 1 && q.trainDue.IsZero() {
				q.trainDue = a.at.Add(im.After - q.s.rateWindow()) // the train's quiet window first
			}
		}
	}
	d := int32((uint32(h.PSN)-q.epsn)<<8) >> 8
	switch {
	case d == 0:
		if err := r.take(q, h, n, a.pkt); err != nil {
			return err
		}
		if read {
			return r.readResponse(q, h, ce)
		}
		if q.coalesce && !ce {
			return r.coalescedAck(q, a.at)
		}
		if h.AckReq || ce {
			return r.ack(q, uint32(h.PSN), syn, ce)
		}
	case d < 0: // a duplicate: acknowledge again what was received, or read again
		if read {
			return r.readResponse(q, h, false)
		}
		if q.coalesce {
			// A go-back-N resends up to a window: one ACK for it.
			return r.coalescedAck(q, a.at)
		}
		return r.ack(q, q.epsn-1, syn, false)
	default:
		if !q.nakSent {
			q.nakSent = true
			at, err := r.ackAt(q, q.epsn, reth.NAKSyndrome(reth.NAKPSNSeqError), false)
			q.naks = append(q.naks, reqEvent{at: at, rel: int((q.epsn - q.start) & bth.PSNMask)})
			return err
		}
	}
	return nil
}

// coalescedAck counts a packet taken on a coalescing QP, arrived at
// at, and acknowledges the newest PSN once coalesceEvery have come.
func (r *reqRun) coalescedAck(q *reqQP, at time.Time) error {
	q.unacked++
	if q.unacked < coalesceEvery {
		q.flushAt = at.Add(coalesceWait)
		return nil
	}
	return r.ackCoalesced(q)
}

// ackCoalesced acknowledges everything q took so far.
func (r *reqRun) ackCoalesced(q *reqQP) error {
	q.unacked, q.flushAt = 0, time.Time{}
	return r.ack(q, q.epsn-1, reth.ACKSyndrome(reth.CreditsInvalid), false)
}

// flushAcks acknowledges what a coalescing QP took when the peer has
// sent nothing on it for coalesceWait.
func (r *reqRun) flushAcks(now time.Time) error {
	for _, q := range r.qps {
		if q.unacked > 0 && !now.Before(q.flushAt) {
			if err := r.ackCoalesced(q); err != nil {
				return err
			}
		}
	}
	return nil
}

// take accepts h (of n PSNs, raw pkt) as the next request in sequence
// and, playing ibv_rc_pingpong's server, answers a complete message.
func (r *reqRun) take(q *reqQP, h bth.Header, n int, pkt []byte) error {
	q.accept(h, n)
	return r.replyTo(q, h, pkt)
}

// replyTo answers a complete SEND message (its last packet h, raw pkt)
// with a SEND of the same length when q plays ibv_rc_pingpong's server:
// its client posts its next message only once this one came.
func (r *reqRun) replyTo(q *reqQP, h bth.Header, pkt []byte) error {
	if !q.reply {
		return nil
	}
	if p, err := bth.Parse(pkt); err == nil {
		q.msgLen += len(p.Payload())
	}
	in, _ := bth.Lookup(h.Opcode)
	if in == nil || in.Op != bth.OpSend || !in.Has(bth.Last) {
		return nil
	}
	n := q.msgLen
	q.msgLen = 0
	for first := true; first || n > 0; first = false {
		chunk := min(n, r.mtu)
		n -= chunk
		op := bth.RCSendMiddle
		switch {
		case first && n == 0:
			op = bth.RCSendOnly
		case first:
			op = bth.RCSendFirst
		case n == 0:
			op = bth.RCSendLast
		}
		if _, err := r.send(q, bth.Header{Opcode: op, PSN: bth.PSN(q.myPSN), AckReq: n == 0}, make([]byte, chunk), false); err != nil {
			return err
		}
		q.myPSN = (q.myPSN + 1) & bth.PSNMask
	}
	return nil
}

// accept takes h, of n packets' PSNs, as the next request in sequence.
func (q *reqQP) accept(h bth.Header, n int) {
	q.epsn = (q.epsn + uint32(n)) & bth.PSNMask
	q.nakSent = false
	if in, _ := bth.Lookup(h.Opcode); in != nil && in.Has(bth.Last) {
		q.msn++
	}
}

// maxHold bounds how long the probe withholds a QP's ACKs, unless the
// peer's T is so long (rdma_cm's) that 9 of its resends take longer; then
// 9T, at most maxHoldLong.
const (
	maxHold     = 5 * time.Second
	maxHoldLong = 30 * time.Second
)

// releaseHeld ends a hold that has lasted r.hold: the probe acknowledges
// what it has, so the peer's requester can finish its run.
func (r *reqRun) releaseHeld() {
	for _, q := range r.qps {
		if q.holding && time.Since(q.heldAt) > r.hold {
			q.holding = false
			r.ack(q, q.epsn-1, reth.ACKSyndrome(reth.CreditsInvalid), false)
		}
	}
}

// copies returns the times the peer sent PSN +rel.
func (q *reqQP) copies(rel int) []time.Time {
	var out []time.Time
	for _, e := range q.events {
		if e.rel == rel {
			out = append(out, e.at)
		}
	}
	return out
}

// judge checks q's expectations against what the peer sent.
func (r *reqRun) judge(q *reqQP) (Verdict, string, []string) {
	var obs []string
	im := q.impair
	if im == nil {
		return Inconclusive, "the scenario impairs nothing", nil
	}
	copies := q.copies(im.At)
	if len(copies) == 0 {
		return Inconclusive, fmt.Sprintf("the peer never sent PSN +%d (run its client with more iterations: -n %d or more)", im.At, im.At+5), nil
	}
	for i, c := range copies {
		if i == 0 {
			obs = append(obs, fmt.Sprintf("psn=+%d sent", im.At))
			continue
		}
		obs = append(obs, fmt.Sprintf("resent after %v", c.Sub(copies[i-1]).Round(100*time.Microsecond)))
	}
	rnr := qp.RNRWait(24, 0)
	if im.Timer != nil {
		rnr = qp.RNRWait(uint8(*im.Timer), 0)
	}
	fail := func(f string, a ...any) (Verdict, string, []string) {
		if q.s.Optional {
			return NotApplicable, fmt.Sprintf(f, a...), obs
		}
		return Deviates, fmt.Sprintf(f, a...), obs
	}
	for _, st := range q.s.Steps {
		if st.Kind != StepExpect {
			continue
		}
		switch st.Expect {
		case "go-back":
			if len(q.naks) == 0 {
				return Inconclusive, "the probe sent no sequence error NAK (the peer sent nothing after the lost packet)", obs
			}
			nak := q.naks[0]
			obs = append(obs, fmt.Sprintf("probe NAKed (PSN sequence error) at psn=+%d", nak.rel))
			e, ok := q.firstResend(nak.at)
			if !ok {
				return fail("no resend after the NAK")
			}
			obs = append(obs, fmt.Sprintf("first resend psn=+%d after %v", e.rel, e.at.Sub(nak.at).Round(100*time.Microsecond)))
			if e.rel != nak.rel {
				return fail("resent from psn=+%d, not from the NAK's psn=+%d", e.rel, nak.rel)
			}
		case "retransmit":
			if len(copies) < 2 {
				return fail("psn=+%d was never resent", im.At)
			}
			// The timer's resend is the peer's first one after +At's
			// first copy. When the probe's ACKs of the PSNs before +At
			// came late (a loaded host), the peer's timer ran out on
			// one of those and its go-back-N resent +At along with it,
			// perhaps just after +At's first copy: the time that judges
			// the timer is then the oldest PSN's. A resend before +At
			// was first sent is no reaction to the withheld ACK (a
			// stalled guest's timer ran out while its sends were still
			// queued, and the original and its copy left together).
			first, ok := q.firstRetransmissionAfter(im.At)
			if !ok || first.rel > im.At {
				return fail("resent psn=+%d first, not the oldest unacknowledged (psn=+%d or before)", first.rel, im.At)
			}
			d := copies[1].Sub(copies[0])
			if first.rel != im.At {
				orig := q.copies(first.rel)[0]
				d = first.at.Sub(orig)
				obs = append(obs, fmt.Sprintf("the timer ran out on psn=+%d first (the probe's ACK for it came late): resent after %v", first.rel, d.Round(100*time.Microsecond)))
			}
			lo, _ := parseDelay(st.Min, r.timeoutT, rnr)
			hi, _ := parseDelay(st.Max, r.timeoutT, rnr)
			if st.Min != "" && d < lo-r.slack || st.Max != "" && d > hi+r.slack {
				return fail("resent after %v, want %s..%s (%v..%v, give or take %v)", d.Round(100*time.Microsecond), st.Min, st.Max, lo, hi, r.slack)
			}
		case "retries":
			n := len(copies) - 1
			if st.Count != nil && n > *st.Count {
				return fail("%d retries and still retrying when the probe gave in; want %d, then an error", n, *st.Count)
			}
			if st.Count != nil && n < *st.Count {
				return fail("%d retries, want %d", n, *st.Count)
			}
		case "no-retransmit":
			if e, ok := q.resentAfterDupAck(im.At, r.timeoutT/2); ok {
				return fail("psn=+%d resent %v after the duplicate ACK", e.rel, e.at.Sub(q.dupAt).Round(100*time.Microsecond))
			}
		case "cnp":
			if len(q.cnps) == 0 {
				return fail("no CNP for the CE-marked packet")
			}
			obs = append(obs, fmt.Sprintf("%d CNP(s)", len(q.cnps)))
		case "slower":
			rates, why := q.rates(st.Window, 4*r.timeoutT)
			if why != "" {
				return Inconclusive, why, obs
			}
			obs = append(obs, rates.String())
			if !rates.slowed() {
				return fail("no slow-down: %s before the CNPs, %s while they came (no reaction point)", rates.before, rates.after)
			}
		}
	}
	return Conforms, "", obs
}

// resentAfterDupAck returns the first resend that reacts to the
// duplicate ACK of PSN +at: one less than within after it (a reaction
// would come at once; a resend half a timeout later is the ACK timer's,
// which a stalled host can fire for reasons of its own). A go-back-N that starts at +at
// or before is no reaction to it either: the ACKs covered those PSNs, so
// the peer resending them had not taken the ACKs yet when its timer ran
// out (a stalled guest); that sweep is passed over whole.
func (q *reqQP) resentAfterDupAck(at int, within time.Duration) (reqEvent, bool) {
	sweep := -1 // the last PSN of a go-back-N from a covered PSN
	for _, e := range q.events {
		if e.copy < 2 || e.at.Before(q.dupAt) || e.at.Sub(q.dupAt) >= within {
			continue
		}
		switch {
		case e.rel <= at:
			sweep = e.rel
		case sweep >= 0 && e.rel == sweep+1:
			sweep = e.rel
		default:
			return e, true
		}
	}
	return reqEvent{}, false
}

// firstRetransmissionAfter returns the first packet the peer sent a
// second time after PSN +rel's first copy.
func (q *reqQP) firstRetransmissionAfter(rel int) (reqEvent, bool) {
	sent := false
	for _, e := range q.events {
		switch {
		case e.rel == rel && e.copy == 1:
			sent = true
		case sent && e.copy > 1:
			return e, true
		}
	}
	return reqEvent{}, false
}

// firstResend returns the first packet after t that is not a new PSN:
// packets with PSNs above all before were still in flight when t came.
func (q *reqQP) firstResend(t time.Time) (reqEvent, bool) {
	maxRel := -1
	for _, e := range q.events {
		if e.at.Before(t) || e.rel > maxRel {
			maxRel = max(maxRel, e.rel)
			continue
		}
		return e, true
	}
	return reqEvent{}, false
}
