package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/rxego/rxego/cmd/rxego/internal/pingpong"
	"github.com/rxego/rxego/internal/app/probe"
	"github.com/rxego/rxego/transport/pcaptap"
)

func init() {
	register("probe", "a protocol report of any RoCEv2 device, from outside: scripted packets on the QPs of a C tool the peer runs, a verdict per IBTA rule", runProbe)
}

// runProbe is `rxego probe`.
func runProbe(args []string) error { return probeTo(os.Stdout, args) }

// probeFlags are the flags of `rxego probe`.
type probeFlags struct {
	mode, tool, local, scenarios, only, html, pcap string
	qps, port, mtu, maxPackets, ackTimeout         int
	json, ladder, list, allAccess, rdmacm          bool
	wait, gap, timeout                             time.Duration
}

// probeUsage is the head of `rxego probe -h`.
const probeUsage = `usage: rxego probe [flags] PEER
       rxego probe --mode requester -x LOCAL [flags] PEER

Probes the RoCEv2 device at PEER from outside and reports, rule by rule
(IBTA Vol. 1 chapter 9, Annex A17), how it behaves. Nothing is installed
on the peer: it runs an unmodified C tool.

Responder mode (the default) probes the peer's responder: the peer runs a
perftest server, and the probe does that tool's client handshake, then,
instead of the tool's traffic, sends scripted packets on the QPs the
handshake gave it, one scenario per QP, and judges what comes back.

  peer$ ib_write_bw -d rxe0 -x 1 -q 26          # QPs for the write scenarios
  here$ rxego probe -q 26 PEER
  peer$ ib_read_bw -d rxe0 -x 1 -q 4
  here$ rxego probe --tool read_bw -q 4 PEER
  peer$ ib_atomic_bw -d rxe0 -x 1 -q 3
  here$ rxego probe --tool atomic_bw -q 3 PEER
  peer$ ib_send_bw -d rxe0 -x 1 -q 4 -s 2048     # receives of 2048 bytes
  here$ rxego probe --tool send_bw -q 4 PEER
  peer$ ibv_rc_pingpong -d rxe0 -g 1 -s 2048     # one QP: the send scenarios in turn
  here$ rxego probe --tool rc_pingpong PEER
  peer$ ibv_uc_pingpong -d rxe0 -g 1 -s 2048     # UC: its silent drops
  here$ rxego probe --tool uc_pingpong PEER
  peer$ ib_write_bw -d rxe0 -R -q 26             # -R: rdma_cm's handshake
  here$ rxego probe -R -q 26 PEER

-q must be the peer's -q: the exchange carries one record per QP. Each
tool registers its memory for its own operation only, so a run judges the
scenarios that tool allows and reports the others "not applicable".
--list prints the scenarios and how many QPs each tool needs.

Requester mode probes the peer's requester: the probe is the ib_write_bw
(ib_send_bw, ib_read_bw) server, the peer its client (one packet per message,
enough of them); the probe answers normally but mistreats PSN +5 of each
QP as that QP's scenario says (drops it, withholds or forges ACKs,
RNR-NAKs it, marks the ACK or the READ response CE) and times how the
peer reacts:

  here$ rxego probe --mode requester -x LOCAL -q 7 PEER
  peer$ ib_write_bw -d rxe0 -x 1 -q 7 -s 64 -n 20 LOCAL
  here$ rxego probe --mode requester --tool read_bw -x LOCAL -q 3 PEER
  peer$ ib_read_bw -d rxe0 -x 1 -q 3 -s 64 -n 20 LOCAL
  here$ rxego probe --mode requester --tool send_bw -x LOCAL -q 7 PEER
  peer$ ib_send_bw -d rxe0 -x 1 -q 7 -s 64 -n 20 LOCAL
  here$ rxego probe --mode requester --tool rc_pingpong --only ack-timeout -x LOCAL PEER
  peer$ ibv_rc_pingpong -d rxe0 -g 1 -s 64 -n 20 LOCAL   # one QP: one scenario
  here$ rxego probe --mode requester -R -x LOCAL -q 7 PEER
  peer$ ib_write_bw -d rxe0 -R -q 7 -s 64 -n 20 LOCAL

cnp-rate (the peer's rate after CNPs: does its requester slow down, as an
Annex A17 reaction point does?) runs alone, with a long stream:

  here$ rxego probe --mode requester --only cnp-rate -q 1 --max-packets 4000 -x LOCAL PEER
  peer$ ib_write_bw -d rxe0 -x 1 -q 1 -s 64 -n 20000 LOCAL

The probe acknowledges that QP's packets one ACK per 32 (or once the
peer paused for 1 ms), so the peer runs at its own pace; 100 ms after +5 it
sends its QP 1000 CNPs, 50 us apart (they fill the gaps between the
ACKs), then compares the peer's packet rate in the 20 ms before the first
CNP with the 20 ms up to the last. The probe's sender spins on a CPU
through both (70 to 90 ms, sending nothing in the first window): on a
host shared with the peer the spinning and the CNPs can slow the peer by
themselves; run the probe on another host where you can.

With -R the CM's MADs and the exchange's SENDs run on an rxego device
that shares the probe's port 4791; the scenarios run on the QPs the CM
connected, with the PSNs it agreed (scenarios that need their own start
PSN are not run).

Safe by construction: the probe sends only to PEER (it refuses a
handshake whose QPs are elsewhere), only on the QPs the handshake gave
it, from its own UDP port 4791 on the local address, at most
--max-packets packets in the whole run, at least --gap apart (cnp-rate's
1000 CNPs and its ACKs included: -n 20000 needs about 1650, more when the
peer sends in bursts). Scenarios
that put a QP in the error state use a QP of their own; the peer's tool
ends normally afterwards (its bandwidth report shows zeros); ib_send_bw's
server ends at the failed receive of the send-too-long scenario.

flags:
`

// probeTo is runProbe writing to out.
func probeTo(out io.Writer, args []string) error {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	var f probeFlags
	fs.StringVar(&f.mode, "mode", "responder", "which side of the peer to probe: responder (it runs a server) or requester (it runs ib_write_bw's, ib_send_bw's or ib_read_bw's client)")
	fs.StringVar(&f.tool, "tool", "write_bw", "the tool the peer runs: write_bw, read_bw, atomic_bw, send_bw, rc_pingpong or uc_pingpong (its server); requester mode: write_bw, send_bw, read_bw or rc_pingpong (its client)")
	fs.IntVar(&f.ackTimeout, "u", 0, "requester mode: the peer's QP ACK timeout exponent (its -u): T = 4.096 us x 2^u (default 14; with -R the one the peer's CM REQ announces)")
	fs.BoolVar(&f.rdmacm, "R", false, "the peer's tool runs with -R: the exchange and the QPs' connections go over rdma_cm (-p is then the rdma_cm port); IPv4 only")
	fs.IntVar(&f.qps, "q", 0, "the QPs of the peer's server (its -q); default: as many as the tool's scenarios need")
	fs.IntVar(&f.port, "p", 18515, "the peer tool's TCP port (its -p)")
	fs.StringVar(&f.local, "x", "", "local RoCE address (the probe binds it, UDP port 4791); default in responder mode: the exchange's local address")
	fs.IntVar(&f.mtu, "m", 1024, "path MTU to offer, bytes (the smaller of both sides is used)")
	fs.StringVar(&f.scenarios, "scenarios", "", "read the scenarios from this file instead of the built-in ones (format: docs/probe.md)")
	fs.StringVar(&f.only, "only", "", "run only these scenarios (comma-separated names)")
	fs.BoolVar(&f.list, "list", false, "list the scenarios and exit")
	fs.BoolVar(&f.json, "json", false, "print the report as JSON")
	fs.BoolVar(&f.ladder, "ladder", false, "draw each scenario's ladder in the text report")
	fs.StringVar(&f.html, "html", "", "write the report as a self-contained HTML page (verdicts and ladders) to this file")
	fs.StringVar(&f.pcap, "pcap", "", "write every packet of the run to this pcapng file")
	fs.DurationVar(&f.wait, "wait", 0, "responder mode: how long to wait for each expected response and to hear silence (default 300ms); requester mode: how long the peer may stay silent before the run ends (default 2s)")
	fs.DurationVar(&f.gap, "gap", 0, "least time between two packets the probe sends (default 1ms; requester mode 50us: its ACKs must keep up)")
	fs.IntVar(&f.maxPackets, "max-packets", probe.DefaultMaxPackets, "most packets the run may send")
	fs.BoolVar(&f.allAccess, "all-access", false, "the peer's memory allows every operation whatever the tool (rxego perf's does)")
	fs.DurationVar(&f.timeout, "timeout", 2*time.Minute, "give up after this long")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), probeUsage)
		printFlags(fs)
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if f.mode != "responder" && f.mode != "requester" {
		return usageErrorf("--mode %q: want responder or requester", f.mode)
	}
	scens, err := loadScenarios(f.scenarios, f.only, f.mode == "requester")
	if err != nil {
		return err
	}
	if f.list {
		return listScenarios(out, scens)
	}
	if len(pos) != 1 {
		return usageErrorf("need the peer's address")
	}
	peer, err := netip.ParseAddr(pos[0])
	if err != nil {
		return usageErrorf("peer %q: want an IP address", pos[0])
	}
	if f.mode == "requester" {
		return probeRequester(out, peer.Unmap(), scens, &f)
	}
	cfg := probe.ResponderConfig{Peer: peer.Unmap(), Port: f.port, Tool: f.tool, NumQPs: f.qps, MTU: f.mtu,
		AllAccess: f.allAccess, Scenarios: scens, Wait: f.wait, Gap: f.gap, MaxPackets: f.maxPackets, Timeout: f.timeout,
		Pingpong: pingpongSwap, RDMACM: f.rdmacm}
	if cfg.NumQPs == 0 {
		cfg.NumQPs = max(1, probe.QPsNeeded(scens, f.tool, f.allAccess))
	}
	if f.local != "" {
		if cfg.Local, err = netip.ParseAddr(f.local); err != nil {
			return usageErrorf("-x %q: want an IP address", f.local)
		}
	}
	if cfg.Pcap, err = createPcap(f.pcap); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := probe.Responder(ctx, cfg)
	return finishProbe(out, rep, err, cfg.Pcap, &f)
}

// probeRequester is requester mode: the probe serves the peer's
// ib_write_bw, ib_send_bw or ib_read_bw client.
func probeRequester(out io.Writer, peer netip.Addr, scens []*probe.Scenario, f *probeFlags) error {
	if f.local == "" {
		return usageErrorf("requester mode needs -x LOCAL: the address the peer's client connects to")
	}
	local, err := netip.ParseAddr(f.local)
	if err != nil {
		return usageErrorf("-x %q: want an IP address", f.local)
	}
	if f.ackTimeout != 0 {
		if err := inRange("u", int64(f.ackTimeout), 1, 31); err != nil {
			return err
		}
	}
	cfg := probe.RequesterConfig{Tool: f.tool, Peer: peer, Port: f.port, Local: local, NumQPs: f.qps, MTU: f.mtu, ACKTimeout: uint8(f.ackTimeout),
		Scenarios: scens, Wait: f.wait, Gap: f.gap, MaxPackets: f.maxPackets, Timeout: f.timeout, Pingpong: pingpongSwap, RDMACM: f.rdmacm,
		Listening: func(a net.Addr) {
			fmt.Fprintf(os.Stderr, "rxego probe: waiting for the peer's %s client on %v\n", f.tool, a)
		}}
	if cfg.NumQPs == 0 {
		cfg.NumQPs = max(1, probe.QPsNeeded(scens, f.tool, false))
	}
	if cfg.Pcap, err = createPcap(f.pcap); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := probe.Requester(ctx, cfg)
	return finishProbe(out, rep, err, cfg.Pcap, f)
}

// pingpongSwap is ibv_rc_pingpong's exchange of one QP record, for the
// probe (which cannot import this command's pingpong package).
func pingpongSwap(c net.Conn, client bool, mine probe.QPRecord) (probe.QPRecord, error) {
	d, err := pingpong.SwapRecord(c, client, pingpong.Dest{QPN: mine.QPN, PSN: mine.PSN, GID: mine.GID})
	return probe.QPRecord{QPN: d.QPN, PSN: d.PSN, GID: d.GID}, err
}

// createPcap opens the --pcap file, if any.
func createPcap(path string) (*pcaptap.Writer, error) {
	if path == "" {
		return nil, nil
	}
	return pcaptap.Create(path)
}

// finishProbe closes the pcap and prints the report of a run that ended
// with err.
func finishProbe(out io.Writer, rep *probe.Report, err error, pcap *pcaptap.Writer, f *probeFlags) error {
	if pcap != nil {
		if cerr := pcap.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}
	if err != nil {
		return err
	}
	return writeProbeReport(out, rep, f)
}

// loadScenarios returns the built-in scenarios or those of file, keeping
// only the names in only (when set).
func loadScenarios(file, only string, requester bool) ([]*probe.Scenario, error) {
	scens := probe.Builtin()
	if requester {
		scens = probe.BuiltinRequester()
	}
	if file != "" {
		fh, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		defer fh.Close()
		if scens, err = probe.ParseScenarios(fh); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		var mode []*probe.Scenario
		for _, s := range scens {
			if s.Requester == requester {
				mode = append(mode, s)
			}
		}
		if len(mode) == 0 {
			return nil, fmt.Errorf("%s: no scenario for this mode (requester-mode scenarios say \"mode requester\")", file)
		}
		scens = mode
	}
	if only == "" {
		return scens, nil
	}
	var out []*probe.Scenario
	for _, name := range strings.Split(only, ",") {
		i := -1
		for j, s := range scens {
			if s.Name == name {
				i = j
			}
		}
		if i < 0 {
			return nil, usageErrorf("--only: no scenario %q (see --list)", name)
		}
		out = append(out, scens[i])
	}
	return out, nil
}

// listScenarios prints each scenario's name, what it needs and its rule,
// and the QPs each tool's server needs.
func listScenarios(out io.Writer, scens []*probe.Scenario) error {
	w := bufio.NewWriter(out)
	for _, s := range scens {
		fmt.Fprintf(w, "%-22s %-7s %s\n%22s         %s\n", s.Name, s.Needs, s.Rule, "", s.Requires)
	}
	if len(scens) > 0 && scens[0].Requester {
		fmt.Fprintln(w)
		for _, tool := range []string{"write_bw", "send_bw", "read_bw"} {
			fmt.Fprintf(w, "ib_%s client: -q %d -s 64 -n 20\n", tool, probe.QPsNeeded(scens, tool, false))
		}
		for _, s := range scens {
			if s.RunsAlone() {
				fmt.Fprintf(w, "%s runs alone: --only %s -q 1, the ib_write_bw or ib_send_bw client with -q 1 -s 64 -n 20000\n", s.Name, s.Name)
			}
		}
		return w.Flush()
	}
	fmt.Fprintln(w)
	for _, tool := range []string{"write_bw", "read_bw", "atomic_bw", "send_bw"} {
		extra := ""
		if tool == "send_bw" {
			extra = " -s 2048"
		}
		fmt.Fprintf(w, "ib_%s: -q %d%s\n", tool, probe.QPsNeeded(scens, tool, false), extra)
	}
	return w.Flush()
}

// writeProbeReport prints the report as the flags ask.
func writeProbeReport(out io.Writer, rep *probe.Report, f *probeFlags) error {
	if f.html != "" {
		fh, err := os.Create(f.html)
		if err != nil {
			return err
		}
		err = rep.WriteHTML(fh)
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "rxego probe: wrote %s\n", f.html)
	}
	if f.json {
		return rep.WriteJSON(out)
	}
	return rep.WriteText(out, f.ladder)
}
