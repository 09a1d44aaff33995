// Package icrc computes and checks the RoCEv2 invariant CRC.
//
// The ICRC is CRC-32 (IEEE, reflected, as hash/crc32) over: 8 bytes of 0xFF
// standing in for the InfiniBand LRH; the IP header with the fields routers
// change set to all ones (IPv4: TOS, TTL, header checksum; IPv6: traffic
// class, flow label, hop limit); the UDP header with its checksum all ones;
// the BTH with byte 4 (FECN, BECN, reserved) all ones; and the rest of the
// packet up to the ICRC. It is stored little-endian in the last four bytes.
// These are the rules of IBTA Annex A17 as rdma_rxe implements them, and
// were checked on every packet of the captures in testdata/pcaps.
//
// The IPv4 Identification field is covered. A sender must therefore know
// the ID the kernel will write (see package transport for what each send
// path puts there), and a receiver that reads through a UDP socket never
// sees it: [V4.Recover] finds the one ID that makes a packet's ICRC match,
// which is sound because the CRC is linear in the ID bits (see its doc for
// what that costs in detection strength).
//
// A [Flow] folds a flow's addresses and ports into the register once; the
// many packets of a GSO run or a GRO batch then add only their lengths
// and ID, a few table lookups each, since the CRC is affine in every
// header byte.
//
// On amd64 CPUs with 256-bit VPCLMULQDQ the CRC runs in this package's own
// assembly, about twice hash/crc32's rate where the CPU lacks AVX-512;
// elsewhere, and in builds tagged purego, it runs in hash/crc32.
// [ChecksumIEEE] offers that kernel as a plain CRC-32.
package icrc

import (
	"encoding/binary"
	"hash/crc32"

	"github.com/rxego/rxego/internal/iphdr"
)

// Len is the length of the ICRC trailer.
const Len = 4

const bthLen = 12

// table is the reflected IEEE table hash/crc32 also uses.
var table = crc32.MakeTable(crc32.IEEE)

// lrhState is the CRC register (pre-inversion form) after the 8 bytes of
// 0xFF that stand in for the LRH: rdma_rxe's 0xdebb20e3 seed.
var lrhState = func() uint32 {
	s := ^uint32(0)
	for i := 0; i < 8; i++ {
		s = step(s, 0xff)
	}
	return s
}()

// step feeds one byte into a CRC register held in non-inverted form.
//
// The CRC is linear: step(s, c) = zero(s) ^ table[c], where zero is the
// step of a zero byte. So the register after bytes b[0..n) is zero^n of
// the start register xor, for each k, table[b[k]] carried through the
// n-1-k bytes after it. The tables below precompute those terms, turning a
// byte-serial chain into independent lookups.
func step(s uint32, c byte) uint32 { return table[byte(s)^c] ^ s>>8 }

// maxWide is the longest masked prefix fed with one lookup per byte: an
// IPv6 header and a UDP header.
const maxWide = 40 + 8

// wide[j][c] is byte c's contribution to the register when j more bytes
// follow it. wide[0] is table; wide[0..7] are the slicing-by-8 tables.
var wide = func() *[maxWide][256]uint32 {
	var t [maxWide][256]uint32
	t[0] = *table
	for j := 1; j < maxWide; j++ {
		for c := range t[j] {
			t[j][c] = step(t[j-1][c], 0)
		}
	}
	return &t
}()

// lrhWide[n] is the register after the LRH stand-in and n zero bytes.
var lrhWide = func() (t [maxWide + 1]uint32) {
	v := lrhState
	for n := range t {
		t[n] = v
		v = step(v, 0)
	}
	return t
}()

// prefix returns the register after the LRH stand-in and b, the masked IP
// and UDP headers. They live on the stack: handing them to crc32.Update
// would make them escape and allocate (its accelerated code is reached
// through a function variable).
func prefix(b []byte) uint32 {
	if len(b) > maxWide { // IPv4 with options, from FromHeaders
		return feed(lrhState, b)
	}
	r := lrhWide[len(b)]
	j := len(b) - 1
	for _, c := range b {
		r ^= wide[j][c]
		j--
	}
	return r
}

// feed runs bytes through the register eight at a time (slicing-by-8).
func feed(s uint32, b []byte) uint32 {
	t := wide
	for len(b) >= 8 {
		s ^= binary.LittleEndian.Uint32(b)
		s = t[7][byte(s)] ^ t[6][byte(s>>8)] ^ t[5][byte(s>>16)] ^ t[4][s>>24] ^
			t[3][b[4]] ^ t[2][b[5]] ^ t[1][b[6]] ^ t[0][b[7]]
		b = b[8:]
	}
	for _, c := range b {
		s = step(s, c)
	}
	return s
}

// bthHead is the BTH up to and including byte 4, the byte the ICRC
// masks (FECN, BECN, reserved).
const bthHead = 5

// putUDP writes a UDP header with the checksum all ones to dst.
func putUDP(dst []byte, sport, dport uint16, length int) {
	iphdr.UDP(dst).Encode(&iphdr.UDPFields{SrcPort: sport, DstPort: dport, Length: uint16(length), Checksum: 0xffff})
}

// maxShifted bounds the packet lengths the fast path serves: every RoCE
// packet up to a 9000-byte jumbo frame.
const maxShifted = 9216

// maskFix[n] is what setting BTH byte 4 from 0x00 to 0xff changes in the
// register when n more bytes follow it: table[0xff] carried through n
// zero-byte steps.
var maskFix = func() *[maxShifted]uint32 {
	var t [maxShifted]uint32
	v := table[0xff]
	for n := range t {
		t[n] = v
		v = step(v, 0)
	}
	return &t
}()

// unzero4[i][b] undoes four zero-byte steps of a register whose byte i is
// b and other bytes are zero; xor-ing the four lookups undoes them for any
// register.
var unzero4 = func() (t [4][256]uint32) {
	for i := range t {
		for b := range t[i] {
			v := uint32(b) << (8 * i)
			for k := 0; k < 4; k++ {
				v = zinv(v)
			}
			t[i][b] = v
		}
	}
	return t
}()

// unzero undoes four zero-byte steps of r.
func unzero(r uint32) uint32 {
	return unzero4[0][byte(r)] ^ unzero4[1][byte(r>>8)] ^ unzero4[2][byte(r>>16)] ^ unzero4[3][r>>24]
}

// icrcBytes[j][c] is unzero(wide[3-j][c]): what ICRC byte j (0..3) fed
// after the packet contributes, seen from before the four ICRC bytes.
var icrcBytes = func() (t [4][256]uint32) {
	for j := range t {
		for c := range t[j] {
			t[j][c] = unzero(wide[3-j][c])
		}
	}
	return t
}()

// sum returns the ICRC of pkt given the masked IP and UDP headers.
func sum(ipudp, pkt []byte) uint32 { return sumFrom(prefix(ipudp), pkt) }

// sumFrom returns the ICRC of pkt given the register s after the LRH
// stand-in and the masked IP and UDP headers.
//
// The bulk goes through run in one call. When BTH byte 4 is zero (no
// FECN, BECN or reserved bits: nearly every packet) that call covers the
// whole packet as it is, ICRC included, so all but its last len%16 bytes
// go through the wide fold where the CPU has it. The ICRC's four bytes
// are then taken back out and the mask of byte 4 added as the
// precomputed difference maskFix. Otherwise the masked BTH head is fed by hand and the
// call starts after it.
func sumFrom(s uint32, pkt []byte) uint32 {
	after := len(pkt) - Len - bthHead // bytes between byte 4 and the ICRC
	if pkt[4] == 0 && after < maxShifted {
		// Register after pkt[:len-4] = unzero(R ^ ICRC bytes' terms);
		// the terms and the mask fix do not depend on R, so they are
		// looked up before the fold runs.
		c := pkt[len(pkt)-Len:]
		fix := icrcBytes[0][c[0]] ^ icrcBytes[1][c[1]] ^ icrcBytes[2][c[2]] ^ icrcBytes[3][c[3]] ^ maskFix[after]
		r := run(s, pkt)
		return ^(unzero(r) ^ fix)
	}
	var h [bthHead]byte
	copy(h[:4], pkt)
	h[4] = 0xff
	s = feed(s, h[:])
	return ^run(s, pkt[bthHead:len(pkt)-Len])
}

// sumScattered is sumFrom for a packet in three pieces: hdr (at least the
// BTH), payload and trailer (pad and ICRC, at least the ICRC). The CRC
// runs on across the pieces, so the result is
// sumFrom's for the pieces gathered.
func sumScattered(s uint32, hdr, payload, trailer []byte) uint32 {
	var h [bthHead]byte
	copy(h[:4], hdr)
	h[4] = 0xff
	s = feed(s, h[:])
	s = run(s, hdr[bthHead:])
	s = run(s, payload)
	return ^run(s, trailer[:len(trailer)-Len])
}

// run feeds p through the CRC register s (not inverted) and returns the
// register after it. Where the CPU has 256-bit VPCLMULQDQ, all but the
// last len(p)%16 bytes go through foldWide, about twice as fast as
// hash/crc32's 128-bit kernel (BenchmarkICRC4K against
// BenchmarkCRC32IEEE4K); elsewhere hash/crc32 takes what is long enough
// for its kernel. Short inputs and the rest go through feed, which skips
// hash/crc32's dispatch (an ACK's ICRC covers 15 bytes after the BTH head).
func run(s uint32, p []byte) uint32 {
	if len(p) >= wideMin {
		if !hasWide {
			return ^crc32.Update(^s, table, p)
		}
		n := len(p) &^ 15
		s = foldWide(s, p[:n])
		p = p[n:]
	}
	return feed(s, p)
}

// ChecksumIEEE returns the CRC-32 (IEEE) of p, as crc32.ChecksumIEEE does,
// through the kernel the ICRC uses (run). It is for code that must weigh
// rxego against a plain CRC-32 over the same bytes, such as the benchmark
// harness's UDP yardsticks, so that both pay the same CRC.
func ChecksumIEEE(p []byte) uint32 { return ^run(^uint32(0), p) }

// wideMin is the shortest input foldWide takes (one load of its two
// 32-byte accumulators) and hash/crc32 folds.
const wideMin = 64

// Put stores crc in the last four bytes of pkt.
func Put(pkt []byte, crc uint32) { binary.LittleEndian.PutUint32(pkt[len(pkt)-Len:], crc) }

// Get reads the ICRC stored in the last four bytes of pkt.
func Get(pkt []byte) uint32 { return binary.LittleEndian.Uint32(pkt[len(pkt)-Len:]) }

// valid reports whether pkt can hold a BTH and an ICRC.
func valid(pkt []byte) bool { return len(pkt) >= bthLen+Len }

// FromHeaders computes the ICRC of pkt (a UDP payload from the BTH through
// the ICRC) from the real IP and UDP headers it travelled under, as read
// from a capture or a raw socket. ip is an IPv4 header (options included)
// or an IPv6 header; udpHdr is the 8-byte UDP header. ok is false when the
// headers are not well formed.
//
// IPv4 options are covered as they stand, as the RoCEv2 annex defines the
// ICRC over the whole IP header with only TOS, TTL and checksum masked.
// rxe's rxe_icrc_hdr assumes a 20-byte header (it masks 28 bytes from the
// IP header on), so it rejects such packets; no RoCE sender adds options.
func FromHeaders(ip, udpHdr, pkt []byte) (crc uint32, ok bool) {
	if len(udpHdr) < 8 || !valid(pkt) || len(ip) < 1 {
		return 0, false
	}
	var h [60 + 8]byte // the largest IPv4 header and UDP
	var n int
	switch ip[0] >> 4 {
	case 4:
		n = int(ip[0]&0xf) * 4
		if n < 20 || len(ip) < n {
			return 0, false
		}
		copy(h[:n], ip)
		h[1] = 0xff               // TOS
		h[8] = 0xff               // TTL
		h[10], h[11] = 0xff, 0xff // checksum
	case 6:
		n = 40
		if len(ip) < n {
			return 0, false
		}
		copy(h[:n], ip)
		h[0] |= 0x0f // version kept, traffic class and flow label ones
		h[1], h[2], h[3] = 0xff, 0xff, 0xff
		h[7] = 0xff // hop limit
	default:
		return 0, false
	}
	copy(h[n:n+6], udpHdr)
	h[n+6], h[n+7] = 0xff, 0xff
	return sum(h[:n+8], pkt), true
}
