package conformance

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/rxego/rxego/conformance/lab"
)

// udaddyLine is rxego udaddy's summary.
var udaddyLine = regexp.MustCompile(`rxego udaddy: (\d+) connections, (\d+) sent, (\d+) received, (\d+) verified`)

// udaddy runs udaddy in the guest against rxego udaddy with conns UD
// "connections" (SIDR) of 10 datagrams each way.
func (p *Peer) udaddy(t *testing.T, rxegoServer bool, conns int) Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmTimeout)
	defer cancel()
	c := strconv.Itoa(conns)
	rx := []string{"udaddy", "-c", c, "--stats", "-timeout", (cmTimeout - 10*time.Second).String()}
	var h *hostProc
	var res lab.Result
	if rxegoServer {
		h = p.startRxego(t, ctx, append(rx, "-b", p.HostIP)...)
		if err := h.waitOutput(ctx, cmListening); err != nil {
			t.Fatalf("rxego server: %v\n%s", err, h.output())
		}
		var err error
		if res, err = p.Guest.Run(ctx, "udaddy", "-s", p.HostIP, "-c", c); err != nil {
			h.wait(ctx)
			t.Fatalf("guest udaddy: %v\nstdout: %s\nrxego server %s", err, res.Stdout, h.output())
		}
		if err := h.wait(ctx); err != nil {
			t.Fatalf("rxego server: %v\n%s", err, h.output())
		}
	} else {
		proc, err := p.Guest.Start("udaddy", "-b", p.Guest.IP(), "-c", c)
		if err != nil {
			t.Fatal(err)
		}
		defer proc.Kill()
		if err := p.waitCMListen(ctx, 7174); err != nil {
			t.Fatal(err)
		}
		h = p.startRxego(t, ctx, append(rx, "-s", p.Guest.IP(), "-b", p.HostIP)...)
		rerr := h.wait(ctx)
		if rerr != nil {
			proc.Kill()
		}
		res, err = proc.Wait(ctx)
		if rerr != nil || err != nil {
			t.Fatalf("rxego client: %v\n%s\nguest udaddy: %v\nstdout: %s", rerr, h.output(), err, res.Stdout)
		}
	}
	if !bytes.Contains(res.Stdout, []byte("data transfers complete")) || !bytes.Contains(res.Stdout, []byte("return status 0")) {
		t.Errorf("guest udaddy did not complete with status 0:\n%s", res.Stdout)
	}
	msgs := strconv.Itoa(10 * conns)
	verified := "0" // a server cannot check udaddy's uninitialised data
	if !rxegoServer {
		verified = msgs
	}
	m := udaddyLine.FindSubmatch(h.stdout.Bytes())
	if m == nil || string(m[1]) != c || string(m[2]) != msgs || string(m[3]) != msgs || string(m[4]) != verified {
		t.Errorf("rxego: want %s connections, %s datagrams each way, %s verified:\n%s", c, msgs, verified, h.output())
	}
	return cmOutcome(t, h.stdout.Bytes(), msgs+" datagrams each way")
}

// TestUdaddy runs udaddy (rdma_cm over UD: SIDR_REQ/SIDR_REP on QP1, the
// UDP port space) with one and with several connections in both roles.
func TestUdaddy(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, conns := range []int{1, 3} {
			for _, server := range []bool{true, false} {
				role := "rxego client"
				if server {
					role = "rxego server"
				}
				p.Case(t, Case{Name: fmt.Sprintf("udaddy -c %d", conns), Role: role, Expect: cmExpect}, func(t *testing.T) Outcome {
					return p.udaddy(t, server, conns)
				})
			}
		}
	})
}
