package trace_test

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/internal/app/trace/tsharktest"
	"github.com/rxego/rxego/reth"
	"github.com/rxego/rxego/rocelayer"
)

// TestAgainstTshark decodes every capture with trace and with tshark and
// compares every RoCE frame field by field.
func TestAgainstTshark(t *testing.T) {
	tsharktest.Need(t)
	files, _ := filepath.Glob("../../../testdata/pcaps/*.pcap*")
	if len(files) == 0 {
		t.Fatal("no captures in testdata/pcaps")
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			t.Parallel()
			want := tsharktest.Frames(t, path)
			got := map[int]trace.Record{}
			err := trace.ReadFile(path, func(r trace.Record) error {
				got[r.Frame] = r
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(want) == 0 || len(got) != len(want) {
				t.Errorf("trace found %d RoCE frames, tshark %d", len(got), len(want))
			}
			t.Logf("%d RoCE frames compared", len(want))
			tsharktest.Compare(t, want, got, nil)
		})
	}
}

// TestAgainstTsharkSynthetic covers what the captures do not: every opcode
// of the table (RC, UC, RD, UD, CNP) with random header fields, FECN and
// BECN, non-zero pad counts and random payload lengths, written to a pcap
// and decoded by both.
func TestAgainstTsharkSynthetic(t *testing.T) {
	tsharktest.Need(t)
	rng := rand.New(rand.NewPCG(21, 22))
	var file bytes.Buffer
	w := pcapgo.NewWriter(&file)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	n := 0
	for v := 0; v < 256; v++ {
		in, ok := bth.Lookup(bth.Opcode(v))
		if !ok {
			continue
		}
		for i := 0; i < 4; i++ {
			plen := 0
			switch {
			case in.Op == bth.OpAtomicWrite:
				plen = 8
			case in.Has(bth.Payload) && i == 3:
				plen = 1024 + rng.IntN(4)
			case in.Has(bth.Payload):
				plen = rng.IntN(64)
			}
			h := bth.Header{Opcode: in.Opcode, SE: rng.IntN(2) == 0, MigReq: rng.IntN(2) == 0, PKey: uint16(rng.Uint32()),
				FECN: rng.IntN(2) == 0, BECN: rng.IntN(2) == 0, Resv6: uint8(rng.IntN(64)), DestQP: rng.Uint32() & 0xffffff,
				AckReq: rng.IntN(2) == 0, Resv7: uint8(rng.IntN(128)), PSN: bth.PSN(rng.Uint32() & bth.PSNMask),
				RETH:      bth.RETHFields{VA: rng.Uint64(), RKey: rng.Uint32(), DMALen: rng.Uint32()},
				AETH:      bth.AETHFields{Syndrome: reth.Syndrome(rng.Uint32()), MSN: rng.Uint32() & 0xffffff},
				Atomic:    bth.AtomicFields{VA: rng.Uint64(), RKey: rng.Uint32(), SwapAdd: rng.Uint64(), Compare: rng.Uint64()},
				AtomicAck: rng.Uint64(), Imm: rng.Uint32(), IETHRKey: rng.Uint32(),
				DETH: bth.DETHFields{QKey: rng.Uint32(), SrcQP: rng.Uint32() & 0xffffff}, FETH: rng.Uint32() & 0x3f, RDETH: rng.Uint32() & 0xffffff}
			payload := make([]byte, plen)
			for j := range payload {
				payload[j] = byte(rng.Uint32())
			}
			d := frame(t, rocelayer.Port, h, payload)
			n++
			ci := gopacket.CaptureInfo{Timestamp: time.Unix(1700000000+int64(n), int64(n)*1000), CaptureLength: len(d), Length: len(d)}
			if err := w.WritePacket(ci, d); err != nil {
				t.Fatal(err)
			}
		}
	}
	path := filepath.Join(t.TempDir(), "synthetic.pcap")
	if err := os.WriteFile(path, file.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	want := tsharktest.Frames(t, path)
	got := map[int]trace.Record{}
	if err := trace.ReadFile(path, func(r trace.Record) error { got[r.Frame] = r; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(want) != n || len(got) != n {
		t.Fatalf("%d frames written, tshark decoded %d, trace %d", n, len(want), len(got))
	}
	tsharktest.Compare(t, want, got, tsharktest.BTHOnly)
	t.Logf("%d synthetic frames compared", n)
}
