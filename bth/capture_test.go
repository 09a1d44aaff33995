package bth_test

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/icrc"
	"github.com/rxego/rxego/internal/capfile"
)

// TestCapturesRoundTrip parses every RoCE frame of every rxe capture and
// re-encodes it from its decoded fields: the bytes, ICRC included, must
// come out identical.
func TestCapturesRoundTrip(t *testing.T) {
	files, _ := filepath.Glob("../testdata/pcaps/*.pcap*")
	if len(files) == 0 {
		t.Fatal("no captures in testdata/pcaps")
	}
	seen := map[bth.Opcode]int{}
	for _, f := range files {
		err := capfile.Each(f, func(fr capfile.Frame) error {
			p, err := bth.Parse(fr.RoCE)
			if err != nil {
				t.Errorf("%s frame %d: %v", filepath.Base(f), fr.Number, err)
				return nil
			}
			seen[p.Info.Opcode]++
			h := p.Decode()
			buf := make([]byte, len(fr.RoCE)+8)
			n, err := h.Encode(buf, p.Payload())
			if err != nil {
				t.Errorf("%s frame %d: encode: %v", filepath.Base(f), fr.Number, err)
				return nil
			}
			out := buf[:n]
			crc, _ := icrc.FromHeaders(fr.IP, fr.UDP, out)
			icrc.Put(out, crc)
			if !bytes.Equal(out, fr.RoCE) {
				t.Errorf("%s frame %d (%v): re-encoded\n%x\nwant\n%x", filepath.Base(f), fr.Number, p.Info.Opcode, out, fr.RoCE)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, op := range []bth.Opcode{bth.RCSendFirst, bth.RCSendMiddle, bth.RCSendLast, bth.RCSendOnly,
		bth.RCSendLastImm, bth.RCSendOnlyImm, bth.RCWriteFirst, bth.RCWriteMiddle, bth.RCWriteLast,
		bth.RCWriteOnly, bth.RCWriteLastImm, bth.RCWriteOnlyImm, bth.RCReadRequest,
		bth.RCReadResponseFirst, bth.RCReadResponseMiddle, bth.RCReadResponseLast, bth.RCReadResponseOnly,
		bth.RCAck, bth.RCAtomicAck, bth.RCCompareSwap, bth.RCFetchAdd,
		bth.UCSendFirst, bth.UCSendMiddle, bth.UCSendLast, bth.UDSendOnly} {
		if seen[op] == 0 {
			t.Errorf("captures contain no %v: the round trip did not cover it", op)
		}
	}
}
