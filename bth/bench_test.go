package bth_test

import (
	"testing"

	"github.com/rxego/rxego/bth"
)

// writeFirst is an RDMA WRITE FIRST header (BTH + RETH), the richest
// header of the data path.
var writeFirst = bth.Header{Opcode: bth.RCWriteFirst, PKey: bth.DefaultPKey, DestQP: 0x11, AckReq: true, PSN: 0x123456,
	RETH: bth.RETHFields{VA: 0x7fe8bf69e000, RKey: 0x289, DMALen: 4096}}

// packetOf encodes h with a payload of n bytes.
func packetOf(tb testing.TB, h bth.Header, n int) []byte {
	pkt := make([]byte, bth.PacketLen(h.Opcode, n))
	if _, err := h.Encode(pkt, make([]byte, n)); err != nil {
		tb.Fatal(err)
	}
	return pkt
}

var (
	sinkHeader bth.Header
	sinkU64    uint64
	sinkInt    int
)

// BenchmarkParse parses a 1 KiB RDMA WRITE FIRST (table lookup and
// length checks; the headers stay views).
func BenchmarkParse(b *testing.B) {
	pkt := packetOf(b, writeFirst, 1024)
	b.ReportAllocs()
	for b.Loop() {
		p, err := bth.Parse(pkt)
		if err != nil {
			b.Fatal(err)
		}
		sinkInt = len(p.Payload())
	}
}

// BenchmarkDecodeBTHRETH parses and reads the BTH and RETH through the
// views, as a receive path does.
func BenchmarkDecodeBTHRETH(b *testing.B) {
	pkt := packetOf(b, writeFirst, 1024)
	b.ReportAllocs()
	for b.Loop() {
		p, _ := bth.Parse(pkt)
		h, r := p.BTH(), p.RETH()
		sinkU64 = uint64(h.PSN()) + uint64(h.DestQP()) + r.VA() + uint64(r.RKey()) + uint64(r.DMALen())
	}
}

// BenchmarkDecodeHeader parses and copies every field into a Header.
func BenchmarkDecodeHeader(b *testing.B) {
	pkt := packetOf(b, writeFirst, 1024)
	b.ReportAllocs()
	for b.Loop() {
		p, _ := bth.Parse(pkt)
		sinkHeader = p.Decode()
	}
}

// BenchmarkEncodeBTHRETH encodes an RDMA WRITE FIRST header with an empty
// payload: the header cost alone.
func BenchmarkEncodeBTHRETH(b *testing.B) {
	h := writeFirst
	buf := make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		n, err := h.Encode(buf, nil)
		if err != nil {
			b.Fatal(err)
		}
		sinkInt = n
	}
}

// BenchmarkEncode1K encodes the same header with a 1 KiB payload copy.
func BenchmarkEncode1K(b *testing.B) {
	h := writeFirst
	payload := make([]byte, 1024)
	buf := make([]byte, bth.PacketLen(h.Opcode, len(payload)))
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		sinkInt, _ = h.Encode(buf, payload)
	}
}

// BenchmarkEncodeViews writes the BTH and RETH field by field through the
// setters, the way an engine building a packet in place does.
func BenchmarkEncodeViews(b *testing.B) {
	pkt := packetOf(b, writeFirst, 0)
	p, _ := bth.Parse(pkt)
	b.ReportAllocs()
	for i := uint32(0); b.Loop(); i++ {
		h := p.BTH()
		h.SetOpcode(bth.RCWriteFirst)
		h.SetFlags(false, false, 0, 0)
		h.SetPKey(bth.DefaultPKey)
		h.SetDestQP(0x11)
		h.SetAckReq(true)
		h.SetPSN(bth.PSN(i & bth.PSNMask))
		p.RETH().Set(uint64(i), i, 4096)
	}
}

// TestZeroAllocs asserts what the benchmarks report: parsing, decoding,
// the views and encoding allocate nothing.
func TestZeroAllocs(t *testing.T) {
	pkt := packetOf(t, writeFirst, 1024)
	buf := make([]byte, len(pkt))
	payload := make([]byte, 1024)
	h := writeFirst
	fns := map[string]func(){
		"Parse": func() { p, _ := bth.Parse(pkt); sinkInt = len(p.Payload()) },
		"Decode": func() {
			p, _ := bth.Parse(pkt)
			sinkHeader = p.Decode()
		},
		"views": func() {
			p, _ := bth.Parse(pkt)
			sinkU64 = uint64(p.BTH().PSN()) + p.RETH().VA() + uint64(len(p.AETH())+len(p.ImmDt())+len(p.DETH())) + uint64(p.ICRC())
		},
		"Encode": func() { sinkInt, _ = h.Encode(buf, payload) },
		"setters": func() {
			b := bth.BTH(buf)
			b.SetPSN(5)
			b.SetDestQP(7)
			b.SetAckReq(true)
		},
		"errors": func() { _, err := bth.Parse(pkt[:10]); sinkInt = len(err.Error()) },
	}
	for name, fn := range fns {
		if a := testing.AllocsPerRun(100, fn); a != 0 {
			t.Errorf("%s: %v allocs per run", name, a)
		}
	}
}
