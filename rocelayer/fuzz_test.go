package rocelayer_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/capfile"
	"github.com/rxego/rxego/rocelayer"
)

// frameSeeds adds a few whole frames of each capture, and truncated
// copies, with add.
func frameSeeds(f *testing.F, add func(frame, roce []byte)) {
	n := 0
	for _, file := range captures(f) {
		i := 0
		_ = capfile.Each(file, func(fr capfile.Frame) error {
			if i < 3 {
				add(bytes.Clone(fr.Data), bytes.Clone(fr.RoCE))
				add(bytes.Clone(fr.Data[:len(fr.Data)-5]), bytes.Clone(fr.RoCE[:len(fr.RoCE)/2]))
				n++
			}
			i++
			return nil
		})
	}
	if n == 0 {
		f.Fatal("no capture seeds")
	}
}

// FuzzDecodeFromBytes decodes arbitrary UDP payloads: the layer must
// agree with bth.Parse, accept exactly what it accepts, cover the bytes
// exactly (contents, payload, padding, ICRC), and re-serialise to the same
// bytes apart from what Encode zeroes (see bth's FuzzParse).
func FuzzDecodeFromBytes(f *testing.F) {
	frameSeeds(f, func(_, roce []byte) { f.Add(roce) })
	f.Fuzz(func(t *testing.T, data []byte) {
		r := rocelayer.RoCE{ICRC: 0xdeadbeef}
		err := r.DecodeFromBytes(data, gopacket.NilDecodeFeedback)
		p, perr := bth.Parse(data)
		if (err == nil) != (perr == nil) || (err != nil && !errors.Is(err, perr)) {
			t.Fatalf("layer error %v, bth.Parse %v", err, perr)
		}
		if err != nil {
			if r.ICRC != 0xdeadbeef || r.Contents != nil {
				t.Fatal("failed decode changed the layer")
			}
			return
		}
		if r.Header != p.Decode() || len(r.Contents)+len(r.Payload)+len(r.Padding)+bth.ICRCLen != len(data) ||
			!bytes.Equal(r.Contents, data[:p.Info.HdrLen]) || r.ICRC != p.ICRC() {
			t.Fatal("layer disagrees with bth.Parse")
		}
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{}, &r, gopacket.Payload(r.Payload)); err != nil {
			t.Fatalf("serialise: %v", err)
		}
		out := buf.Bytes()
		if len(out) != len(data) || !bytes.Equal(out[len(r.Contents):len(r.Contents)+len(r.Payload)], r.Payload) ||
			icrcOf(out) != r.ICRC {
			t.Fatalf("serialised\n%x\nfrom\n%x", out, data)
		}
		if q, err := bth.Parse(out); err != nil || q.Decode() != r.Header {
			t.Fatalf("serialised packet re-parses as %v", err)
		}
	})
}

func icrcOf(pkt []byte) uint32 {
	return uint32(pkt[len(pkt)-4]) | uint32(pkt[len(pkt)-3])<<8 | uint32(pkt[len(pkt)-2])<<16 | uint32(pkt[len(pkt)-1])<<24
}

// FuzzEthernet decodes arbitrary Ethernet frames through gopacket: no
// panic in this package, and a RoCE layer only over a payload bth accepts.
func FuzzEthernet(f *testing.F) {
	frameSeeds(f, func(frame, _ []byte) { f.Add(frame) })
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, lazy := range []bool{false, true} {
			p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.DecodeOptions{Lazy: lazy})
			// gopacket turns a decoder panic into a DecodeFailure with the
			// stack; one that went through this package is ours.
			if df, ok := p.ErrorLayer().(*gopacket.DecodeFailure); ok && strings.Contains(df.Dump(), "rocelayer") {
				t.Fatalf("decoder panicked: %v\n%s", df.Error(), df.Dump())
			}
			r, ok := p.Layer(rocelayer.LayerTypeRoCE).(*rocelayer.RoCE)
			if !ok {
				continue
			}
			udp, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
			if udp == nil {
				t.Fatal("RoCE layer without a UDP layer")
			}
			if _, err := bth.Parse(udp.Payload); err != nil {
				t.Fatalf("RoCE layer over a payload bth rejects: %v", err)
			}
			if r.ICRCValid && !r.ICRCChecked {
				t.Fatal("ICRC valid but not checked")
			}
		}
	})
}
