package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/rxego/rxego/internal/app/perftest"
	"github.com/rxego/rxego/internal/app/probe"
	"github.com/rxego/rxego/transport"
)

func init() {
	Scenarios = append(Scenarios, Scenario{"probe",
		"rxego probe: judging a device from outside, rule by rule (here Bob's, behind an ib_write_bw server)", (*Tour).probe})
}

// probeScenarios are the probe's scenarios the stop runs: three findings
// to explain, and their neighbours.
var probeScenarios = []string{"write-ack", "psn-gap-nak", "duplicate-write", "reserved-opcode", "rnr-no-receive"}

// probe runs `rxego probe`'s responder mode against Bob's device serving
// as an ib_write_bw server, as it would against any RoCE device running
// the C tool, and explains three findings.
func (t *Tour) probe() error {
	b := t.b
	bob := b.dev.Addr().Addr()
	local, err := freeNeighbour(bob)
	if err != nil {
		return err
	}
	scens := probe.Builtin()
	var picked []*probe.Scenario
	for _, name := range probeScenarios {
		for _, s := range scens {
			if s.Name == name {
				picked = append(picked, s)
			}
		}
	}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(bob, 0).String())
	if err != nil {
		return err
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	t.header = fmt.Sprintf("%s's device (the ib_write_bw server the probe rode) saw it; A is the probe at %v, B is %s", b.name, local, b.name)
	if t.tap != nil {
		b.dev.SetTap(t.tap)
		defer b.dev.SetTap(nil)
	}
	t.say("%s starts what an ordinary RoCE host would run: an ib_write_bw server with %d QPs (rxego perf here; rdma-core's", b.name, len(picked))
	t.say("ib_write_bw on a kernel or a NIC is probed the same way). The probe, at %v, does the tool's client handshake over TCP,", local)
	t.say("learns the QP numbers, PSNs, rkey and address, and then sends scripted packets from a UDP port 4791 of its own")
	t.say("instead of the tool's traffic: one scenario per QP, each naming the IBTA rule it checks.")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := make(chan error, 1)
	go func() {
		_, err := perftest.Run(ctx, perftest.Config{Test: perftest.WriteBW, Device: b.dev, Local: bob, Listener: ln, Port: port,
			NumQPs: len(picked), Size: 64, Iters: 5, Timeout: 25 * time.Second, Out: io.Discard})
		srv <- err
	}()
	// A second per answer, not the probe's usual 200 ms: on a loaded
	// machine (CI, with the race detector) bob's NAK once came later, and
	// the tour told a learner rxego deviates where it does not. What
	// waits out the whole second is only an answer that never comes.
	rep, err := probe.Responder(ctx, probe.ResponderConfig{Peer: bob, Port: port, Local: local, Tool: "write_bw",
		NumQPs: len(picked), Scenarios: picked, Wait: time.Second})
	serr := <-srv
	if err != nil {
		return err
	}
	// The server checks that nothing it did not expect changed its
	// memory; the probe's WRITEs did change it, on purpose.
	if serr != nil && !strings.Contains(serr.Error(), "data checks failed") {
		return fmt.Errorf("the ib_write_bw server: %w", serr)
	}
	if err := rep.WriteText(t.out, false); err != nil {
		return err
	}
	get := func(name string) (probe.Result, error) {
		r, ok := rep.Result(name)
		if !ok || r.MyQPN == 0 {
			return r, fmt.Errorf("scenario %s did not run", name)
		}
		return r, nil
	}
	gap, err := get("psn-gap-nak")
	if err != nil {
		return err
	}
	dup, err := get("duplicate-write")
	if err != nil {
		return err
	}
	resv, err := get("reserved-opcode")
	if err != nil {
		return err
	}
	if gap.Verdict != probe.Conforms || dup.Verdict != probe.Conforms || resv.Verdict != probe.Deviates {
		return errors.New("the findings are not what rxego does: " + rep.Summary)
	}
	t.say("\nThree findings:")
	t.say("1. psn-gap-nak: the probe skipped a PSN. Bob did not execute the WRITE; he answered %q:", gap.Observed[0])
	t.say("   a NAK carries the PSN the responder expects, so the requester knows where to resume (Go-back-N).")
	t.say("2. duplicate-write: the same WRITE twice at one PSN. Bob acknowledged both (%s; %s).",
		dup.Observed[0], dup.Observed[1])
	t.say("   A duplicate means the requester lost the ACK: the responder must answer again but not execute again (C9-105).")
	t.say("   For a WRITE only the ACK shows from outside; the probe's atomic-replay scenario shows the not-executing-again.")
	t.say("3. reserved-opcode: a request with opcode 0x18, which IBTA reserves. Bob said nothing, where the rule")
	t.say("   the probe checks wants a NAK (invalid request). rxe does the same, and so does rxego, on purpose: a deviation")
	t.say("   the report names, so nobody takes it for packet loss. docs/probe.md has rxe's and rxego's reports side by side.")
	return nil
}

// freeNeighbour returns a loopback address near a (the next last octets)
// whose UDP port 4791 is free, for the probe's own socket.
func freeNeighbour(a netip.Addr) (netip.Addr, error) {
	next := a
	for range 16 {
		next = next.Next()
		if !next.IsLoopback() {
			break
		}
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(next, transport.Port)))
		if err == nil {
			c.Close()
			return next, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no free loopback address after %v for the probe's UDP port %d", a, transport.Port)
}
