package icrc_test

import (
	"hash/crc32"
	"testing"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/icrc"
)

// benchPacket returns an RC SEND packet of n bytes in total (BTH .. ICRC).
func benchPacket(n int) []byte {
	pkt := make([]byte, n)
	h := bth.Header{Opcode: bth.RCSendMiddle, PKey: bth.DefaultPKey, DestQP: 17, PSN: 1}
	if _, err := h.Encode(pkt, make([]byte, n-bth.Len-bth.ICRCLen)); err != nil {
		panic(err)
	}
	for i := bth.Len; i < n-bth.ICRCLen; i++ {
		pkt[i] = byte(i * 7)
	}
	return pkt
}

var benchV4 = icrc.V4{Src: [4]byte{198, 18, 0, 1}, Dst: [4]byte{198, 18, 0, 2}, SrcPort: 49152, DstPort: 4791, DF: true}

var sink uint32

// benchSum times sum over an n-byte packet (the call through a function
// value adds about a nanosecond to every benchmark alike).
func benchSum(b *testing.B, n int, sum func(pkt []byte) uint32) {
	pkt := benchPacket(n)
	b.SetBytes(int64(n))
	b.ReportAllocs()
	for b.Loop() {
		sink = sum(pkt)
	}
}

// benchV4Sum is V4.Sum over an n-byte packet, folding the flow each time.
func benchV4Sum(b *testing.B, n int) {
	benchSum(b, n, func(pkt []byte) uint32 { return benchV4.Sum(7, pkt) })
}

// benchCRC32 is the reference: hash/crc32 over the same number of bytes.
func benchCRC32(b *testing.B, n int) { benchSum(b, n, crc32.ChecksumIEEE) }

// BenchmarkICRC1K is V4.Sum over a 1 KiB packet.
func BenchmarkICRC1K(b *testing.B) { benchV4Sum(b, 1024) }

// BenchmarkCRC32IEEE1K is crc32.ChecksumIEEE over the same 1 KiB.
func BenchmarkCRC32IEEE1K(b *testing.B) { benchCRC32(b, 1024) }

// BenchmarkICRC4K is V4.Sum over a 4 KiB packet.
func BenchmarkICRC4K(b *testing.B) { benchV4Sum(b, 4096) }

// BenchmarkCRC32IEEE4K is crc32.ChecksumIEEE over the same 4 KiB.
func BenchmarkCRC32IEEE4K(b *testing.B) { benchCRC32(b, 4096) }

// BenchmarkICRC64 shows the fixed per-packet cost on an ACK-sized packet.
func BenchmarkICRC64(b *testing.B) { benchV4Sum(b, 64) }

// BenchmarkCRC32IEEE64 is the reference for BenchmarkICRC64.
func BenchmarkCRC32IEEE64(b *testing.B) { benchCRC32(b, 64) }

var benchV6 = icrc.V6{Src: [16]byte{15: 1}, Dst: [16]byte{15: 2}, SrcPort: 49152, DstPort: 4791}

// benchV6Sum is V6.Sum over an n-byte packet, folding the flow each time.
func benchV6Sum(b *testing.B, n int) { benchSum(b, n, benchV6.Sum) }

// BenchmarkV6Sum4K is V6.Sum over a 4 KiB packet.
func BenchmarkV6Sum4K(b *testing.B) { benchV6Sum(b, 4096) }

// BenchmarkV6Sum1K is V6.Sum over a 1 KiB packet.
func BenchmarkV6Sum1K(b *testing.B) { benchV6Sum(b, 1024) }

// benchFlowSum is benchV4Sum (or V6's) with the flow folded once, as a
// GSO run or a GRO batch folds it.
func benchFlowSum(b *testing.B, flow icrc.Flow, n int) {
	benchSum(b, n, func(pkt []byte) uint32 { return flow.Sum(7, pkt) })
}

// BenchmarkFlowSum1K is Flow.Sum over a 1 KiB packet of an IPv4 flow.
func BenchmarkFlowSum1K(b *testing.B) { benchFlowSum(b, benchV4.Flow(), 1024) }

// BenchmarkFlowSum64 is BenchmarkICRC64 with the flow folded once.
func BenchmarkFlowSum64(b *testing.B) { benchFlowSum(b, benchV4.Flow(), 64) }

// BenchmarkFlowSumV6_1K is Flow.Sum over a 1 KiB packet of an IPv6 flow.
func BenchmarkFlowSumV6_1K(b *testing.B) { benchFlowSum(b, benchV6.Flow(), 1024) }

// BenchmarkFromHeaders4K checks a 4 KiB packet from captured headers.
func BenchmarkFromHeaders4K(b *testing.B) {
	pkt := benchPacket(4096)
	ip, udp := ipv4Header(benchV4, 7, len(pkt)), udpHeader(benchV4.SrcPort, benchV4.DstPort, len(pkt))
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		sink, _ = icrc.FromHeaders(ip, udp, pkt)
	}
}

// BenchmarkRecover1K finds the IP ID of a 1 KiB packet.
func BenchmarkRecover1K(b *testing.B) {
	pkt := benchPacket(1024)
	benchV4.Fill(0xbeef, pkt)
	b.SetBytes(1024)
	b.ReportAllocs()
	for b.Loop() {
		id, _ := benchV4.Recover(pkt)
		sink = uint32(id)
	}
}
