package bth_test

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/capfile"
	"github.com/rxego/rxego/reth"
)

// captureSeeds adds to f the RoCE payload of the first frame of each
// opcode in every capture, and truncated copies of it.
func captureSeeds(f *testing.F) {
	files, _ := filepath.Glob("../testdata/pcaps/*.pcap*")
	seen := map[byte]bool{}
	for _, file := range files {
		_ = capfile.Each(file, func(fr capfile.Frame) error {
			if len(fr.RoCE) == 0 || seen[fr.RoCE[0]] {
				return nil
			}
			seen[fr.RoCE[0]] = true
			f.Add(bytes.Clone(fr.RoCE))
			for _, n := range []int{len(fr.RoCE) - 1, len(fr.RoCE) - 4, 16, 12, 11, 0} {
				if n >= 0 && n < len(fr.RoCE) {
					f.Add(bytes.Clone(fr.RoCE[:n]))
				}
			}
			return nil
		})
	}
	if len(seen) == 0 {
		f.Fatal("no capture seeds")
	}
}

// FuzzParse feeds arbitrary bytes to Parse. Whatever parses must decode
// and re-encode to the same bytes, except what Encode writes as zero by
// definition: the pad bytes, the ICRC placeholder, the DETH's reserved
// byte and the CNP's reserved body. Every view must stay inside the packet.
func FuzzParse(f *testing.F) {
	captureSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := bth.Parse(data)
		if err != nil {
			if p.Raw != nil || p.Info != nil {
				t.Fatalf("error %v with a non-empty packet", err)
			}
			return
		}
		in := p.Info
		if in.HdrLen+len(p.Payload())+p.BTH().PadCount()+bth.ICRCLen != len(data) {
			t.Fatalf("lengths: header %d payload %d pad %d of %d", in.HdrLen, len(p.Payload()), p.BTH().PadCount(), len(data))
		}
		h := p.Decode()
		buf := make([]byte, len(data)+8)
		n, err := h.Encode(buf, p.Payload())
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if n != len(data) {
			t.Fatalf("re-encoded %d bytes of %d", n, len(data))
		}
		want := bytes.Clone(data)
		clear(want[in.HdrLen+len(p.Payload()):]) // pad and ICRC
		if off := in.Offset(bth.ExtDETH); off >= 0 {
			want[off+4] = 0 // DETH reserved byte
		}
		if off := in.Offset(bth.ExtCNP); off >= 0 {
			clear(want[off : off+reth.CNPLen])
		}
		if !bytes.Equal(buf[:n], want) {
			t.Fatalf("re-encoded\n%x\nwant\n%x", buf[:n], want)
		}
		q, err := bth.Parse(buf[:n])
		if err != nil || q.Decode() != h {
			t.Fatalf("re-parse: %v", err)
		}
	})
}
