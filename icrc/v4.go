package icrc

import (
	"sync/atomic"

	"github.com/rxego/rxego/internal/iphdr"
)

// V4 holds what an IPv4 RoCEv2 packet's ICRC covers besides the packet
// itself and the IP ID: addresses, ports and the DF bit. The lengths follow
// from the packet. A V4 is a small value, cheap to build per packet.
type V4 struct {
	Src, Dst         [4]byte
	SrcPort, DstPort uint16
	DF               bool // don't-fragment, set by rxe and by rxego
}

// header writes the masked IPv4 and UDP headers v describes: TOS, TTL and
// both checksums all ones.
func (v *V4) header(h *[iphdr.IPv4Len + iphdr.UDPLen]byte, id, ipLen, udpLen uint16) {
	iphdr.IPv4(h[:]).Encode(&iphdr.IPv4Fields{TOS: 0xff, TotalLength: ipLen, ID: id, DF: v.DF, TTL: 0xff,
		Protocol: iphdr.ProtoUDP, Checksum: 0xffff, Src: v.Src, Dst: v.Dst})
	putUDP(h[iphdr.IPv4Len:], v.SrcPort, v.DstPort, int(udpLen))
}

// v4Base[df] is the register after the LRH stand-in and the masked
// headers of a V4 whose addresses, ports, ID and lengths are all zero.
// Zero bytes contribute nothing, so Sum adds only the lookups of the bytes
// that vary per flow or packet.
var v4Base = func() (b [2]uint32) {
	for i, df := range []bool{false, true} {
		var h [iphdr.IPv4Len + iphdr.UDPLen]byte
		(&V4{DF: df}).header(&h, 0, 0, 0)
		b[i] = prefix(h[:])
	}
	return b
}()

// Flow returns v's addresses, ports and DF bit folded in ahead, for many
// packets of the flow.
func (v *V4) Flow() Flow {
	df := 0
	if v.DF {
		df = 1
	}
	// wide[j] for header byte k is wide[27-k]: addresses (k 12-19),
	// ports (20-23); Flow.head adds the lengths and the ID.
	w := wide
	r := v4Base[df]
	r ^= w[15][v.Src[0]] ^ w[14][v.Src[1]] ^ w[13][v.Src[2]] ^ w[12][v.Src[3]]
	r ^= w[11][v.Dst[0]] ^ w[10][v.Dst[1]] ^ w[9][v.Dst[2]] ^ w[8][v.Dst[3]]
	r ^= w[7][v.SrcPort>>8] ^ w[6][byte(v.SrcPort)] ^ w[5][v.DstPort>>8] ^ w[4][byte(v.DstPort)]
	return Flow{reg: r}
}

// Sum returns the ICRC of pkt (BTH through ICRC) sent with IP ID id.
func (v *V4) Sum(id uint16, pkt []byte) uint32 { return v.Flow().Sum(id, pkt) }

// SumScattered is Flow.SumScattered for one packet of v's flow.
func (v *V4) SumScattered(id uint16, hdr, payload, trailer []byte) uint32 {
	return v.Flow().SumScattered(id, hdr, payload, trailer)
}

// Fill computes the ICRC for IP ID id and stores it in pkt.
func (v *V4) Fill(id uint16, pkt []byte) { v.Flow().Fill(id, pkt) }

// Check reports whether pkt's ICRC is right for IP ID id.
func (v *V4) Check(id uint16, pkt []byte) bool { return v.Flow().Check(id, pkt) }

// Recover finds the IPv4 Identification that makes pkt's stored ICRC
// correct, for receivers that read through a UDP socket and cannot see the
// ID. ok is false when no ID does, which rejects the packet.
//
// Detection strength: the CRC is affine in the 16 ID bits, so the stored
// ICRC minus the ICRC for ID 0 must lie in a 16-dimensional subspace of the
// 32-bit CRC space. A random corruption passes with probability 2^-16
// (about 1 in 65,536), against 2^-32 when the ID is known; errors confined
// to a burst of 32 bits or fewer that do not touch the ID are still always
// caught, as CRC-32 guarantees, unless they mimic an ID change. Some do:
// with a 20-byte IP header, 15 of the 255 corruptions of the byte at
// offset 93 from the BTH pass, and 1 to 3 at each of about a dozen offsets
// from 1776 up (a property of the polynomial and the distance to the ID),
// so over a 1040-byte packet 15 of its 264,945 single-byte errors pass
// (about 2^-14). Receive paths that see the IP header (raw sockets,
// captures) use Check instead.
func (v *V4) Recover(pkt []byte) (id uint16, ok bool) { return v.Flow().Recover(pkt) }

// The CRC register after a message is linear in the message bits once the
// init and final xor cancel (they do in a difference of two equal-length
// messages). A difference introduced in the two ID bytes is then shifted
// through n zero bytes; we undo that shift with a 32x32 GF(2) matrix.

// zinv undoes one zero-byte step of the register: the top byte of the
// result of a step names the table row used (IEEE's rows have distinct top
// bytes), which gives back the byte shifted out.
func zinv(s uint32) uint32 {
	idx := revTop[s>>24]
	return (s^table[idx])<<8 | uint32(idx)
}

// revTop maps a table row's top byte back to its index.
var revTop = func() (r [256]byte) {
	for i := 0; i < 256; i++ {
		r[table[i]>>24] = byte(i)
	}
	return r
}()

// matrix is a 32x32 GF(2) matrix stored by columns: m[j] is the image of bit j.
type matrix [32]uint32

func (m *matrix) apply(v uint32) uint32 {
	var r uint32
	for j := 0; v != 0; j, v = j+1, v>>1 {
		if v&1 != 0 {
			r ^= m[j]
		}
	}
	return r
}

func (m *matrix) mul(o *matrix) *matrix { // m·o
	var r matrix
	for j := range o {
		r[j] = m.apply(o[j])
	}
	return &r
}

// zinvPow[k] undoes 2^k zero-byte steps.
var zinvPow = func() (p [17]*matrix) {
	var m matrix
	for j := range m {
		m[j] = zinv(1 << j)
	}
	p[0] = &m
	for k := 1; k < len(p); k++ {
		p[k] = p[k-1].mul(p[k-1])
	}
	return p
}()

// maxCached bounds the per-length matrix cache: every RoCE packet up to a
// 9000-byte jumbo frame hits it; longer ones are computed on the spot.
const maxCached = 9216

var unshiftCache [maxCached]atomic.Pointer[matrix]

func unshiftMatrix(n int) *matrix {
	if n < maxCached {
		if m := unshiftCache[n].Load(); m != nil {
			return m
		}
	}
	var m *matrix
	for k := 0; n>>k != 0; k++ {
		if n>>k&1 == 0 {
			continue
		}
		if m == nil {
			c := *zinvPow[k]
			m = &c
		} else {
			m = zinvPow[k].mul(m)
		}
	}
	if m == nil {
		m = new(matrix)
		for j := range m {
			m[j] = 1 << j
		}
	}
	if n < maxCached {
		unshiftCache[n].Store(m)
	}
	return m
}

func unshift(n int, v uint32) uint32 { return unshiftMatrix(n).apply(v) }

// solveID finds the byte pair whose register difference, starting from a
// zero difference, is u; ok is false when u is not reachable by any pair.
func solveID(u uint32) (b0, b1 byte, ok bool) {
	idx1 := revTop[u>>24]
	mid := (u ^ table[idx1]) << 8 // register after b0, low byte unknown yet
	b0 = revTop[mid>>24]
	b1 = idx1 ^ byte(table[b0])
	return b0, b1, step(step(0, b0), b1) == u
}
