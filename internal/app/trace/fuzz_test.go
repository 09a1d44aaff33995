package trace_test

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/internal/capfile"
)

// FuzzFromFrame builds records from arbitrary Ethernet frames: no panic,
// a record only for UDP port 4791, either an error or decoded fields (never
// both), fields consistent with the opcode table, and text and
// JSON forms that can always be produced (the JSON parses back).
func FuzzFromFrame(f *testing.F) {
	files, _ := filepath.Glob("../../../testdata/pcaps/*.pcap*")
	for _, file := range files {
		i := 0
		_ = capfile.Each(file, func(fr capfile.Frame) error {
			if i < 2 {
				f.Add(bytes.Clone(fr.Data))
				f.Add(bytes.Clone(fr.Data[:len(fr.Data)-3]))
			}
			i++
			return nil
		})
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, ok := trace.FromFrame(1, time.Unix(0, 0), layers.LinkTypeEthernet, data)
		if !ok {
			return
		}
		if r.SrcPort != 4791 && r.DstPort != 4791 {
			t.Fatalf("record for ports %d -> %d", r.SrcPort, r.DstPort)
		}
		if (r.RoCE == nil) == (r.Error == "") {
			t.Fatalf("record with RoCE %v and error %q", r.RoCE != nil, r.Error)
		}
		if r.RoCE != nil {
			in := r.Opcode.Info()
			if in == nil || r.OpcodeName != in.Name || r.TVer != 0 || r.PSN > bth.PSNMask || r.DestQP > 0xffffff ||
				(r.PayloadLen > 0 && !in.Has(bth.Payload)) || (r.RETH != nil) != (in.Ext&bth.ExtRETH != 0) ||
				(r.AETH != nil) != (in.Ext&bth.ExtAETH != 0) || (r.DETH != nil) != (in.Ext&bth.ExtDETH != 0) {
				t.Fatalf("inconsistent record %+v", *r.RoCE)
			}
		}
		if r.String() == "" {
			t.Fatal("empty text line")
		}
		j, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(j, &m); err != nil {
			t.Fatalf("JSON %s: %v", j, err)
		}
	})
}
