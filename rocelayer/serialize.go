package rocelayer

import (
	"errors"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/icrc"
)

// Serialisation errors.
var (
	ErrICRCLayers  = errors.New("rocelayer: ICRC needs an *layers.IPv4 or *layers.IPv6 and a *layers.UDP")
	ErrIPv4Options = errors.New("rocelayer: cannot compute the ICRC over an IPv4 header with options")
)

// SetNetworkLayerForICRC makes SerializeTo compute the ICRC for the IP
// header ip (*layers.IPv4 or *layers.IPv6) and UDP header udp the packet
// will be sent in, like layers.UDP's SetNetworkLayerForChecksum. The ICRC
// is computed from their addresses, ports, IPv4 ID and DF bit, and from the
// lengths the packet will have (as SerializeOptions.FixLengths writes them);
// IPv4 options are not supported. Pass nils to go back to writing r.ICRC.
func (r *RoCE) SetNetworkLayerForICRC(ip gopacket.NetworkLayer, udp *layers.UDP) error {
	if ip == nil && udp == nil {
		r.icrcIP, r.icrcUDP = nil, nil
		return nil
	}
	switch v := ip.(type) {
	case *layers.IPv4:
		if len(v.Options) > 0 {
			return ErrIPv4Options
		}
	case *layers.IPv6:
	default:
		return ErrICRCLayers
	}
	if udp == nil {
		return ErrICRCLayers
	}
	r.icrcIP, r.icrcUDP = ip, udp
	return nil
}

// SerializeTo writes the RoCE packet around the bytes already in b, which
// are the payload (serialise a gopacket.Payload after this layer, as with
// UDP): the headers of r.Header are prepended, and pad bytes and the ICRC
// appended. The pad count is derived from the payload length. The ICRC is
// computed when SetNetworkLayerForICRC was called, and is r.ICRC otherwise,
// so a decoded packet re-serialises byte for byte. On a bad header or a
// payload the opcode does not allow, b is left unchanged.
func (r *RoCE) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	plen := len(b.Bytes())
	// Encode checks the opcode and payload before it needs any buffer, so a
	// call with none reports bad input without touching b.
	if _, err := r.Header.Encode(nil, b.Bytes()); !errors.Is(err, bth.ErrBufferSmall) {
		return err
	}
	in := r.Header.Opcode.Info()
	if _, err := b.PrependBytes(in.HdrLen); err != nil {
		return err
	}
	if _, err := b.AppendBytes(bth.PadFor(plen) + bth.ICRCLen); err != nil {
		return err
	}
	pkt := b.Bytes()
	// Encode copies the payload onto itself here: the prepend left it at
	// exactly the offset Encode writes it to.
	if _, err := r.Header.Encode(pkt, pkt[in.HdrLen:in.HdrLen+plen]); err != nil {
		return err
	}
	crc := r.ICRC
	if r.icrcIP != nil {
		crc = r.computeICRC(pkt)
	}
	icrc.Put(pkt, crc)
	return nil
}

// computeICRC returns the ICRC of pkt for the layers given to
// SetNetworkLayerForICRC.
func (r *RoCE) computeICRC(pkt []byte) uint32 {
	sport, dport := uint16(r.icrcUDP.SrcPort), uint16(r.icrcUDP.DstPort)
	switch ip := r.icrcIP.(type) {
	case *layers.IPv4:
		v := icrc.V4{SrcPort: sport, DstPort: dport, DF: ip.Flags&layers.IPv4DontFragment != 0}
		copy(v.Src[:], ip.SrcIP.To4())
		copy(v.Dst[:], ip.DstIP.To4())
		return v.Sum(ip.Id, pkt)
	case *layers.IPv6:
		v := icrc.V6{SrcPort: sport, DstPort: dport}
		copy(v.Src[:], ip.SrcIP.To16())
		copy(v.Dst[:], ip.DstIP.To16())
		return v.Sum(pkt)
	}
	return r.ICRC // unreachable: SetNetworkLayerForICRC admits only the two
}
