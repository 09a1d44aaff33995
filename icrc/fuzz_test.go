package icrc_test

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"testing"

	"github.com/rxego/rxego/icrc"
	"github.com/rxego/rxego/internal/capfile"
)

// captureFrames returns a few RoCE frames of each capture (IP header, UDP
// header, RoCE payload), for seeds.
func captureFrames(f *testing.F) []capfile.Frame {
	files, _ := filepath.Glob("../testdata/pcaps/*.pcap*")
	var out []capfile.Frame
	for _, file := range files {
		n := 0
		_ = capfile.Each(file, func(fr capfile.Frame) error {
			if n < 3 {
				out = append(out, fr)
			}
			n++
			return nil
		})
	}
	if len(out) == 0 {
		f.Fatal("no capture seeds")
	}
	return out
}

// FuzzFromHeaders feeds arbitrary IP headers, UDP headers and packets.
// It must not panic; when it accepts them, the result must equal the
// ICRC computed from its definition, and V4.Sum or V6.Sum describing the
// same headers must agree (the fast paths against the slow one).
func FuzzFromHeaders(f *testing.F) {
	for _, fr := range captureFrames(f) {
		f.Add(bytes.Clone(fr.IP), bytes.Clone(fr.UDP), bytes.Clone(fr.RoCE))
		f.Add(bytes.Clone(fr.IP), bytes.Clone(fr.UDP), bytes.Clone(fr.RoCE[:len(fr.RoCE)/2]))
		f.Add(bytes.Clone(fr.IP[:10]), bytes.Clone(fr.UDP), bytes.Clone(fr.RoCE))
	}
	v6 := ipv6Header(icrc.V6{SrcPort: 1, DstPort: 4791}, 16)
	f.Add(v6, udpHeader(1, 4791, 16), make([]byte, 16))
	f.Fuzz(func(t *testing.T, ip, udp, pkt []byte) {
		crc, ok := icrc.FromHeaders(ip, udp, pkt)
		if !ok {
			return
		}
		if len(pkt) < 16 || len(udp) < 8 {
			t.Fatalf("accepted a %d-byte packet with a %d-byte UDP header", len(pkt), len(udp))
		}
		var hdr []byte
		switch ip[0] >> 4 {
		case 4:
			hdr = ip[:int(ip[0]&0xf)*4]
		case 6:
			hdr = ip[:40]
		default:
			t.Fatalf("accepted IP version %d", ip[0]>>4)
		}
		if want := reference(hdr, udp, pkt); crc != want {
			t.Fatalf("FromHeaders %08x, definition %08x", crc, want)
		}
		// The V4/V6 descriptions cover headers whose lengths match pkt.
		sport, dport := binary.BigEndian.Uint16(udp), binary.BigEndian.Uint16(udp[2:])
		if int(binary.BigEndian.Uint16(udp[4:])) != 8+len(pkt) {
			return
		}
		// Branch on the version, not the length: an IPv4 header with
		// options (IHL 10) is 40 bytes long too.
		switch v4 := hdr[0]>>4 == 4; {
		case v4 && len(hdr) == 20 && hdr[9] == 17 && int(binary.BigEndian.Uint16(hdr[2:])) == 28+len(pkt) &&
			hdr[6]&^0x40 == 0 && hdr[7] == 0:
			v := icrc.V4{SrcPort: sport, DstPort: dport, DF: hdr[6] == 0x40}
			copy(v.Src[:], hdr[12:16])
			copy(v.Dst[:], hdr[16:20])
			if got := v.Sum(binary.BigEndian.Uint16(hdr[4:]), pkt); got != crc {
				t.Fatalf("V4.Sum %08x, FromHeaders %08x", got, crc)
			}
		case !v4 && hdr[6] == 17 && int(binary.BigEndian.Uint16(hdr[4:])) == 8+len(pkt):
			v := icrc.V6{SrcPort: sport, DstPort: dport}
			copy(v.Src[:], hdr[8:24])
			copy(v.Dst[:], hdr[24:40])
			if got := v.Sum(pkt); got != crc {
				t.Fatalf("V6.Sum %08x, FromHeaders %08x", got, crc)
			}
		}
	})
}

// FuzzRecover feeds arbitrary packets and flow descriptions to
// V4.Recover: it must not panic, and an ID it returns must satisfy Check.
// A packet filled for a given ID must recover exactly that ID.
func FuzzRecover(f *testing.F) {
	for _, fr := range captureFrames(f) {
		f.Add(bytes.Clone(fr.RoCE), uint32(binary.BigEndian.Uint32(fr.IP[12:])), uint32(binary.BigEndian.Uint32(fr.IP[16:])),
			binary.BigEndian.Uint16(fr.UDP), true, uint16(0))
		f.Add(bytes.Clone(fr.RoCE[:len(fr.RoCE)-1]), uint32(1), uint32(2), uint16(3), false, uint16(0xbeef))
	}
	f.Fuzz(func(t *testing.T, pkt []byte, src, dst uint32, sport uint16, df bool, id uint16) {
		v := icrc.V4{SrcPort: sport, DstPort: 4791, DF: df}
		binary.BigEndian.PutUint32(v.Src[:], src)
		binary.BigEndian.PutUint32(v.Dst[:], dst)
		if got, ok := v.Recover(pkt); ok && !v.Check(got, pkt) {
			t.Fatalf("Recover gave ID %d, which does not check", got)
		}
		if len(pkt) < 16 {
			return
		}
		pkt = bytes.Clone(pkt)
		v.Fill(id, pkt)
		if got, ok := v.Recover(pkt); !ok || got != id {
			t.Fatalf("filled for ID %d, Recover = %d, %v", id, got, ok)
		}
	})
}
