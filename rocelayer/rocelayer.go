// Package rocelayer makes RoCEv2 a gopacket layer, so captures and live
// frames decode from Ethernet down to the InfiniBand transport headers with
// ordinary gopacket code:
//
//	p := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
//	if l, ok := p.Layer(rocelayer.LayerTypeRoCE).(*rocelayer.RoCE); ok { ... }
//
// Importing the package registers the layer on UDP port 4791 (either
// direction). One layer covers the whole RoCEv2 packet: its contents are
// the BTH and the opcode's extended headers, its payload (decoded next as a
// gopacket.Payload layer) is the message data without pad bytes, and the
// pad bytes and the ICRC are fields. Parsing is bth.Parse, so the layer
// accepts and rejects exactly what the rxego receive path does.
package rocelayer

import (
	"errors"
	"fmt"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/icrc"
)

// Port is the IANA UDP destination port of RoCEv2.
const Port = 4791

// LayerTypeNumber is the number LayerTypeRoCE is registered under. gopacket
// keeps 0-999 for itself and serves 1000-1999 from an array, so a number in
// that range keeps lookups fast; 1791 echoes the port.
const LayerTypeNumber = 1791

// LayerTypeRoCE is the gopacket layer type of a RoCEv2 packet.
var LayerTypeRoCE = gopacket.RegisterLayerType(LayerTypeNumber, gopacket.LayerTypeMetadata{
	Name:    "RoCEv2",
	Decoder: gopacket.DecodeFunc(decodeRoCE),
})

func init() {
	layers.RegisterUDPPortLayerType(Port, LayerTypeRoCE)
}

// ErrTruncated reports a RoCE packet whose UDP datagram was cut short (by a
// capture's snap length, say): its ICRC and possibly headers are missing.
var ErrTruncated = errors.New("rocelayer: UDP datagram truncated")

// RoCE is a decoded RoCEv2 packet: the UDP payload from the BTH through the
// ICRC. Contents (BaseLayer) are the BTH and extended headers; Payload is
// the message data without pad bytes.
type RoCE struct {
	layers.BaseLayer

	// Header holds every header field as a value; Encode of it with
	// Payload reproduces the packet (see bth.Header).
	Header bth.Header
	// Parsed is the zero-copy view of the packet, as bth.Parse returns it.
	// It is empty for a layer built by hand for serialisation.
	Parsed bth.Packet
	// Padding holds the 0..3 pad bytes after the payload.
	Padding []byte
	// ICRC is the invariant CRC as stored, read little-endian (the value
	// hash/crc32 computes; Wireshark shows the same bytes read big-endian).
	// SerializeTo writes it verbatim unless SetNetworkLayerForICRC was
	// called.
	ICRC uint32
	// ICRCChecked is true when the decoder saw the IP and UDP headers the
	// packet came in, and so could check the ICRC.
	ICRCChecked bool
	// ICRCValid reports whether the ICRC matched; meaningful only when
	// ICRCChecked is true.
	ICRCValid bool

	icrcIP  gopacket.NetworkLayer
	icrcUDP *layers.UDP
}

// LayerType returns LayerTypeRoCE.
func (r *RoCE) LayerType() gopacket.LayerType { return LayerTypeRoCE }

// CanDecode returns LayerTypeRoCE, for gopacket.DecodingLayerParser.
func (r *RoCE) CanDecode() gopacket.LayerClass { return LayerTypeRoCE }

// NextLayerType returns gopacket.LayerTypePayload: the message data.
func (r *RoCE) NextLayerType() gopacket.LayerType { return gopacket.LayerTypePayload }

// DecodeFromBytes decodes data, a UDP payload from the BTH through the
// ICRC, reusing r. The layer's slices alias data. It does not check the
// ICRC, which needs the IP and UDP headers; the gopacket decoder does (see
// ICRCChecked). On error r is left unchanged.
func (r *RoCE) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	p, err := bth.Parse(data)
	if err != nil {
		if errors.Is(err, bth.ErrTruncated) {
			df.SetTruncated()
		}
		return err
	}
	payload := p.Payload()
	end := len(data) - bth.ICRCLen
	*r = RoCE{
		BaseLayer: layers.BaseLayer{Contents: data[:p.Info.HdrLen], Payload: payload},
		Header:    p.Decode(),
		Parsed:    p,
		Padding:   data[end-p.BTH().PadCount() : end],
		ICRC:      p.ICRC(),
	}
	return nil
}

// decodeRoCE is the gopacket decoder registered for LayerTypeRoCE. Beyond
// DecodeFromBytes it looks back for the UDP and IP layers the packet came
// in, to reject a truncated datagram and to check the ICRC.
func decodeRoCE(data []byte, pb gopacket.PacketBuilder) error {
	ip, udp := enclosing(pb)
	if udp != nil && int(udp.Length) > 8+len(data) {
		pb.SetTruncated()
		return fmt.Errorf("%w: %d of %d payload bytes", ErrTruncated, len(data), int(udp.Length)-8)
	}
	r := &RoCE{}
	if err := r.DecodeFromBytes(data, pb); err != nil {
		return err
	}
	if ip != nil && udp != nil {
		crc, ok := icrc.FromHeaders(ip.LayerContents(), udp.LayerContents(), data)
		r.ICRCChecked = ok
		r.ICRCValid = ok && crc == r.ICRC
	}
	pb.AddLayer(r)
	return pb.NextDecoder(gopacket.LayerTypePayload)
}

// enclosing finds the UDP layer that carried the packet being decoded and
// the IP layer nearest before it. The PacketBuilder gopacket hands to
// decoders is the packet under construction; its Layers method returns the
// layers decoded so far without decoding further, for eager and lazy
// packets alike. Either result is nil when not found.
func enclosing(pb gopacket.PacketBuilder) (ip gopacket.Layer, udp *layers.UDP) {
	lister, ok := pb.(interface{ Layers() []gopacket.Layer })
	if !ok {
		return nil, nil
	}
	ls := lister.Layers()
	if len(ls) == 0 {
		return nil, nil
	}
	udp, ok = ls[len(ls)-1].(*layers.UDP)
	if !ok {
		return nil, nil
	}
	for i := len(ls) - 2; i >= 0; i-- {
		switch ls[i].(type) {
		case *layers.IPv4, *layers.IPv6:
			return ls[i], udp
		}
	}
	return nil, udp
}
