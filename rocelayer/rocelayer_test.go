package rocelayer_test

import (
	"bytes"
	"errors"
	"net"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/icrc"
	"github.com/rxego/rxego/internal/capfile"
	"github.com/rxego/rxego/rocelayer"
)

func captures(t testing.TB) []string {
	t.Helper()
	files, _ := filepath.Glob("../testdata/pcaps/*.pcap*")
	if len(files) == 0 {
		t.Fatal("no captures in testdata/pcaps")
	}
	return files
}

func roceOf(t *testing.T, p gopacket.Packet) *rocelayer.RoCE {
	t.Helper()
	r, ok := p.Layer(rocelayer.LayerTypeRoCE).(*rocelayer.RoCE)
	if !ok {
		t.Fatalf("no RoCE layer; layers %v, error %v", p.Layers(), p.ErrorLayer())
	}
	return r
}

// TestCaptures decodes every RoCE frame of every capture with plain
// gopacket code and checks the layer against bth's own decoding, the ICRC
// check, and that re-serialising the decoded layers gives the frame back.
func TestCaptures(t *testing.T) {
	n := 0
	for _, f := range captures(t) {
		err := capfile.Each(f, func(fr capfile.Frame) error {
			n++
			where := filepath.Base(f) + " frame " + strconv.Itoa(fr.Number)
			for _, lazy := range []bool{false, true} {
				opts := gopacket.Default
				opts.Lazy = lazy
				p := gopacket.NewPacket(fr.Data, layers.LayerTypeEthernet, opts)
				r, ok := p.Layer(rocelayer.LayerTypeRoCE).(*rocelayer.RoCE)
				if !ok {
					t.Fatalf("%s: no RoCE layer (%v)", where, p.ErrorLayer())
				}
				want, err := bth.Parse(fr.RoCE)
				if err != nil {
					t.Fatalf("%s: bth.Parse: %v", where, err)
				}
				if r.Header != want.Decode() {
					t.Errorf("%s: header %+v, want %+v", where, r.Header, want.Decode())
				}
				if !bytes.Equal(r.LayerContents(), fr.RoCE[:want.Info.HdrLen]) ||
					!bytes.Equal(r.LayerPayload(), want.Payload()) || r.ICRC != want.ICRC() {
					t.Errorf("%s: contents/payload/ICRC differ from bth", where)
				}
				if !r.ICRCChecked || !r.ICRCValid {
					t.Errorf("%s (lazy %v): ICRC checked %v valid %v", where, lazy, r.ICRCChecked, r.ICRCValid)
				}
				if len(r.Payload) > 0 {
					app := p.ApplicationLayer()
					if app == nil || !bytes.Equal(app.Payload(), want.Payload()) {
						t.Errorf("%s: application layer is not the RoCE payload", where)
					}
				}
			}
			p := gopacket.NewPacket(fr.Data, layers.LayerTypeEthernet, gopacket.Default)
			buf := gopacket.NewSerializeBuffer()
			if err := gopacket.SerializePacket(buf, gopacket.SerializeOptions{}, p); err != nil {
				t.Fatalf("%s: SerializePacket: %v", where, err)
			}
			if !bytes.Equal(buf.Bytes(), fr.Data) {
				t.Errorf("%s: re-serialised frame differs\n%x\nwant\n%x", where, buf.Bytes(), fr.Data)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d RoCE frames", n)
}

// TestSerializeComputesICRC rebuilds capture frames with the ICRC zeroed
// and SetNetworkLayerForICRC: the computed ICRC must be rxe's.
func TestSerializeComputesICRC(t *testing.T) {
	for _, f := range captures(t) {
		err := capfile.Each(f, func(fr capfile.Frame) error {
			p := gopacket.NewPacket(fr.Data, layers.LayerTypeEthernet, gopacket.Default)
			r := roceOf(t, p)
			ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
			udp := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
			eth := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
			r.ICRC = 0
			if err := r.SetNetworkLayerForICRC(ip, udp); err != nil {
				t.Fatal(err)
			}
			buf := gopacket.NewSerializeBuffer()
			err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, eth, ip, udp, r,
				gopacket.Payload(r.LayerPayload()))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), fr.Data) {
				t.Errorf("%s frame %d: serialised with computed ICRC differs", filepath.Base(f), fr.Number)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// build serialises a RoCE packet over Ethernet and ip with a computed ICRC.
func build(t *testing.T, ip gopacket.SerializableLayer, h bth.Header, payload []byte) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}}
	udp := &layers.UDP{SrcPort: 49152, DstPort: rocelayer.Port}
	r := &rocelayer.RoCE{Header: h}
	switch v := ip.(type) {
	case *layers.IPv4:
		eth.EthernetType = layers.EthernetTypeIPv4
		if err := r.SetNetworkLayerForICRC(v, udp); err != nil {
			t.Fatal(err)
		}
	case *layers.IPv6:
		eth.EthernetType = layers.EthernetTypeIPv6
		if err := r.SetNetworkLayerForICRC(v, udp); err != nil {
			t.Fatal(err)
		}
	}
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true}
	if err := gopacket.SerializeLayers(buf, opts, eth, ip, udp, r, gopacket.Payload(payload)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func ipv4() *layers.IPv4 {
	return &layers.IPv4{Version: 4, TTL: 64, Id: 0x1234, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
		SrcIP: net.IPv4(198, 18, 0, 1).To4(), DstIP: net.IPv4(198, 18, 0, 2).To4()}
}

func ipv6() *layers.IPv6 {
	return &layers.IPv6{Version: 6, TrafficClass: 0x12, FlowLabel: 0xabcde, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
		SrcIP: net.ParseIP("fd00::1"), DstIP: net.ParseIP("fd00::2")}
}

// TestBuildAndDecode writes packets with gopacket.SerializeLayers over IPv4
// and IPv6 (odd payload lengths, so pad bytes), decodes them back, and
// checks fields, pad and ICRC, then that a corrupted byte fails the check.
func TestBuildAndDecode(t *testing.T) {
	h := bth.Header{Opcode: bth.RCWriteOnlyImm, SE: true, PKey: bth.DefaultPKey, FECN: true, DestQP: 0x123456,
		AckReq: true, PSN: 0xfffffe, RETH: bth.RETHFields{VA: 1<<63 + 5, RKey: 0xdeadbeef, DMALen: 5}, Imm: 0xcafef00d}
	for _, ip := range []gopacket.SerializableLayer{ipv4(), ipv6()} {
		payload := []byte("hello")
		frame := build(t, ip, h, payload)
		p := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
		r := roceOf(t, p)
		want := h
		want.Pad = 3
		if r.Header != want {
			t.Errorf("%v: header %+v, want %+v", ip.LayerType(), r.Header, want)
		}
		if !bytes.Equal(r.LayerPayload(), payload) || !bytes.Equal(r.Padding, []byte{0, 0, 0}) {
			t.Errorf("%v: payload %q pad %x", ip.LayerType(), r.LayerPayload(), r.Padding)
		}
		if !r.ICRCChecked || !r.ICRCValid {
			t.Errorf("%v: ICRC checked %v valid %v", ip.LayerType(), r.ICRCChecked, r.ICRCValid)
		}
		bad := append([]byte(nil), frame...)
		bad[len(bad)-10] ^= 1 // a payload byte
		r = roceOf(t, gopacket.NewPacket(bad, layers.LayerTypeEthernet, gopacket.Default))
		if !r.ICRCChecked || r.ICRCValid {
			t.Errorf("%v: corrupted packet: ICRC checked %v valid %v", ip.LayerType(), r.ICRCChecked, r.ICRCValid)
		}
	}
}

// TestSourcePort checks that the layer is found when 4791 is the source
// port (a reply to a peer that used 4791 as its own source port).
func TestSourcePort(t *testing.T) {
	h := bth.Header{Opcode: bth.RCAck, PKey: bth.DefaultPKey, DestQP: 17, PSN: 3}
	frame := build(t, ipv4(), h, nil)
	// Swap the UDP ports in place: the UDP header starts at 14+20.
	u := frame[34:]
	u[0], u[1], u[2], u[3] = u[2], u[3], u[0], u[1]
	r := roceOf(t, gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default))
	if r.Header.Opcode != bth.RCAck || r.ICRCValid {
		// The ICRC covers the ports, so swapping them must break it.
		t.Errorf("opcode %v, ICRC valid %v", r.Header.Opcode, r.ICRCValid)
	}
}

// TestMalformed checks that bad RoCE packets give a decode failure with
// the bth error and no RoCE layer, and a snap-length-truncated datagram
// gives ErrTruncated.
func TestMalformed(t *testing.T) {
	h := bth.Header{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: 17, PSN: 3}
	good := build(t, ipv4(), h, make([]byte, 64))
	cases := []struct {
		name  string
		frame []byte
		want  error
	}{
		{"tver", func() []byte { b := bytes.Clone(good); b[42+1] |= 1; return b }(), bth.ErrTVer},
		{"opcode", func() []byte { b := bytes.Clone(good); b[42] = 0x1f; return b }(), bth.ErrUnknownOpcode},
		{"snap", good[:len(good)-20], rocelayer.ErrTruncated},
	}
	for _, c := range cases {
		p := gopacket.NewPacket(c.frame, layers.LayerTypeEthernet, gopacket.Default)
		if p.Layer(rocelayer.LayerTypeRoCE) != nil {
			t.Errorf("%s: RoCE layer decoded from a bad packet", c.name)
		}
		el := p.ErrorLayer()
		if el == nil || !errors.Is(el.Error(), c.want) {
			t.Errorf("%s: error layer %v, want %v", c.name, el, c.want)
		}
	}
}

// TestDecodingLayerParser uses the layer through gopacket's allocation-free
// parser, which has no IP context: the ICRC is then not checked.
func TestDecodingLayerParser(t *testing.T) {
	h := bth.Header{Opcode: bth.UDSendOnly, PKey: bth.DefaultPKey, DestQP: 1, PSN: 9, DETH: bth.DETHFields{QKey: 0x80010000, SrcQP: 1}}
	frame := build(t, ipv4(), h, make([]byte, 256))
	var (
		eth     layers.Ethernet
		ip      layers.IPv4
		udp     layers.UDP
		r       rocelayer.RoCE
		payload gopacket.Payload
	)
	parser := gopacket.NewDecodingLayerParser(layers.LayerTypeEthernet, &eth, &ip, &udp, &r, &payload)
	var decoded []gopacket.LayerType
	if err := parser.DecodeLayers(frame, &decoded); err != nil {
		t.Fatal(err)
	}
	if len(decoded) != 5 || decoded[3] != rocelayer.LayerTypeRoCE {
		t.Fatalf("decoded %v", decoded)
	}
	if r.Header.DETH.QKey != 0x80010000 || len(payload) != 256 || r.ICRCChecked {
		t.Errorf("DETH %+v payload %d checked %v", r.Header.DETH, len(payload), r.ICRCChecked)
	}
	crc, _ := icrc.FromHeaders(ip.Contents, udp.Contents, udp.Payload)
	if crc != r.ICRC {
		t.Errorf("ICRC %08x, computed %08x", r.ICRC, crc)
	}
}

// TestSerializeRejects checks that bad input is an error and leaves the
// buffer as it was.
func TestSerializeRejects(t *testing.T) {
	cases := []struct {
		h       bth.Header
		payload []byte
		want    error
	}{
		{bth.Header{Opcode: 0x1f}, nil, bth.ErrUnknownOpcode},
		{bth.Header{Opcode: bth.RCAck}, []byte{1}, bth.ErrPayload},
		{bth.Header{Opcode: bth.RCAtomicWrite}, []byte{1, 2, 3}, bth.ErrAtomicWrite},
	}
	for _, c := range cases {
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.Payload(c.payload).SerializeTo(buf, gopacket.SerializeOptions{}); err != nil {
			t.Fatal(err)
		}
		r := &rocelayer.RoCE{Header: c.h}
		if err := r.SerializeTo(buf, gopacket.SerializeOptions{}); !errors.Is(err, c.want) {
			t.Errorf("%v: err %v, want %v", c.h.Opcode, err, c.want)
		}
		if !bytes.Equal(buf.Bytes(), c.payload) {
			t.Errorf("%v: buffer changed to %x", c.h.Opcode, buf.Bytes())
		}
	}
	r := &rocelayer.RoCE{}
	if err := r.SetNetworkLayerForICRC(&layers.IPv4{Options: []layers.IPv4Option{{OptionType: 1}}}, &layers.UDP{}); !errors.Is(err, rocelayer.ErrIPv4Options) {
		t.Errorf("IPv4 options: %v", err)
	}
	if err := r.SetNetworkLayerForICRC(ipv4(), nil); !errors.Is(err, rocelayer.ErrICRCLayers) {
		t.Errorf("no UDP: %v", err)
	}
}

// TestDecodeFromBytesAllocs checks that reusing a layer with
// DecodingLayerParser style decoding allocates nothing per packet.
func TestDecodeFromBytesAllocs(t *testing.T) {
	h := bth.Header{Opcode: bth.RCWriteFirst, PKey: bth.DefaultPKey, DestQP: 17, PSN: 1, RETH: bth.RETHFields{VA: 1, RKey: 2, DMALen: 4096}}
	pkt := make([]byte, bth.PacketLen(h.Opcode, 1024))
	if _, err := h.Encode(pkt, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	var r rocelayer.RoCE
	if a := testing.AllocsPerRun(100, func() { _ = r.DecodeFromBytes(pkt, gopacket.NilDecodeFeedback) }); a != 0 {
		t.Errorf("DecodeFromBytes: %v allocs", a)
	}
	if r.Header != h {
		t.Errorf("decoded %+v", r.Header)
	}
}
