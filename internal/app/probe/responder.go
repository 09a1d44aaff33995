package probe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/app/perftest"
	"github.com/rxego/rxego/transport/pcaptap"
)

// Tools whose servers the responder mode can ride, and what each one's
// QPs offer: what its memory region allows remotely, or receives posted.
var toolNeeds = map[string]Needs{
	"write_bw":  NeedsWrite,
	"read_bw":   NeedsRead,
	"atomic_bw": NeedsAtomic,
	"send_bw":   NeedsSend,
	// ibv_rc_pingpong: one QP, receives posted, no remote access; the
	// scenarios run one after another on it (see ResponderConfig).
	Pingpong: NeedsSend,
	// ibv_uc_pingpong: the same, on an unreliable connected QP.
	UCPingpong: NeedsUC,
}

// Pingpong is the name of ibv_rc_pingpong as a Tool.
const Pingpong = "rc_pingpong"

// UCPingpong is the name of ibv_uc_pingpong as a Tool (responder mode):
// its exchange is ibv_rc_pingpong's, its QP unreliable connected.
const UCPingpong = "uc_pingpong"

// isPingpong says whether tool is one of the ibv_*_pingpong servers,
// whose one QP the scenarios share.
func isPingpong(tool string) bool { return tool == Pingpong || tool == UCPingpong }

// receivesOnly says whether a QP that offers n allows no remote access
// (its receives take SENDs), so that AllAccess does not widen it.
func receivesOnly(n Needs) bool { return n == NeedsSend || n == NeedsUC }

// QPRecord is one QP's address as ibv_*_pingpong's exchange carries it.
type QPRecord struct {
	QPN, PSN uint32
	GID      [16]byte
}

// PingpongSwap swaps one QP record with an ibv_rc_pingpong peer over c,
// as its client (client true: write, read, then "done") or its server
// (read, write, wait for "done"). rxego's pingpong package has it; the
// caller supplies it.
type PingpongSwap func(c net.Conn, client bool, mine QPRecord) (QPRecord, error)

// toolName is the C tool's command name.
func toolName(tool string) string {
	if isPingpong(tool) {
		return "ibv_" + tool
	}
	return "ib_" + tool
}

// requesterToolNeeds are the clients requester mode serves, and which
// scenarios each can carry: ib_write_bw's and ib_send_bw's requests are
// acknowledged ("write" scenarios), ib_read_bw's are answered with data.
var requesterToolNeeds = map[string]Needs{
	"write_bw": NeedsWrite,
	"send_bw":  NeedsWrite,
	"read_bw":  NeedsRead,
	// ibv_rc_pingpong's client: SENDs, answered with SENDs (see
	// RequesterConfig.Pingpong).
	Pingpong: NeedsWrite,
}

// handShakes runs the key-record handshakes a perftest tool makes before
// its traffic, in its order (perftest's ctx_hand_shake calls, as
// internal/app/perftest's connect and sendBWServer make them): every QP's
// record ("all") or one ("one"). check runs after the first, before the
// probe has sent anything.
func handShakes(ex *perftest.Exchange, tool string, my, rem []perftest.Dest, check func() error) error {
	all := func() error {
		for i := range my {
			r, err := ex.HandShake(my[i])
			if err != nil {
				return err
			}
			rem[i] = r
		}
		return nil
	}
	one := func() error {
		_, err := ex.HandShake(my[0])
		return err
	}
	// write, read and atomic BW: all records, the QPs move to RTS, all
	// again, then one. send BW: all, one, all, and one more once the
	// server has posted its receives.
	steps := []func() error{all, check, all, one}
	if tool == "send_bw" {
		steps = []func() error{all, check, one, all, one}
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// checkPeerAddrs refuses a handshake whose QPs are not at peer: the probe
// sends only to the peer named.
func checkPeerAddrs(rem []perftest.Dest, peer netip.Addr) error {
	for i, r := range rem {
		if r.Addr() != peer {
			return fmt.Errorf("probe: the peer's QP %d is at %v, not at %v: the probe sends only to the peer named", i, r.Addr(), peer)
		}
	}
	return nil
}

// ResponderConfig is a responder-mode run: the peer runs a perftest
// server (ib_write_bw, ib_read_bw, ib_atomic_bw or ib_send_bw, with -q
// NumQPs) or ibv_rc_pingpong's, the probe does that tool's client
// handshake and then, instead of the tool's traffic, runs one scenario
// per QP (pingpong's one QP: all in turn).
type ResponderConfig struct {
	Peer netip.Addr // the peer's address: the exchange's and the only RoCE destination
	Port int        // perftest's TCP port (-p); 0: 18515
	// Local is the probe's RoCE address; it binds Local:4791 (default:
	// the exchange's local address, as the C tools use).
	Local  netip.Addr
	Tool   string // write_bw, read_bw, atomic_bw, send_bw, Pingpong or UCPingpong: what the peer runs
	NumQPs int    // the peer's -q
	MTU    int    // path MTU offered, bytes (default 1024)
	// AllAccess says the peer's memory region allows writes, reads and
	// atomics whatever the tool (rxego's perf does; rdma-core's perftest
	// registers only what its test uses).
	AllAccess bool
	// Pingpong does ibv_rc_pingpong's exchange (Tool Pingpong or
	// UCPingpong, whose exchange is the same). Its server has one QP: the scenarios run on it one after another, each
	// from the PSN after the last one's, so a scenario that moves the QP
	// to the error state must come last (and ends the server's run).
	Pingpong PingpongSwap
	// RDMACM is perftest's -R: the peer's server runs with -R, and the
	// exchange and the QPs' connections go over rdma_cm (see rdmacm.go).
	// Port is then the server's rdma_cm port.
	RDMACM     bool
	Scenarios  []*Scenario
	Wait       time.Duration // per expected response; 0: DefaultWait
	Gap        time.Duration // least time between packets; 0: DefaultGap
	MaxPackets int           // packet budget of the run; 0: DefaultMaxPackets
	Pcap       *pcaptap.Writer
	Timeout    time.Duration // the whole run; 0: 2 minutes
}

// Responder runs the scenarios against the peer's responder and returns
// the report. Scenarios the peer's tool cannot serve are "not applicable";
// those beyond the peer's QPs are "inconclusive" (not run).
func Responder(ctx context.Context, cfg ResponderConfig) (*Report, error) {
	needs, ok := toolNeeds[cfg.Tool]
	if !ok {
		return nil, fmt.Errorf("probe: tool %q: want write_bw, read_bw, atomic_bw, send_bw, %s or %s", cfg.Tool, Pingpong, UCPingpong)
	}
	chained := isPingpong(cfg.Tool)
	if chained {
		if cfg.Pingpong == nil {
			return nil, fmt.Errorf("probe: %s's exchange (ResponderConfig.Pingpong) is not set", toolName(cfg.Tool))
		}
		cfg.NumQPs = 1
	}
	if !cfg.Peer.IsValid() {
		return nil, fmt.Errorf("probe: no peer address")
	}
	if cfg.NumQPs < 1 || cfg.NumQPs > 1024 {
		return nil, fmt.Errorf("probe: -q %d: the peer's QP count, 1..1024", cfg.NumQPs)
	}
	for _, s := range cfg.Scenarios {
		if s.Requester {
			return nil, fmt.Errorf("probe: scenario %s is a requester-mode scenario", s.Name)
		}
	}
	mtuCode, err := mtuCodeOf(cfg.MTU)
	if err != nil {
		return nil, err
	}
	if cfg.Port == 0 {
		cfg.Port = 18515
	}
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultWait
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()

	rep := &Report{Mode: "responder", Peer: cfg.Peer.String(), Tool: toolName(cfg.Tool), Started: time.Now()}
	// Which scenario gets which QP.
	var runs []*Scenario
	for _, s := range cfg.Scenarios {
		r := Result{Name: s.Name, Rule: s.Rule, Requires: s.Requires}
		switch {
		case s.Needs != needs && (!cfg.AllAccess || receivesOnly(s.Needs) || receivesOnly(needs)):
			r.Verdict, r.Detail = NotApplicable, notServed(s.Needs, cfg.Tool, needs)
		case cfg.RDMACM && s.StartPSN != nil:
			r.Verdict, r.Detail = Inconclusive, "not run: under -R the CM picks the start PSN, and this scenario needs its own"
		case len(runs) >= cfg.NumQPs && !chained:
			r.Verdict, r.Detail = Inconclusive, fmt.Sprintf("not run: the peer has %d QPs (run its server with -q %d)", cfg.NumQPs, cfg.NumQPs+1)
		default:
			runs = append(runs, s)
			continue
		}
		rep.Results = append(rep.Results, r)
	}

	local := cfg.Local
	var conn net.Conn
	if cfg.RDMACM {
		if chained {
			return nil, fmt.Errorf("probe: -R is perftest's; %s has no rdma_cm handshake", toolName(cfg.Tool))
		}
		if !local.IsValid() {
			if local, err = routeSource(cfg.Peer); err != nil {
				return nil, err
			}
		}
	} else {
		var d net.Dialer
		if cfg.Local.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: cfg.Local.AsSlice()}
		}
		addr := net.JoinHostPort(cfg.Peer.String(), strconv.Itoa(cfg.Port))
		conn, err = d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("probe: connecting to the peer's %s server at %s: %w", toolName(cfg.Tool), addr, err)
		}
		defer conn.Close()
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		defer stop()
		if !local.IsValid() {
			local = conn.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		}
	}
	w, err := openWire(local, cfg.Peer, cfg.Gap, cfg.MaxPackets, cfg.Pcap)
	if err != nil {
		return nil, err
	}
	defer w.close()
	var cms *cmSide
	if cfg.RDMACM {
		if cms, err = openCM(ctx, w, cfg.Port, false, nil); err != nil {
			return nil, err
		}
		defer func() {
			if cms != nil {
				cms.close()
			}
		}()
	}

	// The probe's side of each QP: a number of its own choosing (the
	// peer only needs it to address its responses) and a start PSN.
	my := make([]perftest.Dest, cfg.NumQPs)
	gid := local.As16() // IPv4-mapped for IPv4, as rxe's GID
	for i := range my {
		psn := uint32(0x100000+i*0x1111) & bth.PSNMask
		if i < len(runs) && runs[i].StartPSN != nil {
			psn = *runs[i].StartPSN
		}
		my[i] = perftest.Dest{OutReads: 16, QPN: 0x100 + uint32(i), PSN: psn, GID: gid}
	}
	rem := make([]perftest.Dest, cfg.NumQPs)
	var ex *perftest.Exchange
	mtu := 1024
	if chained {
		if cfg.MTU != 0 {
			mtu = cfg.MTU // ibv_rc_pingpong's -m: not exchanged, both sides must say the same
		}
		conn.SetDeadline(deadline)
		r, err := cfg.Pingpong(conn, true, QPRecord{QPN: my[0].QPN, PSN: my[0].PSN, GID: gid})
		if err != nil {
			return nil, err
		}
		rem[0] = perftest.Dest{QPN: r.QPN, PSN: r.PSN, GID: r.GID}
		if err := checkPeerAddrs(rem, cfg.Peer); err != nil {
			return nil, err
		}
	} else {
		if ex, rep.PeerVersion, mtu, err = perftestOpening(cms, conn, true, deadline, mtuCode); err != nil {
			return nil, err
		}
		keys := rem
		if cms != nil {
			// The CM picks the numbers and PSNs; the records that
			// follow carry the peer's rkeys and addresses only.
			if my, rem, err = cms.connect(w, toolTests[cfg.Tool], cfg.NumQPs, mtu); err != nil {
				return nil, err
			}
			if err := checkPeerAddrs(rem, cfg.Peer); err != nil {
				return nil, err
			}
			keys = make([]perftest.Dest, cfg.NumQPs)
		}
		if err := handShakes(ex, cfg.Tool, my, keys, func() error { return checkPeerAddrs(rem, cfg.Peer) }); err != nil {
			return nil, err
		}
		for i := range keys {
			rem[i].RKey, rem[i].VAddr = keys[i].RKey, keys[i].VAddr
		}
	}
	rep.MTU = mtu

	base := my[0].PSN
	for i, s := range runs {
		if !chained {
			base = my[i].PSN
		} else {
			i = 0
		}
		q := &qpRun{s: s, w: w, ctx: ctx, myQPN: my[i].QPN, base: base, mtu: mtu, wait: cfg.Wait, uc: needs == NeedsUC,
			peer: peerQP{QPN: rem[i].QPN, PSN: rem[i].PSN, RKey: rem[i].RKey, VAddr: rem[i].VAddr}}
		v, err := q.run()
		base = (base + uint32(q.next)) & bth.PSNMask // where the next scenario on this QP starts
		r := Result{Name: s.Name, Rule: s.Rule, Requires: s.Requires, Verdict: v, Detail: q.detail,
			Observed: q.got, MyQPN: q.myQPN, PeerQPN: q.peer.QPN, StartPSN: q.base}
		if err != nil {
			r.Detail = err.Error()
		}
		rep.Results = append(rep.Results, r)
		if err != nil && ctx.Err() != nil {
			break
		}
	}
	rep.order(cfg.Scenarios)

	// End the tool's run as its client would: the final synchronisation,
	// the (empty) bandwidth report, and the closing records.
	var endErr error
	switch {
	case chained:
		// ibv_*_pingpong's exchange is over; its server waits for
		// messages until its -n are done or a receive fails.
	case cfg.Tool == "send_bw":
		// ib_send_bw's server ends once it has received all its -n
		// messages per QP, or at its first failed receive (a scenario
		// that moved a QP to the error state flushed its receives):
		// wait a little for that, no longer.
		t := time.AfterFunc(sendBWEndWait, func() {
			if cms != nil {
				cms.stop() // the exchange's SENDs wait on the CM side's context
			} else {
				conn.Close()
			}
		})
		endErr = ex.Close(my[0], nil)
		t.Stop()
		if endErr != nil {
			endErr = fmt.Errorf("%w (ib_send_bw's server ends only once it has received all its messages, or at a failed receive)", endErr)
		}
	default:
		_, endErr = ex.HandShake(my[0])
		if endErr == nil {
			_, endErr = ex.Reports(perftest.Report{})
		}
		if endErr == nil {
			endErr = ex.Close(my[0], nil)
		}
	}
	if cms != nil {
		endErr = errors.Join(endErr, cms.close())
		cms = nil
	}
	if endErr != nil {
		rep.Notes = append(rep.Notes, fmt.Sprintf("ending the peer tool's run: %v", endErr))
	}
	rep.finish(w)
	return rep, nil
}

// perftestOpening runs perftest's opening exchange, over conn or, with
// rdma_cm, over the CM's private data (cms): versions, system data, and
// the path MTU both sides settle on. It returns the exchange for the QP
// records that follow, the peer's perftest version and the MTU in bytes.
// client is perftest's role (the side that connects).
func perftestOpening(cms *cmSide, conn net.Conn, client bool, deadline time.Time, mtuCode int) (*perftest.Exchange, string, int, error) {
	var ex *perftest.Exchange
	if cms != nil {
		ex = cms.cl.Exchange()
	} else {
		ex = perftest.NewExchange(conn, client, deadline)
	}
	if err := ex.Versions(); err != nil {
		return nil, "", 0, err
	}
	if _, _, err := ex.SysData(os.Getpagesize(), 64); err != nil {
		return nil, "", 0, err
	}
	code, err := ex.MTU(mtuCode)
	if err != nil {
		return nil, "", 0, err
	}
	return ex, ex.PeerVersion, 1 << (7 + code), nil
}

// mtuCodeOf is perftest's MTU code (ibv_mtu: 1 for 256 ... 5 for 4096)
// of a path MTU in bytes; 0 means 1024.
func mtuCodeOf(bytes int) (int, error) {
	if bytes == 0 {
		return 3, nil
	}
	for c := 1; c <= 5; c++ {
		if 1<<(7+c) == bytes {
			return c, nil
		}
	}
	return 0, fmt.Errorf("probe: MTU %d: want 256, 512, 1024, 2048 or 4096", bytes)
}

// sendBWEndWait bounds how long the probe waits for ib_send_bw's server
// to end its run.
const sendBWEndWait = 3 * time.Second

// notServed says why a scenario that needs what does not run on tool,
// whose QPs offer has.
func notServed(what Needs, tool string, has Needs) string {
	say := func(n Needs) string {
		switch n {
		case NeedsSend:
			return "receives posted and no remote access"
		case NeedsUC:
			return "an unreliable connected QP with receives posted"
		}
		return "a region that allows " + string(n)
	}
	return fmt.Sprintf("needs %s; %s's QPs offer %s", say(what), toolName(tool), say(has))
}

// QPsNeeded is how many QPs the peer's server (or, for requester-mode
// scenarios, client) of tool must have for the scenarios it can serve
// (with allAccess, every scenario but those that need receives posted).
func QPsNeeded(scens []*Scenario, tool string, allAccess bool) int {
	n, alone := 0, 0
	for _, s := range scens {
		switch {
		case s.Requester && s.RunsAlone():
			if requesterToolNeeds[tool] == s.Needs {
				alone = 1 // one of them, and only when nothing else runs
			}
		case s.Requester:
			if requesterToolNeeds[tool] == s.Needs {
				n++
			}
		case toolNeeds[tool] == s.Needs, allAccess && !receivesOnly(s.Needs) && !receivesOnly(toolNeeds[tool]):
			n++
		}
	}
	if n == 0 {
		return alone
	}
	return n
}
