// Package pcaptap records what a transport.Conn sends and receives as a
// pcapng file that Wireshark, tshark and `rxego trace` open directly.
//
// A Conn hands its Tap the RoCE packet (BTH through ICRC) with the
// addresses, TOS and IPv4 Identification, but not the Ethernet, IP and UDP
// headers: the kernel writes those. The Writer rebuilds them as the kernel
// writes them for rxego's sockets (see the transport package): IPv4 with
// DF set, TTL 64, the TOS and IP ID the Conn reports and a correct header
// checksum; IPv6 with hop limit 64, the traffic class and flow label 0;
// UDP checksum 0 over IPv4 (what rxego and rxe send without GSO) and a
// computed one over IPv6 (where zero is not allowed and the kernel
// computes it). Ethernet addresses are made up from the IP addresses
// (02:00 followed by the address's last four bytes). The ICRC covers the
// IP ID, flags and lengths, so a rebuilt packet's ICRC checks exactly when
// the rebuilt headers are the ones that were on the wire; tests check that
// for every packet written.
//
// Each local address gets its own pcapng interface, named "rxego
// ADDRESS"; each packet carries the pcapng direction flag (inbound or
// outbound), and received packets the transport dropped (bad ICRC, not
// RoCE, ...) are written too, with a comment saying why.
package pcaptap

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/rxego/rxego/internal/inetsum"
	"github.com/rxego/rxego/internal/iphdr"
	"github.com/rxego/rxego/transport"
)

// Header sizes of the rebuilt frames.
const (
	ethLen  = 14
	ipv4Len = iphdr.IPv4Len
	ipv6Len = iphdr.IPv6Len
	udpLen  = iphdr.UDPLen
	// TTL is the IPv4 TTL and IPv6 hop limit written: Linux's default,
	// which rxe and rxego's sockets use.
	TTL = 64
)

// Writer is a transport.Tap that writes every packet to a pcapng stream.
// Its methods are safe for concurrent use. Write errors are sticky: the
// first one stops the writing and is returned by Err, Flush and Close.
type Writer struct {
	mu      sync.Mutex
	out     io.Writer
	closer  io.Closer // the file Create opened; nil for New
	ng      *pcapgo.NgWriter
	ifaces  map[netip.Addr]int
	frame   []byte
	err     error
	packets int
	closed  bool
}

var _ transport.Tap = (*Writer)(nil)

// ErrClosed is returned by Writer methods after Close.
var ErrClosed = errors.New("pcaptap: writer closed")

// New returns a Writer writing pcapng to w. Nothing is written until the
// first packet or Close, so the first interface is named after the first
// local address seen.
func New(w io.Writer) *Writer {
	return &Writer{out: w, ifaces: map[netip.Addr]int{}}
}

// Create creates (or truncates) the file at path and returns a Writer to
// it; Close closes the file.
func Create(path string) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := New(bufio.NewWriterSize(f, 256<<10))
	w.closer = f
	return w, nil
}

// Packet implements transport.Tap.
func (w *Writer) Packet(dir transport.Dir, at time.Time, local, remote netip.AddrPort, tos uint8, ipID uint16, pkt []byte) {
	flag := pcapgo.NgEpbFlagDirectionOutbound
	if dir == transport.In {
		flag = pcapgo.NgEpbFlagDirectionInbound
	}
	w.write(dir, at, local, remote, tos, ipID, pkt, flag, "")
}

// Drop implements transport.Tap: the packet is written as received, with a
// comment naming the reason. The IP ID of a dropped packet is not known
// and written as 0.
func (w *Writer) Drop(reason transport.DropReason, at time.Time, local, remote netip.AddrPort, tos uint8, pkt []byte) {
	w.write(transport.In, at, local, remote, tos, 0, pkt, pcapgo.NgEpbFlagDirectionInbound, "rxego: dropped on receive: "+reason.String())
}

// write rebuilds one frame and appends it to the file.
func (w *Writer) write(dir transport.Dir, at time.Time, local, remote netip.AddrPort, tos uint8, ipID uint16, pkt []byte, flag pcapgo.NgEpbFlag, comment string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil || w.closed {
		return
	}
	src, dst := local, remote
	if dir == transport.In {
		src, dst = remote, local
	}
	var ok bool
	w.frame, ok = AppendFrame(w.frame[:0], src, dst, tos, ipID, pkt)
	if !ok {
		return // mixed families or a packet too long for one datagram: nothing faithful to write
	}
	id, err := w.iface(local.Addr())
	if err != nil {
		w.err = err
		return
	}
	ci := gopacket.CaptureInfo{Timestamp: at, CaptureLength: len(w.frame), Length: len(w.frame), InterfaceIndex: id}
	opts := pcapgo.NgPacketOptions{Flags: &pcapgo.NgEpbFlags{Direction: flag}}
	if comment != "" {
		opts.Comments = []string{comment}
	}
	if err := w.ng.WritePacketWithOptions(ci, w.frame, opts); err != nil {
		w.err = err
		return
	}
	w.packets++
}

// iface returns the pcapng interface of a local address, adding it (and
// starting the file) on first use. Called with mu held.
func (w *Writer) iface(local netip.Addr) (int, error) {
	if id, ok := w.ifaces[local]; ok {
		return id, nil
	}
	intf := pcapgo.NgInterface{Name: "rxego " + local.String(), LinkType: layers.LinkTypeEthernet,
		Description: "rxego RoCEv2 endpoint; link, IP and UDP headers rebuilt by rxego", OS: "rxego"}
	var id int
	var err error
	if w.ng == nil {
		w.ng, err = pcapgo.NewNgWriterInterface(w.out, intf, pcapgo.NgWriterOptions{
			SectionInfo: pcapgo.NgSectionInfo{Application: "rxego"}})
	} else {
		id, err = w.ng.AddInterface(intf)
	}
	if err != nil {
		return 0, err
	}
	w.ifaces[local] = id
	return id, nil
}

// Packets returns how many frames were written so far.
func (w *Writer) Packets() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.packets
}

// Err returns the first write error, if any.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Flush writes buffered frames out, so that a reader of the file sees
// everything up to now.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.flush()
}

// flush is Flush with mu held.
func (w *Writer) flush() error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return ErrClosed
	}
	if w.ng != nil {
		if err := w.ng.Flush(); err != nil {
			w.err = err
			return err
		}
	}
	if f, ok := w.out.(interface{ Flush() error }); ok {
		if err := f.Flush(); err != nil {
			w.err = err
		}
	}
	return w.err
}

// Close flushes the stream (writing a valid empty capture if no packet
// came) and closes the file Create opened. Packets tapped after Close are
// ignored. Detach the Writer from its Conn first (SetTap(nil)) so no
// packet is lost.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	if w.ng == nil && w.err == nil {
		_, w.err = w.iface(netip.IPv4Unspecified())
	}
	err := w.flush()
	w.closed = true
	if w.closer != nil {
		err = errors.Join(err, w.closer.Close())
	}
	return err
}

// AppendFrame appends to b the Ethernet frame carrying the RoCE packet pkt
// from src to dst, with the IP and UDP headers rebuilt as described in the
// package documentation. ok is false when src and dst are of different
// families or pkt does not fit in one IP datagram.
func AppendFrame(b []byte, src, dst netip.AddrPort, tos uint8, ipID uint16, pkt []byte) (_ []byte, ok bool) {
	s, d := src.Addr().Unmap(), dst.Addr().Unmap()
	v4 := s.Is4()
	if v4 != d.Is4() || !s.IsValid() || !d.IsValid() {
		return b, false
	}
	ulen := udpLen + len(pkt)
	if ulen > 0xffff || (v4 && ipv4Len+ulen > 0xffff) {
		return b, false
	}
	b = append(b, mac(d)...)
	b = append(b, mac(s)...)
	if v4 {
		b = binary.BigEndian.AppendUint16(b, uint16(layers.EthernetTypeIPv4))
		b = append(b, make([]byte, ipv4Len)...)
		ip := iphdr.IPv4(b[len(b)-ipv4Len:])
		ip.Encode(&iphdr.IPv4Fields{TOS: tos, TotalLength: uint16(ipv4Len + ulen), ID: ipID, DF: true, TTL: TTL,
			Protocol: iphdr.ProtoUDP, Src: s.As4(), Dst: d.As4()})
		ip.SetChecksum(inetsum.IPv4(ip))
		b = appendUDP(b, src, dst, ulen, pkt)
	} else {
		b = binary.BigEndian.AppendUint16(b, uint16(layers.EthernetTypeIPv6))
		b = append(b, make([]byte, ipv6Len)...)
		iphdr.IPv6(b[len(b)-ipv6Len:]).Encode(&iphdr.IPv6Fields{TrafficClass: tos, PayloadLength: uint16(ulen),
			NextHeader: iphdr.ProtoUDP, HopLimit: TTL, Src: s.As16(), Dst: d.As16()})
		b = appendUDP(b, src, dst, ulen, pkt)
		ip, u := iphdr.IPv6(b[len(b)-ulen-ipv6Len:]), iphdr.UDP(b[len(b)-ulen:])
		u.SetChecksum(inetsum.UDP(ip.Addrs(), u))
	}
	return b, true
}

// appendUDP appends the UDP header (checksum 0) and pkt.
func appendUDP(b []byte, src, dst netip.AddrPort, ulen int, pkt []byte) []byte {
	b = append(b, make([]byte, udpLen)...)
	iphdr.UDP(b[len(b)-udpLen:]).Encode(&iphdr.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: uint16(ulen)})
	return append(b, pkt...)
}

// mac makes a locally administered unicast Ethernet address from an IP
// address, so each endpoint of a capture has its own.
func mac(a netip.Addr) []byte {
	s := a.AsSlice()
	return append([]byte{0x02, 0x00}, s[len(s)-4:]...)
}
