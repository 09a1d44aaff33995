package cm

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// PortSpace is an rdma_cm port space (enum rdma_ucm_port_space): the
// upper bits of a service ID.
type PortSpace uint16

// rdma_cm port spaces.
const (
	PortSpaceIPoIB PortSpace = 0x0002
	PortSpaceTCP   PortSpace = 0x0106 // RDMA_PS_TCP: RC connections, what rping uses
	PortSpaceUDP   PortSpace = 0x0111
	PortSpaceIB    PortSpace = 0x013f
)

// ServiceID returns the IB service ID rdma_cm uses for port in port space
// ps (rdma_get_service_id): 0x0000000001060000 | port for TCP.
func ServiceID(ps PortSpace, port uint16) uint64 { return uint64(ps)<<16 | uint64(port) }

// ServicePort splits a service ID of the rdma_cm IP port spaces into its
// port space and port; ok is false for other service IDs.
func ServicePort(sid uint64) (ps PortSpace, port uint16, ok bool) {
	if sid>>32 != 0 {
		return 0, 0, false
	}
	ps = PortSpace(sid >> 16)
	switch ps {
	case PortSpaceIPoIB, PortSpaceTCP, PortSpaceUDP, PortSpaceIB:
		return ps, uint16(sid), true
	}
	return 0, 0, false
}

// IPHeaderSize is the size of rdma_cm's IP header at the front of a REQ's
// private data (struct cma_hdr); the application's private data follows,
// so it has REQPrivateDataSize - IPHeaderSize = 56 bytes.
const IPHeaderSize = 36

// IPHeaderVersion is the only header version rdma_cm sends (CMA_VERSION).
const IPHeaderVersion = 0x00

// IPHeader is rdma_cm's IP addressing header (struct cma_hdr): it tells the
// passive side the connection's IP addresses and the initiator's port,
// which the IB CM itself does not carry.
type IPHeader struct {
	Version uint8 // CMA version, IPHeaderVersion
	// SrcPort is the initiator's source port (its rdma_cm ID's port); the
	// destination port is in the service ID.
	SrcPort uint16
	Src     netip.Addr // IPv4 or IPv6, both of the same family
	Dst     netip.Addr
}

// Marshal writes the header into b[:IPHeaderSize].
func (h *IPHeader) Marshal(b []byte) error {
	if len(b) < IPHeaderSize {
		return fmt.Errorf("%w: %d bytes for the %d-byte IP header", ErrShort, len(b), IPHeaderSize)
	}
	src, dst := h.Src.Unmap(), h.Dst.Unmap()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return fmt.Errorf("%w: IP header needs two addresses of one family, got %v and %v", ErrField, h.Src, h.Dst)
	}
	clear(b[:IPHeaderSize])
	b[0] = h.Version
	b[1] = 6 << 4
	if src.Is4() {
		b[1] = 4 << 4
	}
	binary.BigEndian.PutUint16(b[2:], h.SrcPort)
	putIP(b[4:20], src)
	putIP(b[20:36], dst)
	return nil
}

// putIP writes a as union cma_ip_addr: IPv4 in the last 4 of 16 bytes
// after 12 zero bytes of padding, IPv6 in all 16.
func putIP(b []byte, a netip.Addr) {
	if a.Is4() {
		v := a.As4()
		copy(b[12:16], v[:])
		return
	}
	v := a.As16()
	copy(b, v[:])
}

// ParseIPHeader decodes the IP header at the front of a REQ's private
// data. The version must be 0 and the IP version 4 or 6.
func ParseIPHeader(b []byte) (IPHeader, error) {
	if len(b) < IPHeaderSize {
		return IPHeader{}, fmt.Errorf("%w: %d bytes of private data, the IP header needs %d", ErrShort, len(b), IPHeaderSize)
	}
	h := IPHeader{Version: b[0], SrcPort: binary.BigEndian.Uint16(b[2:])}
	if h.Version != IPHeaderVersion {
		return h, fmt.Errorf("%w: rdma_cm header version %d, want %d", ErrField, h.Version, IPHeaderVersion)
	}
	switch b[1] >> 4 {
	case 4:
		h.Src = netip.AddrFrom4([4]byte(b[16:20]))
		h.Dst = netip.AddrFrom4([4]byte(b[32:36]))
	case 6:
		h.Src = netip.AddrFrom16([16]byte(b[4:20]))
		h.Dst = netip.AddrFrom16([16]byte(b[20:36]))
	default:
		return h, fmt.Errorf("%w: rdma_cm header IP version %d", ErrField, b[1]>>4)
	}
	return h, nil
}
