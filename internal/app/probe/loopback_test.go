package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/e2e/dcqcn"
	"github.com/rxego/rxego/internal/app/perftest"
	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/internal/testenv/testaddr"
	"github.com/rxego/rxego/reth"
	"github.com/rxego/rxego/transport/pcaptap"
)

// probeRxego runs the responder probe with scens against an rxego perf
// server of test on loopback and returns the report, the pcap's records
// and the server's result.
func probeRxego(t *testing.T, test perftest.Test, scens []*Scenario) (*Report, []trace.Record, *perftest.Result) {
	return probeRxegoWith(t, test, scens, false)
}

// probeRxegoWith is probeRxego; rdmacm runs the server and the probe
// with -R (rdma_cm).
func probeRxegoWith(t *testing.T, test perftest.Test, scens []*Scenario, rdmacm bool) (*Report, []trace.Record, *perftest.Result) {
	t.Helper()
	server, local := testaddr.Loopback(), testaddr.Loopback()
	var out bytes.Buffer
	size := 64
	if test == perftest.SendBW {
		size = 2048 // the send scenarios' receives (ib_send_bw -s 2048)
	}
	scfg := perftest.Config{Test: test, Local: server, NumQPs: len(scens), Size: size, Iters: 5,
		Timeout: 60 * time.Second, Out: &out, KeepDevice: true, RDMACM: rdmacm, Port: 18515}
	if !rdmacm {
		ln, err := net.Listen("tcp", netip.AddrPortFrom(server, 0).String())
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		scfg.Listener, scfg.Port = ln, ln.Addr().(*net.TCPAddr).Port
	}
	type ret struct {
		r   *perftest.Result
		err error
	}
	ch := make(chan ret, 1)
	go func() {
		r, err := perftest.Run(context.Background(), scfg)
		ch <- ret{r, err}
	}()
	pcapPath := filepath.Join(t.TempDir(), "probe.pcapng")
	pw, err := pcaptap.Create(pcapPath)
	if err != nil {
		t.Fatal(err)
	}
	tool := map[perftest.Test]string{perftest.WriteBW: "write_bw", perftest.ReadBW: "read_bw", perftest.AtomicBW: "atomic_bw",
		perftest.SendBW: "send_bw"}[test]
	rep, err := Responder(context.Background(), ResponderConfig{Peer: server, Port: scfg.Port, Local: local,
		Tool: tool, NumQPs: len(scens), AllAccess: true, Scenarios: scens, Pcap: pw, Wait: 200 * time.Millisecond,
		RDMACM: rdmacm})
	if cerr := pw.Close(); cerr != nil {
		t.Error(cerr)
	}
	sr := <-ch
	if err != nil {
		t.Fatalf("probe: %v\nserver: %v\n%s", err, sr.err, out.String())
	}
	// rxego's perf server checks that no byte of its buffer changed
	// unless its client wrote it: the scenarios' WRITEs did. A send_bw
	// server ends at the receive send-too-long flushes, as
	// perftest's does.
	if sr.err != nil && !strings.Contains(sr.err.Error(), "data checks failed") && test != perftest.SendBW {
		t.Errorf("the rxego server did not end cleanly: %v\n%s", sr.err, out.String())
	}
	if sr.r != nil && sr.r.Device != nil {
		t.Cleanup(func() { sr.r.Device.Close() })
	}
	var recs []trace.Record
	if err := trace.ReadFile(pcapPath, func(r trace.Record) error {
		recs = append(recs, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return rep, recs, sr.r
}

// udpInCsumErrors reads the host's Udp InCsumErrors (/proc/net/snmp):
// datagrams its UDP layer dropped for a wrong checksum.
func udpInCsumErrors(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "Udp: ")
		if !ok {
			continue
		}
		if names == nil {
			names = strings.Fields(rest)
			continue
		}
		for i, v := range strings.Fields(rest) {
			if i < len(names) && names[i] == "InCsumErrors" {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
	}
	t.Fatal("no Udp InCsumErrors in /proc/net/snmp")
	return 0
}

// fromPeer returns the pcap's packets the peer sent to the scenario's QP.
// (On loopback under -R both ends' QP numbers come from the same
// ranges, so the probe's own packets to the peer's QP can carry the same
// number: the source address tells them apart.)
func fromPeer(recs []trace.Record, rep *Report, res Result) []trace.Record {
	var out []trace.Record
	for _, r := range recs {
		if r.RoCE != nil && r.DestQP == res.MyQPN && r.Src.String() == rep.Peer {
			out = append(out, r)
		}
	}
	return out
}

// relPSNOf is r's PSN relative to the scenario's start PSN.
func relPSNOf(r trace.Record, res Result) int {
	return int((uint32(r.PSN) - res.StartPSN) & bth.PSNMask)
}

// TestResponderAgainstRxego probes rxego's own perf server with every
// built-in scenario and checks each verdict against the capture: the
// packets the report judged are the ones on the wire, and the server's
// engine counters moved as the verdicts say.
func TestResponderAgainstRxego(t *testing.T) {
	scens := Builtin()
	csumBefore := udpInCsumErrors(t)
	rep, recs, srv := probeRxego(t, perftest.WriteBW, scens)
	// bad-udp-checksum's datagram reached the server's host, whose UDP
	// layer dropped it (the ACK that conformed was the resend's).
	if res, ok := rep.Result("bad-udp-checksum"); ok && res.Verdict == Conforms && udpInCsumErrors(t) <= csumBefore {
		t.Errorf("bad-udp-checksum conformed, but the host's Udp InCsumErrors did not rise (%d)", csumBefore)
	}
	var text bytes.Buffer
	rep.WriteText(&text, true)
	t.Logf("%s", text.String())
	if len(rep.Results) != len(scens) {
		t.Fatalf("%d results for %d scenarios", len(rep.Results), len(scens))
	}
	nak := func(code uint8) string { return reth.NAKSyndrome(code).String() }
	ack := "ACK"
	checkCapture(t, rep, recs, map[string][]capturedPkt{
		"write-ack":            {{ack, 0}},
		"psn-gap-nak":          {{nak(reth.NAKPSNSeqError), 0}, {ack, 0}},
		"nak-once":             {{nak(reth.NAKPSNSeqError), 0}},
		"duplicate-write":      {{ack, 0}, {ack, 0}},
		"write-bad-rkey":       {{nak(reth.NAKRemoteAccess), 0}},
		"write-outside-region": {{nak(reth.NAKRemoteAccess), 0}},
		"middle-without-first": {{nak(reth.NAKInvalidRequest), 0}},
		"bad-icrc":             {{ack, 0}},
		"uc-opcode-on-rc":      {{ack, 0}},
		"zero-length-write":    {{ack, 0}},
		"stray-ack":            {{ack, 0}},
		"duplicate-read":       {{"RC_RDMA_READ_RESPONSE_FIRST", 0}, {"RC_RDMA_READ_RESPONSE_LAST", 1}, {"RC_RDMA_READ_RESPONSE_FIRST", 0}, {"RC_RDMA_READ_RESPONSE_LAST", 1}},
	})
	// rxego, like rxe, drops a reserved opcode silently (docs/probe.md).
	if res, _ := rep.Result("reserved-opcode"); res.Verdict != Deviates || len(fromPeer(recs, rep, res)) != 0 {
		t.Errorf("reserved-opcode: %s with %d packets from the peer; rxego drops such packets silently", res.Verdict, len(fromPeer(recs, rep, res)))
	}
	// The psn-wrap scenario's ACK is at PSN 0 on the wire.
	if res, ok := rep.Result("psn-wrap"); ok && res.Verdict == Conforms {
		got := fromPeer(recs, rep, res)
		if len(got) == 0 || got[len(got)-1].PSN != 0 {
			t.Errorf("psn-wrap: the last ACK is not at PSN 0: %v", got)
		}
	}
	// rxego implements DCQCN: the CE-marked WRITE drew a CNP to the
	// probe's QP.
	if res, ok := rep.Result("fecn-cnp"); !ok || res.Verdict != Conforms || !slices.ContainsFunc(fromPeer(recs, rep, res),
		func(r trace.Record) bool { return r.Opcode == bth.CNPOpcode }) {
		t.Errorf("fecn-cnp: %+v: no CNP in the capture", res)
	}
	st := srv.Device.Stats()
	if st.OutOfSeqRequest == 0 {
		t.Errorf("the server counted no sequence error, but psn-gap-nak conformed")
	}
	if st.DuplicateRequest == 0 {
		t.Errorf("the server counted no duplicate request, but duplicate-write conformed")
	}
	if !strings.Contains(rep.Summary, "responder mode") {
		t.Errorf("summary %q", rep.Summary)
	}
	checkRenderings(t, rep)
}

// capturedPkt is one of the peer's packets on a scenario's QP as the
// capture shows it: its AETH syndrome (ACKs) or opcode name, and its PSN
// relative to the scenario's start.
type capturedPkt struct {
	what string
	psn  int
}

// checkCapture checks that every report lists as many packets from the
// peer as the capture holds, and that each scenario in want conformed
// with exactly those packets on the wire.
func checkCapture(t *testing.T, rep *Report, recs []trace.Record, want map[string][]capturedPkt) {
	t.Helper()
	for _, res := range rep.Results {
		got := fromPeer(recs, rep, res)
		if len(got) != len(res.Observed) {
			t.Errorf("%s: the report lists %d packets from the peer, the capture %d", res.Name, len(res.Observed), len(got))
		}
		w, ok := want[res.Name]
		if !ok {
			continue
		}
		if res.Verdict != Conforms {
			t.Errorf("%s: verdict %s (%s), want conforms", res.Name, res.Verdict, res.Detail)
			continue
		}
		var have []capturedPkt
		for _, r := range got {
			what := r.OpcodeName
			if r.Opcode == bth.RCAck {
				what = reth.Syndrome(r.AETH.Syndrome).String()
			}
			have = append(have, capturedPkt{what, relPSNOf(r, res)})
		}
		if len(have) != len(w) {
			t.Errorf("%s: capture shows %v, want %v", res.Name, have, w)
			continue
		}
		for i := range w {
			if have[i].psn != w[i].psn || !strings.HasPrefix(have[i].what, w[i].what) {
				t.Errorf("%s: capture shows %v, want %v", res.Name, have, w)
				break
			}
		}
	}
}

// checkRenderings checks the JSON report carries every verdict and the
// HTML page every scenario, with the ladders embedded.
func checkRenderings(t *testing.T, rep *Report) {
	t.Helper()
	var js, page bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Results) != len(rep.Results) || back.Summary != rep.Summary {
		t.Errorf("JSON round trip: %d results (want %d), summary %q", len(back.Results), len(rep.Results), back.Summary)
	}
	for i, r := range back.Results {
		if r.Verdict != rep.Results[i].Verdict || r.Ladder == "" && len(r.Observed) > 0 {
			t.Errorf("JSON %s: verdict %s, ladder %d bytes", r.Name, r.Verdict, len(r.Ladder))
		}
	}
	if err := rep.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if !strings.Contains(page.String(), "<td>"+r.Name+"</td>") {
			t.Errorf("the HTML page lacks %s", r.Name)
		}
	}
	if !strings.Contains(page.String(), "<iframe srcdoc=\"&lt;!DOCTYPE html&gt;") {
		t.Errorf("the HTML page embeds no ladder page")
	}
}

// TestRequesterAgainstRxego runs the requester-mode scenarios against
// rxego's own ib_write_bw, ib_read_bw and ib_send_bw clients and checks the report
// against the capture: each scenario's impaired packet was sent as often
// as the report says, and go-back-n's resend starts at the probe's NAK.
func TestRequesterAgainstRxego(t *testing.T) {
	for _, c := range []struct {
		test perftest.Test
		tool string
		want map[string]Verdict
	}{
		{perftest.WriteBW, "write_bw", map[string]Verdict{"go-back-n": Conforms, "ack-timeout": Conforms, "rnr-wait": Conforms,
			"ghost-ack": Conforms, "duplicate-ack": Conforms, "ce-ack-cnp": Conforms,
			// rxego, like rxe, takes retry_cnt 7 as unlimited (docs/rnic.md).
			"retry-exhaustion": Deviates, "cnp-rate": Inconclusive /* runs alone: TestCNPRateAgainstRxego */}},
		{perftest.ReadBW, "read_bw", map[string]Verdict{"read-go-back-n": Conforms, "read-timeout": Conforms, "ce-data-cnp": Conforms}},
		// ib_send_bw's client: the same scenarios, on SENDs.
		{perftest.SendBW, "send_bw", map[string]Verdict{"go-back-n": Conforms, "ack-timeout": Conforms, "rnr-wait": Conforms,
			"ghost-ack": Conforms, "duplicate-ack": Conforms, "ce-ack-cnp": Conforms, "retry-exhaustion": Deviates, "cnp-rate": Inconclusive}},
	} {
		t.Run(c.tool, func(t *testing.T) { requesterAgainstRxego(t, c.test, c.tool, c.want, false) })
	}
}

// TestRequesterRDMACMAgainstRxego is TestRequesterAgainstRxego with -R:
// rxego's perf clients connect to the probe with rdma_cm, and the
// scenarios run on the QPs the CM connected.
func TestRequesterRDMACMAgainstRxego(t *testing.T) {
	t.Run("write_bw", func(t *testing.T) {
		requesterAgainstRxego(t, perftest.WriteBW, "write_bw", map[string]Verdict{"go-back-n": Conforms, "ack-timeout": Conforms,
			"rnr-wait": Conforms, "ghost-ack": Conforms, "duplicate-ack": Conforms, "ce-ack-cnp": Conforms, "retry-exhaustion": Deviates,
			"cnp-rate": Inconclusive}, true)
	})
	t.Run("read_bw", func(t *testing.T) {
		requesterAgainstRxego(t, perftest.ReadBW, "read_bw", map[string]Verdict{"read-go-back-n": Conforms, "read-timeout": Conforms,
			"ce-data-cnp": Conforms}, true)
	})
}

// requesterAgainstRxego probes rxego's perf client of test (with -R when
// rdmacm) and checks the verdicts against want and the capture.
func requesterAgainstRxego(t *testing.T, test perftest.Test, tool string, want map[string]Verdict, rdmacm bool) {
	run := requesterRun{test: test, tool: tool, scens: BuiltinRequester(), iters: 20, rdmacm: rdmacm}
	rep, recs := run.probe(t)
	checkRenderings(t, rep)
	var text bytes.Buffer
	rep.WriteText(&text, testing.Verbose())
	t.Logf("%s", text.String())
	for _, res := range rep.Results {
		w, ok := want[res.Name]
		if !ok {
			w = NotApplicable // another tool's scenario
		}
		if res.Verdict != w {
			t.Errorf("%s: %s (%s), want %s", res.Name, res.Verdict, res.Detail, w)
		}
		// The peer's copies of PSN +5 on the wire.
		var copies []trace.Record
		for _, rec := range recs {
			if rec.RoCE != nil && res.MyQPN != 0 && rec.DestQP == res.MyQPN && rec.Src == run.client && relPSNOf(rec, res) == 5 {
				copies = append(copies, rec)
			}
		}
		n := 0
		for _, o := range res.Observed {
			if strings.HasPrefix(o, "psn=+5 sent") || strings.HasPrefix(o, "resent after") {
				n++
			}
		}
		if n != len(copies) {
			t.Errorf("%s: the report counts %d copies of psn=+5, the capture %d", res.Name, n, len(copies))
		}
		if strings.HasSuffix(res.Name, "go-back-n") && res.MyQPN != 0 {
			checkGoBack(t, recs, res, run.probeAddr)
		}
	}
}

// requesterRun is a requester-mode run against rxego's own perf client
// on loopback: its tool, scenarios and iterations per QP; dev, when
// set, is the client's device, open on client.
type requesterRun struct {
	test   perftest.Test
	tool   string
	scens  []*Scenario
	iters  int
	rdmacm bool
	dev    *rxego.Device
	// maxPackets is the probe's budget (0: DefaultMaxPackets).
	maxPackets int

	probeAddr, client netip.Addr // client: set by probe unless dev is
}

// probe runs the probe and the client and returns the report and the
// capture's records.
func (run *requesterRun) probe(t *testing.T) (*Report, []trace.Record) {
	t.Helper()
	test, tool, scens, rdmacm := run.test, run.tool, run.scens, run.rdmacm
	qps := QPsNeeded(scens, tool, false)
	probeAddr, client := testaddr.Loopback(), run.client
	if run.dev == nil {
		client = testaddr.Loopback()
	}
	run.probeAddr, run.client = probeAddr, client
	pcapPath := filepath.Join(t.TempDir(), "probe.pcapng")
	pw, err := pcaptap.Create(pcapPath)
	if err != nil {
		t.Fatal(err)
	}
	listening := make(chan int, 1)
	type ret struct {
		r   *Report
		err error
	}
	ch := make(chan ret, 1)
	go func() {
		r, err := Requester(context.Background(), RequesterConfig{Tool: tool, Peer: client, Local: probeAddr, NumQPs: qps,
			Scenarios: scens, Pcap: pw, Wait: 2 * time.Second, MaxPackets: run.maxPackets, Timeout: 60 * time.Second, RDMACM: rdmacm,
			Listening: func(a net.Addr) {
				if rdmacm {
					listening <- 18515 // rdma_cm's port: the default
					return
				}
				listening <- a.(*net.TCPAddr).Port
			}})
		ch <- ret{r, err}
	}()
	var port int
	select {
	case port = <-listening:
	case r := <-ch:
		t.Fatalf("the probe did not listen: %v", r.err)
	}
	var out bytes.Buffer
	_, cerr := perftest.Run(context.Background(), perftest.Config{Test: test, Server: probeAddr.String(), Port: port,
		Local: client, NumQPs: qps, Size: 64, Iters: run.iters, Timeout: 60 * time.Second, Out: &out, RDMACM: rdmacm,
		Device: run.dev})
	r := <-ch
	if err := pw.Close(); err != nil {
		t.Error(err)
	}
	if r.err != nil {
		t.Fatalf("probe: %v\nclient: %v\n%s", r.err, cerr, out.String())
	}
	// The probe's READ responses are zeros, not the pattern rxego's
	// client checks for.
	if cerr != nil && !(test == perftest.ReadBW && strings.Contains(cerr.Error(), "data checks failed")) {
		t.Errorf("rxego's client did not end cleanly: %v\n%s", cerr, out.String())
	}
	var recs []trace.Record
	if err := trace.ReadFile(pcapPath, func(r trace.Record) error {
		recs = append(recs, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return r.r, recs
}

// checkGoBack checks in the capture that the probe NAKed PSN +5 and that
// the first packet the peer resent afterwards was PSN +5.
func checkGoBack(t *testing.T, recs []trace.Record, res Result, probeAddr netip.Addr) {
	t.Helper()
	// The reader and the sender write the capture concurrently: order by
	// time stamp, which each side takes before it records.
	recs = slices.Clone(recs)
	slices.SortStableFunc(recs, func(a, b trace.Record) int { return a.Time.Compare(b.Time) })
	nakAt, high := -1, -1
	for i, r := range recs {
		if r.RoCE == nil {
			continue
		}
		if nakAt < 0 && r.Src == probeAddr && r.DestQP == res.PeerQPN && r.AETH != nil &&
			reth.Syndrome(r.AETH.Syndrome) == reth.NAKSyndrome(reth.NAKPSNSeqError) {
			if relPSNOf(r, res) != 5 {
				t.Errorf("go-back-n: the probe NAKed psn=+%d, want +5", relPSNOf(r, res))
			}
			nakAt = i
			continue
		}
		if r.Src == probeAddr || r.DestQP != res.MyQPN {
			continue
		}
		rel := relPSNOf(r, res)
		if nakAt < 0 || rel > high {
			high = max(high, rel)
			continue
		}
		if rel != 5 {
			t.Errorf("go-back-n: the capture's first resend is psn=+%d, want +5", rel)
		}
		return
	}
	t.Errorf("go-back-n: no NAK (at %d) or no resend in the capture", nakAt)
}

// TestSendScenariosAgainstRxego probes rxego's own ib_send_bw server (its
// receives posted, 2048 bytes each) with the send scenarios and checks
// the verdicts against the capture and the server's counters.
func TestSendScenariosAgainstRxego(t *testing.T) {
	var scens []*Scenario
	for _, s := range Builtin() {
		if s.Needs == NeedsSend {
			scens = append(scens, s)
		}
	}
	if len(scens) < 4 {
		t.Fatalf("%d send scenarios", len(scens))
	}
	rep, recs, srv := probeRxego(t, perftest.SendBW, scens)
	var text bytes.Buffer
	rep.WriteText(&text, true)
	t.Logf("%s", text.String())
	ack, nakSeq := reth.ACKSyndrome(reth.CreditsInvalid).String(), reth.NAKSyndrome(reth.NAKPSNSeqError).String()
	// rxego NAKs a SEND longer than its receive with a remote
	// operational error, as rxe's copy_data failure does (qp.recvFault).
	nakRop := reth.NAKSyndrome(reth.NAKRemoteOp).String()
	// The last packet the peer sent on each scenario's QP, as the
	// verdict says it was.
	want := map[string]struct {
		syn string
		psn int
	}{
		"send-ack":          {ack, 0},
		"send-multi-packet": {ack, 1},
		"send-psn-gap":      {ack, 0},
		"send-too-long":     {nakRop, 2},
	}
	for _, res := range rep.Results {
		if res.Verdict != Conforms {
			t.Errorf("%s: %s (%s), want conforms", res.Name, res.Verdict, res.Detail)
			continue
		}
		got := fromPeer(recs, rep, res)
		if len(got) == 0 || len(got) != len(res.Observed) {
			t.Errorf("%s: the capture has %d packets from the peer, the report %d", res.Name, len(got), len(res.Observed))
			continue
		}
		last := got[len(got)-1]
		w := want[res.Name]
		if last.AETH == nil || !strings.HasPrefix(reth.Syndrome(last.AETH.Syndrome).String(), w.syn) || relPSNOf(last, res) > w.psn {
			t.Errorf("%s: the peer's last packet is %s psn=+%d, want %s at psn<=+%d", res.Name, last.OpcodeName, relPSNOf(last, res), w.syn, w.psn)
		}
		if res.Name == "send-psn-gap" && (got[0].AETH == nil || reth.Syndrome(got[0].AETH.Syndrome).String() != nakSeq) {
			t.Errorf("send-psn-gap: the peer's first packet is %s, want %s", got[0].OpcodeName, nakSeq)
		}
	}
	if st := srv.Device.Stats(); st.OutOfSeqRequest == 0 {
		t.Errorf("the server counted no sequence error, but send-psn-gap conformed")
	}
}

// TestResponderRDMACMAgainstRxego rides rxego's own `perf -R` server: the
// exchange and the QPs' connections go over rdma_cm on the device that
// shares the probe's port, and the scenarios then run on the QPs the CM
// connected, with the PSNs it agreed. The capture must show the CM's
// MADs (QP 1) and the verdicts' packets on the claimed QPs; a scenario
// that needs its own start PSN is not run.
func TestResponderRDMACMAgainstRxego(t *testing.T) {
	var scens []*Scenario
	for _, s := range Builtin() {
		switch s.Name {
		case "write-ack", "psn-gap-nak", "duplicate-write", "write-bad-rkey", "duplicate-read", "psn-wrap":
			scens = append(scens, s)
		}
	}
	rep, recs, srv := probeRxegoWith(t, perftest.WriteBW, scens, true)
	var text bytes.Buffer
	rep.WriteText(&text, false)
	t.Logf("%s", text.String())
	if len(rep.Results) != len(scens) {
		t.Fatalf("%d results for %d scenarios", len(rep.Results), len(scens))
	}
	nak := func(code uint8) string { return reth.NAKSyndrome(code).String() }
	checkCapture(t, rep, recs, map[string][]capturedPkt{
		"write-ack":       {{"ACK", 0}},
		"psn-gap-nak":     {{nak(reth.NAKPSNSeqError), 0}, {"ACK", 0}},
		"duplicate-write": {{"ACK", 0}, {"ACK", 0}},
		"write-bad-rkey":  {{nak(reth.NAKRemoteAccess), 0}},
		"duplicate-read":  {{"RC_RDMA_READ_RESPONSE_FIRST", 0}, {"RC_RDMA_READ_RESPONSE_LAST", 1}, {"RC_RDMA_READ_RESPONSE_FIRST", 0}, {"RC_RDMA_READ_RESPONSE_LAST", 1}},
	})
	if res, _ := rep.Result("psn-wrap"); res.Verdict != Inconclusive || !strings.Contains(res.Detail, "-R") {
		t.Errorf("psn-wrap under -R: %s (%s), want inconclusive: the CM picks the start PSN", res.Verdict, res.Detail)
	}
	mads := 0
	for _, r := range recs {
		if r.RoCE != nil && r.DestQP == 1 {
			mads++
		}
	}
	// REQ, REP, RTU for the comm QP and each data QP, and the DREQs and
	// DREPs at the end.
	if want := 3 * (1 + len(scens) - 1); mads < want {
		t.Errorf("the capture holds %d CM MADs, want at least %d", mads, want)
	}
	// The scenarios' QPs are the ones the server's CM connected: its
	// engine saw the sequence error and the duplicate.
	st := srv.Device.Stats()
	if st.OutOfSeqRequest == 0 || st.DuplicateRequest == 0 {
		t.Errorf("the server counted %d sequence errors and %d duplicates; psn-gap-nak and duplicate-write conformed",
			st.OutOfSeqRequest, st.DuplicateRequest)
	}
}

// TestCNPRateAgainstRxego runs cnp-rate against rxego's own ib_write_bw
// client, alone and with a long stream. With DCQCN on, with the
// parameters of rxego's end-to-end DCQCN runs (e2e/dcqcn.MarkerParams,
// its clocks stretched to a software loop), its reaction point cuts the
// QP's rate at every CNP and the scenario conforms; with congestion
// control off the client has no reaction point, keeps its pace and the
// scenario is not applicable. The CNPs come 1 ms apart (100 of them; a
// 20 ms window): a Go timer's pace, so that the probe's sender sleeps
// between them instead of spinning on a CPU the client needs (the
// built-in's 50 us train does, see scenarios/requester.txt). Each
// verdict is checked against the capture: the CNPs the probe sent and the
// client's device received, and the client's packets in the two windows.
func TestCNPRateAgainstRxego(t *testing.T) {
	dcqcnOn := dcqcn.MarkerParams(dcqcn.LineRate)
	for _, c := range []struct {
		name string
		cc   *rxego.CongestionConfig
		want Verdict
	}{
		{"dcqcn", &dcqcnOn, Conforms},
		{"no-reaction-point", &rxego.CongestionConfig{Off: true}, NotApplicable},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := builtinRequester(t, "cnp-rate")
			const cnps, every, window = 150, time.Millisecond, 50 * time.Millisecond
			for i := range s.Steps {
				switch st := &s.Steps[i]; {
				case st.Kind == StepImpair:
					*st.Count, st.Every = cnps, every
				case st.Kind == StepExpect:
					st.Window = window
				}
			}
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
			// An inconclusive run (a loaded host stalled the client in a
			// window, or lost its packets) measured nothing: run again.
			// So does one whose verdict is not the one wanted: under CI's
			// load the client without a reaction point once slowed to
			// less than half its pace between the two windows (ci63,
			// session 17: 18.3 then 8.0 packets/ms) and read as
			// conforming. Three tries that all disagree still fail.
			for try := 1; ; try++ {
				client := testaddr.Loopback()
				dev, err := rxego.Open(netip.AddrPortFrom(client, rxego.DefaultPort).String(), &rxego.Options{Congestion: c.cc})
				if err != nil {
					t.Fatal(err)
				}
				// 40000 messages outlast the train even at rxego's full
				// pace on loopback. The probe ACKs them coalesced, one ACK
				// per 32 at full pace but one per burst of a paced client,
				// and after the train's cut bursts are short: a budget of
				// 6000 ran out after 29600 messages under CI's load (ci89,
				// session 23) and the client, unanswered, failed. Room for
				// an ACK per message and the CNPs: bounded still.
				const iters = 40000
				run := requesterRun{test: perftest.WriteBW, tool: "write_bw", scens: []*Scenario{s}, iters: iters, dev: dev, client: client,
					maxPackets: iters + cnps + 100}
				rep, recs := run.probe(t)
				res, _ := rep.Result("cnp-rate")
				received := dev.Stats().CNPsReceived
				dev.Close()
				t.Logf("try %d: %s (%s): %q %v", try, res.Verdict, res.Detail, res.Observed, rep.Notes)
				if res.Verdict != c.want && try < 3 {
					continue
				}
				if res.Verdict != c.want {
					t.Errorf("cnp-rate: %s (%s), want %s", res.Verdict, res.Detail, c.want)
				}
				checkCNPRate(t, recs, res, run, cnps, window, received)
				return
			}
		})
	}
}

// checkCNPRate checks a cnp-rate verdict against the capture: the probe
// sent cnps CNPs to the peer's QP and the peer's device received them,
// and the peer's packets in the window before the first CNP and in the
// one up to the last show the slow-down the verdict says (or its absence).
func checkCNPRate(t *testing.T, recs []trace.Record, res Result, run requesterRun, cnps int, window time.Duration, received uint64) {
	t.Helper()
	var sent []time.Time
	for _, r := range recs {
		if r.RoCE != nil && r.Src == run.probeAddr && r.DestQP == res.PeerQPN && r.Opcode == bth.CNPOpcode {
			sent = append(sent, r.Time)
		}
	}
	if len(sent) != cnps || received != uint64(cnps) {
		t.Fatalf("the capture holds %d CNPs to the peer's QP, its device received %d; want %d", len(sent), received, cnps)
	}
	slices.SortFunc(sent, time.Time.Compare)
	count := func(from, to time.Time) int {
		n := 0
		for _, r := range recs {
			if r.RoCE != nil && r.Src == run.client && r.DestQP == res.MyQPN && !r.Time.Before(from) && r.Time.Before(to) {
				n++
			}
		}
		return n
	}
	first, last := sent[0], sent[len(sent)-1]
	before, after := count(first.Add(-window), first), count(last.Add(-window), last)
	t.Logf("the capture: %d packets in the %v before the first CNP, %d in the %v up to the last", before, window, after, window)
	// The capture's stamps are the ones the probe judged by (to the
	// microsecond in the file): the counts agree but for a packet or two
	// at a window's edge.
	if before < minRatePackets {
		t.Fatalf("the capture shows %d packets before the first CNP: too few to judge", before)
	}
	slowed := after*slowdownFactor <= before
	if near := abs(after*slowdownFactor-before) <= 2*slowdownFactor; !near && slowed != (res.Verdict == Conforms) {
		t.Errorf("the capture shows %d packets before the CNPs and %d at their end, but the verdict is %s", before, after, res.Verdict)
	}
}

// abs is |x|.
func abs(x int) int { return max(x, -x) }
