package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rxego/rxego/internal/app/trace"
)

// TestTraceJSON runs `rxego trace --json` on a capture and checks one
// object per RoCE packet with the required keys, numbers as JSON numbers.
func TestTraceJSON(t *testing.T) {
	var out bytes.Buffer
	if err := traceTo(&out, []string{"--json", "../../testdata/pcaps/verbs_cmp_swap_6.12.pcapng"}); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&out)
	lines := 0
	for sc.Scan() {
		lines++
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("line %d: %v", lines, err)
		}
		for _, k := range []string{"frame", "time", "src", "dst", "src_port", "ip_id", "ecn", "dscp", "opcode",
			"opcode_name", "dqpn", "psn", "ackreq", "se", "pad", "pkey", "fecn", "becn", "payload_len", "icrc_ok"} {
			if _, ok := m[k]; !ok {
				t.Errorf("line %d: no key %q", lines, k)
			}
		}
		// One ICRC, two byte orders, both in hex: icrc_crc32 is icrc_wire's
		// bytes reversed, and neither prints as a decimal.
		crc, _ := m["icrc_crc32"].(string)
		wire, _ := m["icrc_wire"].(string)
		if len(crc) != 10 || len(wire) != 10 || crc[2:4] != wire[8:10] || crc[8:10] != wire[2:4] || m["icrc"] != nil {
			t.Errorf("line %d: icrc_crc32 %q and icrc_wire %q (icrc %v): want the same bytes in hex, reversed", lines, crc, wire, m["icrc"])
		}
		if _, ok := m["opcode"].(json.Number); !ok {
			t.Errorf("line %d: opcode is %T, want a number", lines, m["opcode"])
		}
		_, atomic := m["atomic"]
		_, ack := m["atomic_ack"]
		if atomic == ack {
			t.Errorf("line %d: want exactly one of atomic, atomic_ack: %s", lines, sc.Text())
		}
	}
	if lines != 8 {
		t.Errorf("%d lines, want the capture's 8 RoCE packets", lines)
	}
}

// TestTraceText checks the text form's first line and the argument check.
func TestTraceText(t *testing.T) {
	var out bytes.Buffer
	if err := traceTo(&out, []string{"../../testdata/pcaps/verbs_bad_rkey_6.12.pcapng"}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "aeth(syndrome=0x62 NAK(REMOTE_ACCESS_ERR)") {
		t.Errorf("output:\n%s", out.String())
	}
	if err := traceTo(&out, nil); err == nil {
		t.Error("no file: no error")
	}
	if err := traceTo(&out, []string{"/nonexistent.pcap"}); err == nil {
		t.Error("missing file: no error")
	}
}

// TestTraceErrors checks that a file that is not a capture, an empty one
// and a truncated one each get an error naming the file and what is
// wrong (and where), that conflicting output flags are refused, and that
// an interface that does not exist is called that.
func TestTraceErrors(t *testing.T) {
	dir := t.TempDir()
	capture, err := os.ReadFile("../../testdata/pcaps/verbs_read_6.12.pcapng")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"empty": nil, "text": []byte("# rxego\n\nA pure-Go RoCE stack"), "cut.pcapng": capture[:700], "short": capture[:3]}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		args []string
		want []string
		is   error
	}{
		{[]string{filepath.Join(dir, "text")}, []string{"text: not a pcap or pcapng file", `"# rxego`}, trace.ErrNotCapture},
		{[]string{filepath.Join(dir, "empty")}, []string{"empty: empty file"}, trace.ErrEmpty},
		{[]string{"--ladder", filepath.Join(dir, "cut.pcapng")}, []string{"cut.pcapng: truncated: the file ends inside frame 4"}, trace.ErrTruncated},
		{[]string{filepath.Join(dir, "short")}, []string{"short: truncated"}, trace.ErrTruncated},
		{[]string{"--json", "--ladder", "../../testdata/pcaps/verbs_read_6.12.pcapng"}, []string{"--json and --ladder/--summary conflict"}, nil},
		{[]string{"--json", "--summary", "../../testdata/pcaps/verbs_read_6.12.pcapng"}, []string{"conflict"}, nil},
		{[]string{"-i", "nosuchif0"}, []string{`no such interface "nosuchif0"`, "lo"}, nil},
	} {
		err := traceTo(io.Discard, c.args)
		if err == nil {
			t.Errorf("%q: no error", c.args)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q lacks %q", c.args, err, w)
			}
		}
		if c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("%q: error %q is not %v", c.args, err, c.is)
		}
	}
}

// TestTraceCM checks that every output form names rping's CM messages
// with their IDs, QPN and PSN: the packet lines, JSON, the ladder and
// the page.
func TestTraceCM(t *testing.T) {
	const rping = "../../testdata/pcaps/rping_6.12.pcapng"
	page := filepath.Join(t.TempDir(), "p.html")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{rping}, "CM REQ local_id=0x088c41c6 qpn=0x000011 start_psn=7729957 service_id=0x0000000001061c06"},
		{[]string{"--json", rping}, `"cm":{"msg":"REP","attr_id":19,"tid":11916119048,"local_comm_id":3478200697,"remote_comm_id":143409606,"local_qpn":17,"starting_psn":1236684}`},
		{[]string{"--ladder", rping}, "|-- CM RTU #3 id 0x088c41c6 --"},
		{[]string{"--html", page, rping}, ""},
	} {
		var out bytes.Buffer
		if err := traceTo(&out, c.args); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), c.want) {
			t.Errorf("%q lacks %s:\n%s", c.args, c.want, out.String())
		}
	}
	b, err := os.ReadFile(page)
	if err != nil || !bytes.Contains(b, []byte("CM DREQ #4 id 0x088c41c6 qpn 0x000011")) {
		t.Errorf("page: %v, no CM DREQ", err)
	}
}
