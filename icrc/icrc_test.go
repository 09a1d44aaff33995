package icrc_test

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/icrc"
)

// reference computes the ICRC straight from its definition: CRC-32 (IEEE)
// over 8 bytes of 0xFF, the IP header with TOS/TTL/checksum (IPv4) or
// traffic class/flow label/hop limit (IPv6) all ones, the UDP header with
// checksum all ones, the BTH with byte 4 all ones, and the rest of the
// packet up to the ICRC.
func reference(ip, udp, pkt []byte) uint32 {
	var m []byte
	m = append(m, bytes.Repeat([]byte{0xff}, 8)...)
	ip = bytes.Clone(ip)
	if ip[0]>>4 == 4 {
		ip[1], ip[8], ip[10], ip[11] = 0xff, 0xff, 0xff, 0xff
	} else {
		ip[0] |= 0x0f
		ip[1], ip[2], ip[3], ip[7] = 0xff, 0xff, 0xff, 0xff
	}
	m = append(m, ip...)
	m = append(m, udp[:6]...)
	m = append(m, 0xff, 0xff)
	p := bytes.Clone(pkt[:len(pkt)-icrc.Len])
	p[4] = 0xff
	m = append(m, p...)
	return crc32.ChecksumIEEE(m)
}

// randomPacket builds a packet with a random opcode, header fields and
// payload length (up to max bytes), FECN/BECN/reserved bits set in about
// half of them.
func randomPacket(rng *rand.Rand, max int) []byte {
	var op bth.Opcode
	for {
		op = bth.Opcode(rng.IntN(256))
		if op.Info() != nil {
			break
		}
	}
	in := op.Info()
	plen := 0
	switch {
	case in.Op == bth.OpAtomicWrite:
		plen = 8
	case in.Has(bth.Payload):
		plen = rng.IntN(max)
	}
	h := bth.Header{Opcode: op, PKey: uint16(rng.Uint32()), DestQP: rng.Uint32() & 0xffffff, PSN: bth.PSN(rng.Uint32() & bth.PSNMask),
		AckReq: rng.IntN(2) == 0, RETH: bth.RETHFields{VA: rng.Uint64()}, Imm: rng.Uint32()}
	if rng.IntN(2) == 0 {
		h.FECN, h.BECN, h.Resv6 = rng.IntN(2) == 0, rng.IntN(2) == 0, uint8(rng.IntN(64))
	}
	payload := make([]byte, plen)
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	pkt := make([]byte, bth.PacketLen(op, plen))
	if _, err := h.Encode(pkt, payload); err != nil {
		panic(err)
	}
	binary.LittleEndian.PutUint32(pkt[len(pkt)-4:], rng.Uint32()) // whatever was there
	return pkt
}

func randomV4(rng *rand.Rand) icrc.V4 {
	v := icrc.V4{SrcPort: uint16(rng.Uint32()), DstPort: 4791, DF: rng.IntN(4) != 0}
	binary.BigEndian.PutUint32(v.Src[:], rng.Uint32())
	binary.BigEndian.PutUint32(v.Dst[:], rng.Uint32())
	return v
}

func randomV6(rng *rand.Rand) icrc.V6 {
	v := icrc.V6{SrcPort: uint16(rng.Uint32()), DstPort: 4791}
	for i := range v.Src {
		v.Src[i], v.Dst[i] = byte(rng.Uint32()), byte(rng.Uint32())
	}
	return v
}

// TestAgainstDefinition checks V4.Sum, V6.Sum and FromHeaders against the
// definition on random packets of every opcode and many lengths, with and
// without FECN/BECN, including jumbo lengths past the precomputed range.
func TestAgainstDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 3000; i++ {
		max := 1100
		if i%100 == 0 {
			max = 10000
		}
		pkt := randomPacket(rng, max)
		id := uint16(rng.Uint32())
		v4 := randomV4(rng)
		ip4, udp := ipv4Header(v4, id, len(pkt)), udpHeader(v4.SrcPort, v4.DstPort, len(pkt))
		want := reference(ip4, udp, pkt)
		if got := v4.Sum(id, pkt); got != want {
			t.Fatalf("V4.Sum = %08x, want %08x (len %d, byte4 %#x)", got, want, len(pkt), pkt[4])
		}
		if got, ok := icrc.FromHeaders(ip4, udp, pkt); !ok || got != want {
			t.Fatalf("FromHeaders v4 = %08x %v, want %08x", got, ok, want)
		}
		v6 := randomV6(rng)
		ip6, udp6 := ipv6Header(v6, len(pkt)), udpHeader(v6.SrcPort, v6.DstPort, len(pkt))
		want = reference(ip6, udp6, pkt)
		if got := v6.Sum(pkt); got != want {
			t.Fatalf("V6.Sum = %08x, want %08x", got, want)
		}
		if got, ok := icrc.FromHeaders(ip6, udp6, pkt); !ok || got != want {
			t.Fatalf("FromHeaders v6 = %08x %v, want %08x", got, ok, want)
		}
	}
	// IPv4 with options: FromHeaders covers them.
	pkt := randomPacket(rng, 200)
	v4 := randomV4(rng)
	ip := ipv4Header(v4, 9, len(pkt)+8)
	ip[0] = 0x47
	ip = append(ip, 0x94, 0x04, 0, 0, 1, 1, 1, 0) // router alert, NOPs, end
	udp := udpHeader(v4.SrcPort, v4.DstPort, len(pkt))
	if got, ok := icrc.FromHeaders(ip, udp, pkt); !ok || got != reference(ip, udp, pkt) {
		t.Errorf("IPv4 options: %08x %v", got, ok)
	}
}

// TestFlow reuses one Flow over packets of many lengths and IP IDs, as a
// GSO run or a GRO batch does, and checks Sum, SumScattered, Fill, Check
// and Recover against the definition, for both families: the flow's
// register must carry nothing of one packet into the next.
func TestFlow(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for i := 0; i < 60; i++ {
		v4, v6 := randomV4(rng), randomV6(rng)
		family, flow := "IPv4", v4.Flow()
		if i%2 == 1 {
			family, flow = "IPv6", v6.Flow()
		}
		for j := 0; j < 40; j++ {
			pkt := randomPacket(rng, 4200)
			id := uint16(rng.Uint32())
			ip, udp := ipv4Header(v4, id, len(pkt)), udpHeader(v4.SrcPort, v4.DstPort, len(pkt))
			if family == "IPv6" {
				ip, udp = ipv6Header(v6, len(pkt)), udpHeader(v6.SrcPort, v6.DstPort, len(pkt))
			}
			want := reference(ip, udp, pkt)
			if got := flow.Sum(id, pkt); got != want {
				t.Fatalf("%s Flow.Sum = %08x, want %08x (len %d, id %#x)", family, got, want, len(pkt), id)
			}
			n := len(pkt)
			hdr, payload, trailer := pkt[:min(n-4, 12)], pkt[min(n-4, 12):n-4], pkt[n-4:]
			if got := flow.SumScattered(id, hdr, payload, trailer); got != want {
				t.Fatalf("%s Flow.SumScattered = %08x, want %08x", family, got, want)
			}
			flow.Fill(id, pkt)
			if icrc.Get(pkt) != want || !flow.Check(id, pkt) {
				t.Fatalf("%s Flow.Fill/Check: stored %08x, want %08x (len %d)", family, icrc.Get(pkt), want, len(pkt))
			}
			wantID := id
			if family == "IPv6" {
				wantID = 0 // no ID: Recover only checks
			} else if flow.Check(id+1, pkt) {
				t.Fatalf("IPv4 Flow.Check passed with the wrong ID")
			}
			if got, ok := flow.Recover(pkt); !ok || got != wantID {
				t.Fatalf("%s Flow.Recover = %#x %v, want %#x", family, got, ok, wantID)
			}
			pkt[n/2] ^= 0x10
			if flow.Check(id, pkt) {
				t.Fatalf("%s Flow.Check passed a corrupted packet", family)
			}
		}
	}
}

// TestIPv6 builds an IPv6 packet, fills its ICRC and checks it; every
// single-byte corruption of the packet must then fail the check, while
// changes to the fields the ICRC masks must not matter.
func TestIPv6(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	v := randomV6(rng)
	h := bth.Header{Opcode: bth.RCWriteFirst, PKey: bth.DefaultPKey, DestQP: 0x11, PSN: 77,
		RETH: bth.RETHFields{VA: 0x7f0000001000, RKey: 0x289, DMALen: 2500}}
	pkt := make([]byte, bth.PacketLen(h.Opcode, 1024))
	if _, err := h.Encode(pkt, bytes.Repeat([]byte{0x5a}, 1024)); err != nil {
		t.Fatal(err)
	}
	v.Fill(pkt)
	if !v.Check(pkt) || icrc.Get(pkt) != v.Sum(pkt) {
		t.Fatal("IPv6 ICRC does not check after Fill")
	}
	ip, udp := ipv6Header(v, len(pkt)), udpHeader(v.SrcPort, v.DstPort, len(pkt))
	if got, ok := icrc.FromHeaders(ip, udp, pkt); !ok || got != icrc.Get(pkt) {
		t.Errorf("FromHeaders %08x, V6.Sum %08x", got, icrc.Get(pkt))
	}
	for i := range pkt {
		if i == 4 {
			continue // FECN, BECN, reserved: masked
		}
		bad := bytes.Clone(pkt)
		bad[i] ^= byte(1 + rng.IntN(255))
		if v.Check(bad) {
			t.Fatalf("corrupted byte %d passes the check", i)
		}
	}
	masked := bytes.Clone(pkt)
	masked[4] = 0xc0 // FECN and BECN set by the network
	if !v.Check(masked) {
		t.Error("BTH byte 4 is not masked")
	}
	ip2 := bytes.Clone(ip)
	ip2[0], ip2[1], ip2[2], ip2[3], ip2[7] = 0x6f, 0xff, 0x00, 0x01, 1 // TC, flow label, hop limit
	if got, _ := icrc.FromHeaders(ip2, udp, pkt); got != icrc.Get(pkt) {
		t.Error("IPv6 traffic class, flow label or hop limit is not masked")
	}
	for _, off := range []int{5, 6, 8, 39} { // payload length, next header, addresses
		ip3 := bytes.Clone(ip)
		ip3[off] ^= 1
		if got, _ := icrc.FromHeaders(ip3, udp, pkt); got == icrc.Get(pkt) {
			t.Errorf("IPv6 header byte %d is not covered", off)
		}
	}
	udp2 := bytes.Clone(udp)
	udp2[6], udp2[7] = 0, 0
	if got, _ := icrc.FromHeaders(ip, udp2, pkt); got != icrc.Get(pkt) {
		t.Error("UDP checksum is not masked")
	}
}

// TestV4 checks Fill/Check/Put/Get and the masked IPv4 fields.
func TestV4(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	v := randomV4(rng)
	pkt := randomPacket(rng, 500)
	v.Fill(0x1234, pkt)
	if !v.Check(0x1234, pkt) || v.Check(0x1235, pkt) {
		t.Fatal("Check does not depend on exactly the ID")
	}
	ip, udp := ipv4Header(v, 0x1234, len(pkt)), udpHeader(v.SrcPort, v.DstPort, len(pkt))
	for _, mut := range []struct {
		off    int
		masked bool
	}{{1, true}, {8, true}, {10, true}, {11, true}, {4, false}, {6, false}, {9, false}, {12, false}, {19, false}, {2, false}} {
		ip2 := bytes.Clone(ip)
		ip2[mut.off] ^= 0x20
		got, ok := icrc.FromHeaders(ip2, udp, pkt)
		if !ok || (got == icrc.Get(pkt)) != mut.masked {
			t.Errorf("IPv4 byte %d: masked %v, want %v", mut.off, got == icrc.Get(pkt), mut.masked)
		}
	}
	icrc.Put(pkt, 0xdeadbeef)
	if icrc.Get(pkt) != 0xdeadbeef || !bytes.Equal(pkt[len(pkt)-4:], []byte{0xef, 0xbe, 0xad, 0xde}) {
		t.Error("ICRC is not stored little-endian")
	}
}

// TestBadInput checks that malformed headers and short packets are
// rejected, not read out of bounds.
func TestBadInput(t *testing.T) {
	pkt := make([]byte, 16)
	ip := ipv4Header(icrc.V4{}, 0, 16)
	udp := udpHeader(1, 4791, 16)
	cases := []struct {
		name        string
		ip, udp, pk []byte
	}{
		{"short packet", ip, udp, pkt[:15]},
		{"empty ip", nil, udp, pkt},
		{"short udp", ip, udp[:7], pkt},
		{"ihl 4", append([]byte{0x44}, ip[1:]...), udp, pkt},
		{"ihl past header", append([]byte{0x46}, ip[1:]...), udp, pkt},
		{"version 5", append([]byte{0x55}, ip[1:]...), udp, pkt},
		{"short ipv6", append([]byte{0x60}, make([]byte, 38)...), udp, pkt},
	}
	for _, c := range cases {
		if _, ok := icrc.FromHeaders(c.ip, c.udp, c.pk); ok {
			t.Errorf("%s: accepted", c.name)
		}
	}
	var v4 icrc.V4
	var v6 icrc.V6
	short := make([]byte, 15)
	if v4.Sum(0, short) != 0 || v4.Check(0, short) || v6.Sum(short) != 0 || v6.Check(short) {
		t.Error("short packet: non-zero sum or passing check")
	}
	if _, ok := v4.Recover(short); ok {
		t.Error("short packet: Recover ok")
	}
	v4.Fill(0, short)
	v6.Fill(short)
	if !bytes.Equal(short, make([]byte, 15)) {
		t.Error("Fill wrote into a short packet")
	}
}

// TestRecoverExact fills random packets with random IDs; Recover must give
// back exactly that ID every time.
func TestRecoverExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for i := 0; i < 5000; i++ {
		v := randomV4(rng)
		pkt := randomPacket(rng, 2000)
		id := uint16(rng.Uint32())
		v.Fill(id, pkt)
		got, ok := v.Recover(pkt)
		if !ok || got != id {
			t.Fatalf("trial %d (len %d): Recover = %d, %v; want %d", i, len(pkt), got, ok, id)
		}
		if !v.Check(got, pkt) {
			t.Fatal("recovered ID does not check")
		}
	}
}

// mtuPacket returns a full RC SEND MIDDLE packet at path MTU 1024 (1040
// bytes, BTH to ICRC) with random payload.
func mtuPacket(rng *rand.Rand) []byte {
	h := bth.Header{Opcode: bth.RCSendMiddle, PKey: bth.DefaultPKey, DestQP: 0x11, PSN: bth.PSN(rng.Uint32() & bth.PSNMask)}
	payload := make([]byte, 1024)
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	pkt := make([]byte, bth.PacketLen(h.Opcode, len(payload)))
	if _, err := h.Encode(pkt, payload); err != nil {
		panic(err)
	}
	return pkt
}

// TestRecoverSingleByte tries every single-byte corruption of a 272-byte
// and a 1040-byte packet. CRC-32 alone catches them all; with the ID
// unknown, exactly 15 of the 255 corruptions of the byte at offset 93
// (counted from the BTH, IPv4 without options) mimic an ID change and
// pass. That offset and count follow from the CRC polynomial alone (the
// next such offset is 1776), so they are asserted exactly.
func TestRecoverSingleByte(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	v := randomV4(rng)
	for _, pkt := range [][]byte{randomPacketLen(rng, 272), mtuPacket(rng)} {
		v.Fill(uint16(rng.Uint32()), pkt)
		accepted := map[int]int{}
		for i := range pkt {
			if i == 4 {
				continue // masked by design
			}
			for d := 1; d < 256; d++ {
				pkt[i] ^= byte(d)
				if _, ok := v.Recover(pkt); ok {
					accepted[i]++
				}
				pkt[i] ^= byte(d)
			}
		}
		if len(accepted) != 1 || accepted[93] != 15 {
			t.Errorf("%d-byte packet: single-byte corruptions accepted at offsets %v, want 15 at 93", len(pkt), accepted)
		}
	}
}

// randomPacketLen is an RC SEND ONLY packet of exactly n bytes.
func randomPacketLen(rng *rand.Rand, n int) []byte {
	pkt := mtuPacket(rng)[:n]
	pkt[0] = byte(bth.RCSendOnly)
	return pkt
}

// TestRecoverFalseAccepts measures how often Recover accepts a corrupted
// MTU-size packet, with a fixed seed, over 200,000 trials of each kind:
//
//   - one random byte changed: the exact count above predicts 15 in
//     264,945, so about 11 accepts (2^-14); the bound 30 is beyond any
//     plausible outcome of that rate (Poisson tail below 10^-5).
//   - two to eight random bytes rewritten: these behave like random
//     errors, passing with probability 2^-16 (about 3 expected); bound 20.
//
// A check that ignored the ICRC would accept all of them. BTH byte 4 is
// never corrupted: the ICRC masks it by design.
func TestRecoverFalseAccepts(t *testing.T) {
	const trials = 200000
	rng := rand.New(rand.NewPCG(13, 14))
	v := randomV4(rng)
	pkts := make([][]byte, 64)
	for i := range pkts {
		pkts[i] = mtuPacket(rng)
		v.Fill(uint16(rng.Uint32()), pkts[i])
	}
	var single, multi int
	pkt := make([]byte, len(pkts[0]))
	for i := 0; i < trials; i++ {
		orig := pkts[i%len(pkts)]
		copy(pkt, orig)
		pkt[pos(rng, len(pkt))] ^= byte(1 + rng.IntN(255))
		if _, ok := v.Recover(pkt); ok {
			single++
		}
		copy(pkt, orig)
		for n := 2 + rng.IntN(7); n > 0; n-- {
			pkt[pos(rng, len(pkt))] = byte(rng.Uint32())
		}
		if bytes.Equal(pkt, orig) {
			continue // the random bytes happened to be the same
		}
		if _, ok := v.Recover(pkt); ok {
			multi++
		}
	}
	t.Logf("false accepts: %d of %d single-byte (2^-14 predicts %.1f), %d of %d multi-byte (2^-16 predicts %.1f)",
		single, trials, trials*15.0/264945, multi, trials, trials/65536.0)
	if single > 30 || multi > 20 {
		t.Errorf("false accepts: %d single-byte, %d multi-byte of %d each", single, multi, trials)
	}
}

// pos picks a byte to corrupt: anywhere but BTH byte 4, which the ICRC
// masks by design (FECN and BECN may change in flight).
func pos(rng *rand.Rand, n int) int {
	for {
		if i := rng.IntN(n); i != 4 {
			return i
		}
	}
}

// TestZeroAllocs checks that the per-packet functions do not allocate.
func TestZeroAllocs(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	v4, v6 := randomV4(rng), randomV6(rng)
	for _, n := range []int{1024, 4096} {
		pkt := benchPacket(n)
		ip, udp := ipv4Header(v4, 3, len(pkt)), udpHeader(v4.SrcPort, v4.DstPort, len(pkt))
		v4.Fill(3, pkt)
		fns := map[string]func(){
			"V4.Sum":      func() { sink = v4.Sum(3, pkt) },
			"V4.Check":    func() { _ = v4.Check(3, pkt) },
			"V4.Recover":  func() { _, _ = v4.Recover(pkt) },
			"V6.Sum":      func() { sink = v6.Sum(pkt) },
			"FromHeaders": func() { sink, _ = icrc.FromHeaders(ip, udp, pkt) },
		}
		for name, fn := range fns {
			if a := testing.AllocsPerRun(100, fn); a != 0 {
				t.Errorf("%s on %d bytes: %v allocs", name, n, a)
			}
		}
	}
}
