package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/cmd/rxego/internal/pingpong"
	"github.com/rxego/rxego/internal/app/perftest"
	"github.com/rxego/rxego/internal/app/probe"
	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// TestProbeUsage: the help says what the probe promises; bad command
// lines are usage errors that say what is wrong.
func TestProbeUsage(t *testing.T) {
	out, _, code := rxegoCmd(t, "probe", "-h")
	if code != 0 || !strings.Contains(out, "Safe by construction") || !strings.Contains(out, "--max-packets") {
		t.Errorf("probe -h: code %d\n%s", code, out)
	}
	out, _, code = rxegoCmd(t, "probe", "--list")
	if code != 0 || !strings.Contains(out, "ib_write_bw: -q 26") || !strings.Contains(out, "psn-gap-nak") {
		t.Errorf("probe --list: code %d\n%s", code, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"probe"}, "need the peer's address"},
		{[]string{"probe", "nowhere"}, "want an IP address"},
		{[]string{"probe", "--mode", "sideways", "127.0.0.1"}, "want responder or requester"},
		{[]string{"probe", "--mode", "requester", "127.0.0.1"}, "requester mode needs -x LOCAL"},
		{[]string{"probe", "--only", "no-such", "127.0.0.1"}, "no scenario \"no-such\""},
	} {
		_, errOut, code := rxegoCmd(t, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: code %d, stderr %q; want 2 and %q", c.args, code, errOut, c.want)
		}
	}
}

// TestProbeCommand runs `rxego probe` against an rxego ib_write_bw server
// on loopback with three scenarios and every output: the JSON verdicts,
// the HTML page and the pcap, whose packets are the report's.
func TestProbeCommand(t *testing.T) {
	server, local := testaddr.Loopback(), testaddr.Loopback()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(server, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	srv := make(chan error, 1)
	go func() {
		_, err := perftest.Run(context.Background(), perftest.Config{Test: perftest.WriteBW, Local: server, Listener: ln,
			Port: port, NumQPs: 3, Size: 64, Iters: 5, Timeout: 30 * time.Second, Out: io.Discard})
		srv <- err
	}()
	dir := t.TempDir()
	html, pcap := filepath.Join(dir, "probe.html"), filepath.Join(dir, "probe.pcapng")
	out, errOut, code := rxegoCmd(t, "probe", "-q", "3", "-p", strconv.Itoa(port), "-x", local.String(), "--only",
		"write-ack,psn-gap-nak,reserved-opcode", "--json", "--html", html, "--pcap", pcap, server.String())
	<-srv
	if code != 0 {
		t.Fatalf("code %d\n%s\n%s", code, out, errOut)
	}
	var rep probe.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := map[string]probe.Verdict{"write-ack": probe.Conforms, "psn-gap-nak": probe.Conforms, "reserved-opcode": probe.Deviates}
	fromPeer := 0
	for _, r := range rep.Results {
		if r.Verdict != want[r.Name] {
			t.Errorf("%s: %s (%s), want %s", r.Name, r.Verdict, r.Detail, want[r.Name])
		}
		fromPeer += len(r.Observed)
	}
	page, err := os.ReadFile(html)
	if err != nil || !strings.Contains(string(page), "psn-gap-nak") {
		t.Errorf("HTML page: %v", err)
	}
	n, m := 0, 0
	if err := trace.ReadFile(pcap, func(r trace.Record) error {
		if r.Src == server {
			n++
		} else {
			m++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != fromPeer || m != rep.Sent {
		t.Errorf("pcap: %d packets from the peer (report: %d), %d from the probe (report: %d)", n, fromPeer, m, rep.Sent)
	}
}

// probePingpongServer runs `rxego probe --tool KIND_pingpong` (--json,
// --pcap) against rxego's own ibv_*_pingpong server of kind, which takes
// iters messages, and returns the report, the capture's path and how the
// server's run ended.
func probePingpongServer(t *testing.T, kind pingpong.Kind, server, local netip.Addr, iters int) (probe.Report, string, error) {
	t.Helper()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(server, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	srv := make(chan error, 1)
	go func() {
		_, err := pingpong.Run(context.Background(), pingpong.Config{Kind: kind, Local: server, Listener: ln,
			TCPPort: port, Size: 2048, Iters: iters, Timeout: 30 * time.Second, Out: io.Discard})
		// A server that failed before accepting leaves the probe's
		// connection in the listener's queue, where the probe would wait
		// for the server's record until its own timeout: closing the
		// listener resets it, so the run ends now and says why.
		ln.Close()
		srv <- err
	}()
	pcap := filepath.Join(t.TempDir(), "probe.pcapng")
	// --wait 1s: the server's answer, the only sign of a UC delivery,
	// must not be judged missing because a loaded host was slow.
	out, errOut, code := rxegoCmd(t, "probe", "--tool", string(kind)+"_pingpong", "-p", strconv.Itoa(port), "-x", local.String(),
		"--wait", "1s", "--json", "--pcap", pcap, server.String())
	if code != 0 {
		t.Fatalf("code %d (the server: %v)\n%s\n%s", code, <-srv, out, errOut)
	}
	var rep probe.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return rep, pcap, <-srv
}

// TestProbeUCPingpongResponder runs `rxego probe --tool uc_pingpong`
// against rxego's own ibv_uc_pingpong server (which takes 4 messages):
// the UC scenarios conform, the capture shows no ACK or NAK from the
// server, only its answers, one per delivered message, and the server
// ends cleanly once the 4 messages the scenarios deliver came.
func TestProbeUCPingpongResponder(t *testing.T) {
	server, local := testaddr.Loopback(), testaddr.Loopback()
	rep, pcap, srvErr := probePingpongServer(t, pingpong.UC, server, local, 4)
	ran := 0
	for _, r := range rep.Results {
		if r.MyQPN == 0 {
			continue
		}
		ran++
		if r.Verdict != probe.Conforms {
			t.Errorf("%s: %s (%s) %v", r.Name, r.Verdict, r.Detail, r.Observed)
		}
	}
	if ran != 2 {
		t.Errorf("%d scenarios ran on the UC pingpong server's QP, want the 2 UC scenarios", ran)
	}
	answers := 0
	if err := trace.ReadFile(pcap, func(r trace.Record) error {
		switch {
		case r.Src == server && (r.OpcodeName == "UC_SEND_LAST" || r.OpcodeName == "UC_SEND_ONLY"):
			answers++ // the last packet of an answer (2048 bytes: FIRST, LAST)
		case r.Src == server && strings.HasPrefix(r.OpcodeName, "UC_SEND"):
		case r.Src == server:
			t.Errorf("the UC server sent %s", r.OpcodeName)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// uc-gap-at-start delivers 2 messages, uc-gap-mid-message 2 of 3.
	if answers != 4 {
		t.Errorf("the server answered %d messages, want the 4 delivered", answers)
	}
	if srvErr != nil {
		t.Errorf("the UC pingpong server did not end after its 4 messages: %v", srvErr)
	}
}

// TestProbePingpongResponder runs `rxego probe --tool rc_pingpong`
// against rxego's own ibv_rc_pingpong server: the send scenarios run one
// after another on its one QP, the server's replies (a SEND per message
// it receives) are acknowledged by the probe and shown, and
// send-too-long, last, ends the server's run with a failed receive.
func TestProbePingpongResponder(t *testing.T) {
	server, local := testaddr.Loopback(), testaddr.Loopback()
	rep, pcap, srvErr := probePingpongServer(t, pingpong.RC, server, local, 20)
	if srvErr == nil {
		t.Errorf("the pingpong server ended cleanly; send-too-long should have failed its receive")
	}
	ran := 0
	for _, r := range rep.Results {
		if r.MyQPN == 0 {
			continue // not a send scenario
		}
		ran++
		if r.Verdict != probe.Conforms {
			t.Errorf("%s: %s (%s) %v", r.Name, r.Verdict, r.Detail, r.Observed)
		}
	}
	if ran != 4 {
		t.Errorf("%d scenarios ran on the pingpong server's QP, want the 4 send scenarios", ran)
	}
	// Every SEND the server sent back was acknowledged by the probe.
	sends, acks := map[uint32]bool{}, map[uint32]bool{}
	if err := trace.ReadFile(pcap, func(r trace.Record) error {
		switch {
		case r.Src == server && strings.HasPrefix(r.OpcodeName, "RC_SEND"):
			sends[uint32(r.PSN)] = true
		case r.Src == local && r.OpcodeName == "RC_ACKNOWLEDGE":
			acks[uint32(r.PSN)] = true
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(sends) == 0 {
		t.Errorf("the pingpong server sent no reply")
	}
	for psn := range sends {
		if !acks[psn] && !acks[psn+1] {
			t.Errorf("the server's SEND at psn %#x was not acknowledged", psn)
		}
	}
}

// TestProbePingpongRequester runs requester-mode scenarios, one a run,
// against rxego's own ibv_rc_pingpong client: the probe answers each of
// its messages with a SEND, as the C server does, so the client runs to
// its end, and the verdict is the one its write_bw client earns.
func TestProbePingpongRequester(t *testing.T) {
	for _, name := range []string{"ack-timeout", "rnr-wait", "duplicate-ack"} {
		t.Run(name, func(t *testing.T) {
			var scens []*probe.Scenario
			for _, s := range probe.BuiltinRequester() {
				if s.Name == name {
					scens = append(scens, s)
				}
			}
			probeAddr, client := testaddr.Loopback(), testaddr.Loopback()
			listening := make(chan int, 1)
			type ret struct {
				r   *probe.Report
				err error
			}
			ch := make(chan ret, 1)
			go func() {
				r, err := probe.Requester(context.Background(), probe.RequesterConfig{Tool: probe.Pingpong, Peer: client, Local: probeAddr,
					Scenarios: scens, Pingpong: pingpongSwap, Wait: time.Second, Timeout: 30 * time.Second,
					Listening: func(a net.Addr) { listening <- a.(*net.TCPAddr).Port }})
				ch <- ret{r, err}
			}()
			var port int
			select {
			case port = <-listening:
			case r := <-ch:
				t.Fatalf("the probe did not listen: %v", r.err)
			}
			res, cerr := pingpong.Run(context.Background(), pingpong.Config{Kind: pingpong.RC, Local: client, Server: probeAddr.String(),
				TCPPort: port, Size: 64, Iters: 20, Timeout: 30 * time.Second, Out: io.Discard})
			r := <-ch
			if r.err != nil {
				t.Fatalf("probe: %v (client: %v)", r.err, cerr)
			}
			if cerr != nil {
				t.Errorf("rxego's pingpong client did not end cleanly: %v", cerr)
			} else if res.Iters != 20 {
				t.Errorf("the client completed %d exchanges, want 20", res.Iters)
			}
			if len(r.r.Results) != 1 || r.r.Results[0].Verdict != probe.Conforms {
				t.Errorf("%s: %+v", name, r.r.Results)
			}
		})
	}
}
