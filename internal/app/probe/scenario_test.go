package probe

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/app/perftest"
	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// TestBuiltinScenarios: the built-in scenarios parse, are many enough,
// have unique names, and each names a rule and what it requires.
func TestBuiltinScenarios(t *testing.T) {
	resp, req := Builtin(), BuiltinRequester()
	if n := len(resp) + len(req); n < 30 {
		t.Errorf("%d built-in scenarios, want at least 30", n)
	}
	seen := map[string]bool{}
	for _, s := range append(resp, req...) {
		if seen[s.Name] {
			t.Errorf("scenario %s twice", s.Name)
		}
		seen[s.Name] = true
		if !strings.Contains(s.Rule, "IBTA") {
			t.Errorf("%s: rule %q names no IBTA section", s.Name, s.Rule)
		}
	}
	for _, s := range req {
		if !s.Requester {
			t.Errorf("%s: a requester scenario without mode requester", s.Name)
		}
	}
}

// TestParseErrors: every malformed scenario is an error naming its line
// and what is wrong.
func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"send write-only", "line 1: \"send\" outside a scenario"},
		{"scenario a\nrule r\nrequires q\nsend write-onyl\nend", "line 4: unknown packet \"write-onyl\""},
		{"scenario a\nrule r\nrequires q\nsend write-only psn=5\nend", "line 4: psn \"5\": want +N or -N"},
		{"scenario a\nrule r\nrequires q\nexpect nak-what\nend", "line 4: unknown response"},
		{"scenario a\nrule r\nrequires q\nsend write-only len=x\nend", "line 4: len=\"x\""},
		{"scenario a\nrule r\nrequires q\nsend write-only frob\nend", "unknown field \"frob\""},
		{"scenario a\nsend write-only\nend", "needs a rule and what it requires"},
		{"scenario a\nrule r\nrequires q\nend", "no steps"},
		{"scenario a\nrule r\nrequires q\nsend write-only", "has no end"},
		{"scenario a b\n", "one name without spaces"},
		{"scenario a\nrule r\nrequires q\nimpair drop at=5\nend", "does not belong in a responder-mode scenario"},
		{"scenario a\nmode requester\nrule r\nrequires q\nsend write-only\nend", "does not belong in a requester-mode scenario"},
		{"scenario a\nmode requester\nrule r\nrequires q\nimpair drop at=5\nexpect retransmit min=soon\nend", "delay \"soon\""},
		{"scenario a\nrule r\nrequires q\nwait 1h\nend", "outside (0, 10s]"},
		{"scenario a\nrule r\nrequires q\nneeds ud\nsend uc-send-only\nend", "needs \"ud\": want write, read, atomic, send or uc"},
		{"scenario a\nmode requester\nrule r\nrequires q\nimpair drop at=5\nexpect peer-send\nend", "does not belong in a requester-mode scenario"},
		{"scenario a\nrule r\nrequires q\n" + strings.Repeat("send write-only\n", 65) + "end", "at most 64"},
		{"scenario a\nmode requester\nrule r\nrequires q\nimpair cnp at=5 every=50us\nend", "impair cnp needs count=N, 1..1000"},
		{"scenario a\nmode requester\nrule r\nrequires q\nimpair cnp at=5 count=1001 every=50us\nend", "1..1000"},
		{"scenario a\nmode requester\nrule r\nrequires q\nimpair cnp at=5 count=10\nend", "impair cnp needs every=D"},
		{"scenario a\nmode requester\nrule r\nrequires q\nimpair drop at=5\nexpect slower window=10ms\nend", "expect slower needs an impair cnp"},
		{"scenario a\nmode requester\nrule r\nrequires q\nimpair cnp at=5 after=1s count=10 every=1ms\nexpect slower\nend", "expect slower needs window=D"},
		{"scenario a\nmode requester\nrule r\nrequires q\nimpair cnp at=5 after=1s count=10 every=1ms\nexpect slower window=10ms\nend", "last no longer than the window"},
		{"scenario a\nmode requester\nrule r\nrequires q\nimpair cnp at=5 after=5ms count=100 every=1ms\nexpect slower window=10ms\nend", "shorter than the window"},
		{"scenario a\nmode requester\nrule r\nrequires q\nimpair cnp at=5 every=soon count=1\nend", "every=\"soon\""},
	} {
		_, err := ParseScenarios(strings.NewReader(c.text))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.text, err, c.want)
		}
	}
}

// TestParseScenario: a scenario's fields land where the runner reads them.
func TestParseScenario(t *testing.T) {
	s, err := ParseScenarios(strings.NewReader(`# a comment
scenario x
rule IBTA r
requires q
needs read
start-psn 0xfffffe
send read psn=-2 len=4096 rkey=bad va=0x10 ackreq   # trailing comment
expect read-first psn=+0..+3 coalesce pre
end`))
	if err != nil {
		t.Fatal(err)
	}
	sc := s[0]
	st, ex := sc.Steps[0], sc.Steps[1]
	if sc.Needs != NeedsRead || *sc.StartPSN != 0xfffffe || *st.PSN != -2 || st.Len != 4096 || st.RKey != RKeyBad ||
		st.VAOff != 0x10 || !st.AckReq || *ex.PSN != 0 || *ex.PSNHi != 3 || !ex.Coalesce || !ex.Pre || st.Line != 7 {
		t.Errorf("parsed %+v %+v %+v", sc, st, ex)
	}
}

// TestPacketBudget: the wire refuses to send past its bound, and paces
// what it sends.
func TestPacketBudget(t *testing.T) {
	a, b := testaddr.Loopback(), testaddr.Loopback()
	w, err := openWire(a, b, 2*time.Millisecond, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	pkt := make([]byte, 16)
	start := time.Now()
	for i := range 3 {
		if _, err := w.send(context.Background(), pkt, 0); err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
	}
	if d := time.Since(start); d < 4*time.Millisecond {
		t.Errorf("3 packets 2 ms apart took %v", d)
	}
	if _, err := w.send(context.Background(), pkt, 0); err != ErrBudget {
		t.Errorf("the 4th packet: %v, want ErrBudget", err)
	}
}

// TestOnlyThePeerNamed: a server whose QPs are at another address than
// the one named is refused before any packet is sent.
func TestOnlyThePeerNamed(t *testing.T) {
	server, local, elsewhere := testaddr.Loopback(), testaddr.Loopback(), testaddr.Loopback()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(server, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		ex := perftest.NewExchange(c, false, time.Now().Add(10*time.Second))
		if ex.Versions() != nil {
			return
		}
		if _, _, err := ex.SysData(4096, 64); err != nil {
			return
		}
		if _, err := ex.MTU(3); err != nil {
			return
		}
		ex.HandShake(perftest.Dest{QPN: 0x11, PSN: 1, RKey: 2, VAddr: 3, GID: elsewhere.As16()})
	}()
	rep, err := Responder(context.Background(), ResponderConfig{Peer: server, Port: ln.Addr().(*net.TCPAddr).Port, Local: local,
		Tool: "write_bw", NumQPs: 1, Scenarios: Builtin()[:1], Timeout: 10 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "sends only to the peer named") {
		t.Fatalf("report %v, error %v; want a refusal", rep, err)
	}
}
