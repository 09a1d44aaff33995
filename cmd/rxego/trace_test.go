package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
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
