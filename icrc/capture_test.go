package icrc_test

import (
	"path/filepath"
	"testing"

	"github.com/rxego/rxego/icrc"
	"github.com/rxego/rxego/internal/capfile"
)

// TestCapturesICRC checks the ICRC of every RoCE frame of every rxe capture
// both from the real headers and from the V4 description, and that Recover
// finds the ID that was on the wire.
func TestCapturesICRC(t *testing.T) {
	files, _ := filepath.Glob("../testdata/pcaps/*.pcap*")
	if len(files) == 0 {
		t.Fatal("no captures in testdata/pcaps")
	}
	total := 0
	for _, f := range files {
		err := capfile.Each(f, func(fr capfile.Frame) error {
			total++
			crc, ok := icrc.FromHeaders(fr.IP, fr.UDP, fr.RoCE)
			if !ok || crc != icrc.Get(fr.RoCE) {
				t.Errorf("%s frame %d: ICRC %08x, stored %08x", filepath.Base(f), fr.Number, crc, icrc.Get(fr.RoCE))
			}
			if fr.IP[0]>>4 != 4 {
				return nil
			}
			v := icrc.V4{SrcPort: uint16(fr.UDP[0])<<8 | uint16(fr.UDP[1]), DstPort: 4791, DF: fr.IP[6]&0x40 != 0}
			copy(v.Src[:], fr.IP[12:16])
			copy(v.Dst[:], fr.IP[16:20])
			v.DstPort = uint16(fr.UDP[2])<<8 | uint16(fr.UDP[3])
			wireID := uint16(fr.IP[4])<<8 | uint16(fr.IP[5])
			if !v.Check(wireID, fr.RoCE) {
				t.Errorf("%s frame %d: V4.Check failed", filepath.Base(f), fr.Number)
			}
			id, ok := v.Recover(fr.RoCE)
			if !ok || id != wireID {
				t.Errorf("%s frame %d: Recover = %d,%v want %d", filepath.Base(f), fr.Number, id, ok, wireID)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	t.Logf("%d RoCE frames checked", total)
}
