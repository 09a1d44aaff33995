package capfile

import (
	"bytes"
	"testing"

	"github.com/gopacket/gopacket/layers"
)

// FuzzSplitGSO feeds Split, SplitGSO and InferGSOSize frames a live
// capture could read off a hostile network: none may panic, every segment
// SplitGSO cuts must itself split as RoCE with its share of the payload,
// and the segments' payloads must add up to the datagram's.
func FuzzSplitGSO(f *testing.F) {
	seg := segFrame(0x00, 7, 64, 100)
	whole := glue([][]byte{seg, segFrame(0x01, 8, 64, 101), segFrame(0x02, 9, 64, 102)})
	f.Add(uint8(0), whole, len(seg)-42)
	f.Add(uint8(0), seg, 16)
	f.Add(uint8(1), whole[14:], 80)
	f.Fuzz(func(t *testing.T, linkSel uint8, data []byte, segSize int) {
		links := []layers.LinkType{layers.LinkTypeEthernet, layers.LinkTypeRaw, layers.LinkTypeLinuxSLL, layers.LinkTypeIPv6}
		link := links[int(linkSel)%len(links)]
		fr, ok := Split(link, data)
		if s := InferGSOSize(link, data); s != 0 && (!ok || s >= len(fr.RoCE)) {
			t.Fatalf("inferred segment size %d of a %d-byte RoCE payload (split %v)", s, len(fr.RoCE), ok)
		}
		segs := SplitGSO(link, data, segSize)
		if segs == nil {
			return
		}
		var pay []byte
		for i, d := range segs {
			s, ok := Split(link, d)
			if !ok {
				t.Fatalf("segment %d of %d does not split", i+1, len(segs))
			}
			if i < len(segs)-1 && len(s.RoCE) != segSize || len(s.RoCE) > segSize {
				t.Fatalf("segment %d of %d: %d bytes, segment size %d", i+1, len(segs), len(s.RoCE), segSize)
			}
			pay = append(pay, s.RoCE...)
		}
		if !bytes.Equal(pay, fr.RoCE) {
			t.Fatalf("segments carry %d bytes, the datagram %d", len(pay), len(fr.RoCE))
		}
	})
}
