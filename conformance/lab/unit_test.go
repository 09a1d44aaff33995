package lab

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// These tests need no root and no VM.

func TestLabPID(t *testing.T) {
	for name, want := range map[string]int{
		"rxegolab123":    123,
		"rxegolab123x2":  123,
		"rxegolab":       0,
		"rxegolabx2":     0,
		"other123":       0,
		"rxegolab-5":     0,
		"rxegolab77x":    77,
		"rxegolab0":      0,
		"rxegolab12ab34": 0,
	} {
		pid, ok := labPID(name)
		if ok != (want > 0) || pid != want && ok {
			t.Errorf("labPID(%q) = %d, %v; want %d", name, pid, ok, want)
		}
	}
}

func TestListensOn(t *testing.T) {
	table := []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:4853 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0B0012C6:1E14 0100000A:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1
`)
	if !listensOn(table, 18515) {
		t.Error("18515 (0x4853) in LISTEN not found")
	}
	if listensOn(table, 7700) {
		t.Error("7700 (0x1E14) is ESTABLISHED, not LISTEN")
	}
	if listensOn(table, 80) || listensOn(nil, 18515) {
		t.Error("found a port that is not there")
	}
}

func TestSetLossValidation(t *testing.T) {
	l := &Lab{loss: make(map[lossKey]int)}
	for _, c := range []struct {
		from, to string
		pct      int
	}{
		{"198.18.0.11", "198.18.0.12", -1},
		{"198.18.0.11", "198.18.0.12", 101},
		{"not-an-ip", "", 10},
		{"", "198.18.0.300", 10},
		{"198.18.0.11", "2001:2::12", 10},
	} {
		if err := l.SetLoss(c.from, c.to, c.pct); err == nil {
			t.Errorf("SetLoss(%q, %q, %d): no error", c.from, c.to, c.pct)
		}
	}
	if len(l.loss) != 0 {
		t.Fatalf("rejected calls changed the rules: %v", l.loss)
	}
}

func TestLossRules(t *testing.T) {
	a := netip.MustParseAddr
	l := &Lab{loss: map[lossKey]int{
		{from: a("198.18.0.12"), to: a("198.18.0.11")}: 30,
		{to: a("198.18.0.1")}:                          5,
		{from: a("2001:2::11")}:                        50,
		{}:                                             1,
		{from: a("198.18.0.13")}:                       100,
		{from: a("198.18.0.14"), keepACKs: true}:       5,
	}}
	want := []string{
		"ip daddr 198.18.0.1 udp dport 4791 numgen random mod 100 < 5 counter drop",
		"ip saddr 198.18.0.12 ip daddr 198.18.0.11 udp dport 4791 numgen random mod 100 < 30 counter drop",
		"ip saddr 198.18.0.13 udp dport 4791 counter drop",
		"ip saddr 198.18.0.14 udp dport 4791 @th,64,8 != 0x11 numgen random mod 100 < 5 counter drop",
		"ip6 saddr 2001:2::11 udp dport 4791 numgen random mod 100 < 50 counter drop",
		"udp dport 4791 numgen random mod 100 < 1 counter drop",
	}
	if got := l.lossRules(); !reflect.DeepEqual(got, want) {
		t.Fatalf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestReportMarkdown(t *testing.T) {
	r := NewReport("title")
	r.Add(Row{Case: "rc|pp", Kernel: "6.12", Role: "server", Result: "pass",
		Duration: 1500 * time.Millisecond,
		Counters: map[string]uint64{"sent_pkts": 4, "rcvd_pkts": 5, "ack_deferred": 0}, Resent: "2.0% (2/100)", Note: "a\nb"})
	r.SetRun("commit abc, CI")
	md := r.Markdown()
	for _, want := range []string{
		"# title\n",
		"Run: commit abc, CI.\n",
		"| case | kernel | role | result | duration | resent | rxe counters (delta) | note |",
		`| rc\|pp | 6.12 | server | pass | 1.5s | 2.0% (2/100) | rcvd_pkts=5 sent_pkts=4 | a b |`,
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	path := filepath.Join(t.TempDir(), "sub", "report.md")
	if err := r.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(path); err != nil || !strings.Contains(string(data), "rc\\|pp") {
		t.Fatalf("written report: %q %v", data, err)
	}
}

func TestReportPath(t *testing.T) {
	t.Setenv("RXEGO_REPORT", "")
	if got := ReportPath("/x/def.md"); got != "/x/def.md" {
		t.Errorf("default: %q", got)
	}
	t.Setenv("RXEGO_REPORT", "/y/env.md")
	if got := ReportPath("/x/def.md"); got != "/y/env.md" {
		t.Errorf("env: %q", got)
	}
}

func TestCounterDelta(t *testing.T) {
	got := CounterDelta(map[string]uint64{"a": 5, "b": 9, "gone": 1},
		map[string]uint64{"a": 7, "b": 3, "new": 4})
	want := map[string]uint64{"a": 2, "new": 4}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestNotAvailableError(t *testing.T) {
	t.Setenv("RXEGO_LAB_DIR", t.TempDir())
	err := Available()
	var na *NotAvailableError
	if !errors.As(err, &na) {
		t.Fatalf("Available with an empty lab dir: %v", err)
	}
	if !strings.Contains(err.Error(), SetupCommand) || !strings.Contains(err.Error(), "kernel 6.12 not prepared") {
		t.Fatalf("error does not say what to do: %v", err)
	}
}

func TestBootRejectsBadArguments(t *testing.T) {
	l := &Lab{guests: make(map[netip.Addr]*Guest), loss: make(map[lossKey]int)}
	for _, c := range []struct {
		kernel, ip string
		opts       BootOptions
	}{
		{"5.10", "198.18.0.11", BootOptions{}},
		{"6.12", "198.18.1.11", BootOptions{}},
		{"6.12", "198.18.0.1", BootOptions{}},
		{"6.12", "198.18.0.255", BootOptions{}},
		{"6.12", "10.0.0.1", BootOptions{}},
		{"6.12", "2001:2::11", BootOptions{}},
		{"6.12", "198.18.0.11", BootOptions{MTU: 100}},
		{"6.12", "198.18.0.11", BootOptions{IP6: "198.18.0.11"}},
	} {
		if _, err := l.Boot(c.kernel, c.ip, c.opts); err == nil {
			t.Errorf("Boot(%q, %q, %+v): no error", c.kernel, c.ip, c.opts)
		}
	}
	if len(l.guests) != 0 {
		t.Fatalf("rejected boots left guests: %v", l.guests)
	}
}

// TestExitErrorCrash checks which signals count as a crash (the error then
// carries the guest kernel's log) and that the log's last lines end the
// error's text.
func TestExitErrorCrash(t *testing.T) {
	for sig, crash := range map[string]bool{
		"segmentation fault": true, "bus error": true, "aborted": true,
		"illegal instruction": true, "floating point exception": true,
		"killed": false, "terminated": false, "interrupt": false, "": false,
	} {
		if got := crashSignal(sig); got != crash {
			t.Errorf("crashSignal(%q) = %v, want %v", sig, got, crash)
		}
	}
	var log strings.Builder
	for i := range 20 {
		log.WriteString("line " + string(rune('a'+i)) + "\n")
	}
	e := &ExitError{Guest: "198.18.0.12", Argv: []string{"ib_write_bw"},
		Result:    Result{ExitCode: -1, Signal: "segmentation fault"},
		KernelLog: strings.Join(lastLines(log.String(), kernelLogLines), " | ")}
	got := e.Error()
	want := "guest 198.18.0.12: ib_write_bw: killed by segmentation fault; stderr: ; the guest kernel's log ends: line i | line j"
	if !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "line s | line t") || strings.Contains(got, "line h |") {
		t.Errorf("error %q\nwant it to start %q, end with the last %d lines", got, want, kernelLogLines)
	}
}
