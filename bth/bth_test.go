package bth_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/reth"
)

func TestPSNArithmetic(t *testing.T) {
	const max = bth.PSNMask
	adds := []struct {
		p    bth.PSN
		n    int
		want bth.PSN
	}{
		{0, 1, 1}, {max, 1, 0}, {max, 2, 1}, {0, -1, max}, {1, -2, max}, {5, -5, 0},
		{0, 1 << 24, 0}, {3, -(1 << 24), 3}, {max - 1, 1<<24 + 3, 1}, {100, -(3<<24 + 101), max},
		{0x123456, 0x800000, 0x923456},
	}
	for _, c := range adds {
		if got := c.p.Add(c.n); got != c.want {
			t.Errorf("%#x.Add(%d) = %#x, want %#x", c.p, c.n, got, c.want)
		}
	}
	if bth.PSN(max).Next() != 0 || bth.PSN(7).Next() != 8 {
		t.Error("Next does not wrap at 2^24")
	}
	diffs := []struct {
		p, q bth.PSN
		want int32
	}{
		{0, max, 1}, {max, 0, -1}, {5, 3, 2}, {3, 5, -2}, {2, max - 1, 4}, {max - 1, 2, -4},
		{0x7fffff, 0, 0x7fffff}, {0, 0x7fffff, -0x7fffff},
		{0x800000, 0, -0x800000}, {0, 0x800000, -0x800000}, // exactly half way: both negative
		{10, 10, 0},
	}
	for _, c := range diffs {
		if got := c.p.Diff(c.q); got != c.want {
			t.Errorf("%#x.Diff(%#x) = %d, want %d", c.p, c.q, got, c.want)
		}
		if c.p.Before(c.q) != (c.want < 0) || c.p.After(c.q) != (c.want > 0) {
			t.Errorf("%#x vs %#x: Before %v After %v for distance %d", c.p, c.q, c.p.Before(c.q), c.p.After(c.q), c.want)
		}
	}
	// Diff and Add are inverse over the whole representable range.
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 10000; i++ {
		p := bth.PSN(rng.Uint32() & max)
		n := int(rng.Int32N(1<<24)) - 1<<23
		if got := p.Add(n).Diff(p); int(got) != n {
			t.Fatalf("%#x.Add(%d).Diff = %d", p, n, got)
		}
		if !p.Add(n).Valid() {
			t.Fatalf("%#x.Add(%d) not 24-bit", p, n)
		}
	}
	if bth.PSN(1 << 24).Valid() {
		t.Error("2^24 is Valid")
	}
}

// ibta is the opcode table written out from the IBTA specification
// (volume 1, table 35, plus the memory placement extensions' FLUSH and
// ATOMIC WRITE and RoCEv2's CNP), independently of the package's
// generated table.
var ibta = []struct {
	op      bth.Opcode
	name    string
	pos     string // F, M, L or O (only)
	ext     bth.Ext
	hdrLen  int
	payload bool
}{
	{0x00, "RC_SEND_FIRST", "F", 0, 12, true},
	{0x01, "RC_SEND_MIDDLE", "M", 0, 12, true},
	{0x02, "RC_SEND_LAST", "L", 0, 12, true},
	{0x03, "RC_SEND_LAST_WITH_IMMEDIATE", "L", bth.ExtImmDt, 16, true},
	{0x04, "RC_SEND_ONLY", "O", 0, 12, true},
	{0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", "O", bth.ExtImmDt, 16, true},
	{0x06, "RC_RDMA_WRITE_FIRST", "F", bth.ExtRETH, 28, true},
	{0x07, "RC_RDMA_WRITE_MIDDLE", "M", 0, 12, true},
	{0x08, "RC_RDMA_WRITE_LAST", "L", 0, 12, true},
	{0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", "L", bth.ExtImmDt, 16, true},
	{0x0a, "RC_RDMA_WRITE_ONLY", "O", bth.ExtRETH, 28, true},
	{0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", "O", bth.ExtRETH | bth.ExtImmDt, 32, true},
	{0x0c, "RC_RDMA_READ_REQUEST", "O", bth.ExtRETH, 28, false},
	{0x0d, "RC_RDMA_READ_RESPONSE_FIRST", "F", bth.ExtAETH, 16, true},
	{0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE", "M", 0, 12, true},
	{0x0f, "RC_RDMA_READ_RESPONSE_LAST", "L", bth.ExtAETH, 16, true},
	{0x10, "RC_RDMA_READ_RESPONSE_ONLY", "O", bth.ExtAETH, 16, true},
	{0x11, "RC_ACKNOWLEDGE", "O", bth.ExtAETH, 16, false},
	{0x12, "RC_ATOMIC_ACKNOWLEDGE", "O", bth.ExtAETH | bth.ExtAtomicAckETH, 24, false},
	{0x13, "RC_COMPARE_SWAP", "O", bth.ExtAtomicETH, 40, false},
	{0x14, "RC_FETCH_ADD", "O", bth.ExtAtomicETH, 40, false},
	{0x16, "RC_SEND_LAST_WITH_INVALIDATE", "L", bth.ExtIETH, 16, true},
	{0x17, "RC_SEND_ONLY_WITH_INVALIDATE", "O", bth.ExtIETH, 16, true},
	{0x1c, "RC_FLUSH", "O", bth.ExtFETH | bth.ExtRETH, 32, false},
	{0x1d, "RC_ATOMIC_WRITE", "O", bth.ExtRETH, 28, true},
	{0x20, "UC_SEND_FIRST", "F", 0, 12, true},
	{0x21, "UC_SEND_MIDDLE", "M", 0, 12, true},
	{0x22, "UC_SEND_LAST", "L", 0, 12, true},
	{0x23, "UC_SEND_LAST_WITH_IMMEDIATE", "L", bth.ExtImmDt, 16, true},
	{0x24, "UC_SEND_ONLY", "O", 0, 12, true},
	{0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", "O", bth.ExtImmDt, 16, true},
	{0x26, "UC_RDMA_WRITE_FIRST", "F", bth.ExtRETH, 28, true},
	{0x27, "UC_RDMA_WRITE_MIDDLE", "M", 0, 12, true},
	{0x28, "UC_RDMA_WRITE_LAST", "L", 0, 12, true},
	{0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", "L", bth.ExtImmDt, 16, true},
	{0x2a, "UC_RDMA_WRITE_ONLY", "O", bth.ExtRETH, 28, true},
	{0x2b, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", "O", bth.ExtRETH | bth.ExtImmDt, 32, true},
	{0x64, "UD_SEND_ONLY", "O", bth.ExtDETH, 20, true},
	{0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", "O", bth.ExtDETH | bth.ExtImmDt, 24, true},
	{0x81, "CNP", "O", bth.ExtCNP, 28, false},
}

// extOrder lists the extended headers in wire order with their lengths.
var extOrder = []struct {
	e   bth.Ext
	len int
}{
	{bth.ExtRDETH, reth.RDETHLen}, {bth.ExtDETH, reth.DETHLen}, {bth.ExtFETH, reth.FETHLen},
	{bth.ExtRETH, reth.RETHLen}, {bth.ExtAtomicETH, reth.AtomicETHLen}, {bth.ExtAETH, reth.AETHLen},
	{bth.ExtAtomicAckETH, reth.AtomicAckETHLen}, {bth.ExtImmDt, reth.ImmDtLen}, {bth.ExtIETH, reth.IETHLen},
	{bth.ExtCNP, reth.CNPLen},
}

// TestOpcodeTable checks every one of the 256 opcodes against the IBTA
// table: the RC, UC, UD and CNP sets exactly, each row's extended headers,
// their offsets and the header length as their sum, payload and position
// flags; RD opcodes (0x40-0x54) exist for decoding only.
func TestOpcodeTable(t *testing.T) {
	want := map[bth.Opcode]int{}
	for i, row := range ibta {
		want[row.op] = i
	}
	for v := 0; v < 256; v++ {
		op := bth.Opcode(v)
		in, ok := bth.Lookup(op)
		i, isIBTA := want[op]
		isRD := v >= 0x40 && v <= 0x54
		switch {
		case isRD:
			if !ok || in.Class != bth.RD {
				t.Errorf("%#x: RD opcode missing", v)
			}
			continue
		case ok != isIBTA:
			t.Errorf("%#x: in table %v, in IBTA %v", v, ok, isIBTA)
			continue
		case !ok:
			if op.Info() != nil || !strings.HasPrefix(op.String(), "OPCODE_0x") {
				t.Errorf("%#x: unknown opcode has Info or name %q", v, op.String())
			}
			continue
		}
		row := ibta[i]
		if in.Opcode != op || in.Name != row.name || op.String() != row.name || op.Info() != in {
			t.Errorf("%#x: name %q, want %q", v, in.Name, row.name)
		}
		if in.Ext != row.ext || in.HdrLen != row.hdrLen || in.Has(bth.Payload) != row.payload {
			t.Errorf("%s: ext %b len %d payload %v, want %b %d %v", row.name, in.Ext, in.HdrLen,
				in.Has(bth.Payload), row.ext, row.hdrLen, row.payload)
		}
		wantClass := map[string]bth.Class{"RC": bth.RC, "UC": bth.UC, "UD": bth.UD, "CN": bth.CNP}[row.name[:2]]
		if in.Class != wantClass || !strings.HasPrefix(row.name, in.Class.String()) {
			t.Errorf("%s: class %v", row.name, in.Class)
		}
		pos := map[string]bth.Flags{"F": bth.First, "M": bth.Middle, "L": bth.Last, "O": bth.Only}[row.pos]
		if in.Flags&bth.Only|in.Flags&bth.Middle != pos {
			t.Errorf("%s: position flags %b, want %b", row.name, in.Flags&(bth.Only|bth.Middle), pos)
		}
		off := bth.Len
		for _, e := range extOrder {
			if row.ext&e.e == 0 {
				if in.Offset(e.e) != -1 {
					t.Errorf("%s: offset of absent header %b is %d", row.name, e.e, in.Offset(e.e))
				}
				continue
			}
			if in.Offset(e.e) != off {
				t.Errorf("%s: header %b at %d, want %d", row.name, e.e, in.Offset(e.e), off)
			}
			off += e.len
		}
		if off != in.HdrLen {
			t.Errorf("%s: extended headers sum to %d, HdrLen %d", row.name, off, in.HdrLen)
		}
		if got := bth.PacketLen(op, 5); got != row.hdrLen+8+bth.ICRCLen || (!row.payload && bth.PacketLen(op, 0) != row.hdrLen+4) {
			t.Errorf("%s: PacketLen(5) = %d", row.name, got)
		}
	}
	if bth.PacketLen(0x1f, 0) != -1 {
		t.Error("PacketLen of an unknown opcode")
	}
	if bth.Class(7).String() != "class7" || bth.CNP.String() != "CNP" {
		t.Error("Class names")
	}
}

// TestSpecialOpcodes checks the three opcodes with special rules: CNP has
// its 16-byte body and no payload; FLUSH is FETH then RETH, no payload;
// ATOMIC WRITE is RETH plus exactly 8 bytes of payload.
func TestSpecialOpcodes(t *testing.T) {
	buf := make([]byte, 64)
	h := bth.Header{Opcode: bth.CNPOpcode, PKey: bth.DefaultPKey, DestQP: 9, BECN: true}
	n, err := h.Encode(buf, nil)
	if err != nil || n != 12+16+4 {
		t.Fatalf("CNP encode: %d %v", n, err)
	}
	p, err := bth.Parse(buf[:n])
	if err != nil || len(p.CNP()) != 16 || len(p.Payload()) != 0 || !p.BTH().BECN() {
		t.Errorf("CNP parse: %v %x", err, p.CNP())
	}
	if _, err := bth.Parse(append(bytes.Clone(buf[:n-4]), 0, 0, 0, 0, 1, 2, 3, 4)); !errors.Is(err, bth.ErrPayload) {
		t.Errorf("CNP with payload: %v", err)
	}
	if _, err := h.Encode(buf, []byte{1, 2, 3, 4}); !errors.Is(err, bth.ErrPayload) {
		t.Errorf("CNP encode with payload: %v", err)
	}

	h = bth.Header{Opcode: bth.RCFlush, FETH: 0x21, RETH: bth.RETHFields{VA: 0x1000, RKey: 7, DMALen: 64}}
	n, err = h.Encode(buf, nil)
	if err != nil || n != 36 {
		t.Fatalf("FLUSH encode: %d %v", n, err)
	}
	p, _ = bth.Parse(buf[:n])
	if p.FETH().SelectivityLevel() != 2 || p.FETH().PlacementType() != 1 || p.RETH().VA() != 0x1000 || p.Info.Offset(bth.ExtFETH) != 12 {
		t.Errorf("FLUSH: FETH %x RETH %x", p.FETH(), p.RETH())
	}

	for _, plen := range []int{0, 4, 7, 9, 16} {
		h = bth.Header{Opcode: bth.RCAtomicWrite}
		if _, err := h.Encode(buf, make([]byte, plen)); !errors.Is(err, bth.ErrAtomicWrite) {
			t.Errorf("ATOMIC WRITE with %d bytes: %v", plen, err)
		}
		pkt := make([]byte, 28+plen+bth.PadFor(plen)+4)
		pkt[0] = byte(bth.RCAtomicWrite)
		pkt[1] = byte(bth.PadFor(plen)) << 4
		if _, err := bth.Parse(pkt); !errors.Is(err, bth.ErrAtomicWrite) {
			t.Errorf("parse ATOMIC WRITE with %d bytes: %v", plen, err)
		}
	}
	n, err = h.Encode(buf, []byte{1, 2, 3, 4, 5, 6, 7, 8})
	if err != nil || n != 40 {
		t.Fatalf("ATOMIC WRITE: %d %v", n, err)
	}
	if p, err := bth.Parse(buf[:n]); err != nil || !bytes.Equal(p.Payload(), []byte{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Errorf("ATOMIC WRITE parse: %v", err)
	}
}

// randomHeader fills every field of a Header for op with random values in
// their wire ranges, and returns it with the Header Decode must give back.
func randomHeader(rng *rand.Rand, op bth.Opcode, payloadLen int) (h, want bth.Header) {
	h = bth.Header{
		Opcode: op, SE: rng.IntN(2) == 1, MigReq: rng.IntN(2) == 1, PKey: uint16(rng.Uint32()),
		FECN: rng.IntN(2) == 1, BECN: rng.IntN(2) == 1, Resv6: uint8(rng.IntN(64)), DestQP: rng.Uint32() & 0xffffff,
		AckReq: rng.IntN(2) == 1, Resv7: uint8(rng.IntN(128)), PSN: bth.PSN(rng.Uint32() & bth.PSNMask),
		RETH:      bth.RETHFields{VA: rng.Uint64(), RKey: rng.Uint32(), DMALen: rng.Uint32()},
		AETH:      bth.AETHFields{Syndrome: reth.Syndrome(rng.Uint32()), MSN: rng.Uint32() & 0xffffff},
		Atomic:    bth.AtomicFields{VA: rng.Uint64(), RKey: rng.Uint32(), SwapAdd: rng.Uint64(), Compare: rng.Uint64()},
		AtomicAck: rng.Uint64(), Imm: rng.Uint32(), IETHRKey: rng.Uint32(),
		DETH: bth.DETHFields{QKey: rng.Uint32(), SrcQP: rng.Uint32() & 0xffffff},
		FETH: rng.Uint32(), RDETH: rng.Uint32(),
	}
	want = h
	want.Pad = uint8(bth.PadFor(payloadLen))
	in := op.Info()
	if in.Ext&bth.ExtRETH == 0 {
		want.RETH = bth.RETHFields{}
	}
	if in.Ext&bth.ExtAETH == 0 {
		want.AETH = bth.AETHFields{}
	}
	if in.Ext&bth.ExtAtomicETH == 0 {
		want.Atomic = bth.AtomicFields{}
	}
	if in.Ext&bth.ExtAtomicAckETH == 0 {
		want.AtomicAck = 0
	}
	if in.Ext&bth.ExtImmDt == 0 {
		want.Imm = 0
	}
	if in.Ext&bth.ExtIETH == 0 {
		want.IETHRKey = 0
	}
	if in.Ext&bth.ExtDETH == 0 {
		want.DETH = bth.DETHFields{}
	}
	if in.Ext&bth.ExtFETH == 0 {
		want.FETH = 0
	}
	if in.Ext&bth.ExtRDETH == 0 {
		want.RDETH = 0
	}
	return h, want
}

// payloadLen picks a payload length the opcode accepts.
func payloadLen(rng *rand.Rand, in *bth.Info) int {
	switch {
	case in.Op == bth.OpAtomicWrite:
		return 8
	case in.Has(bth.Payload):
		return rng.IntN(300)
	}
	return 0
}

// TestEncodeDecode encodes random headers for every opcode and checks
// that Parse and Decode give every field back and the views agree.
func TestEncodeDecode(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 512)
	for v := 0; v < 256; v++ {
		in, ok := bth.Lookup(bth.Opcode(v))
		if !ok {
			continue
		}
		for i := 0; i < 20; i++ {
			plen := payloadLen(rng, in)
			payload := make([]byte, plen)
			for j := range payload {
				payload[j] = byte(rng.Uint32())
			}
			h, want := randomHeader(rng, in.Opcode, plen)
			for j := range buf {
				buf[j] = 0xa5 // pad and ICRC must be written, not left over
			}
			n, err := h.Encode(buf, payload)
			if err != nil || n != bth.PacketLen(in.Opcode, plen) {
				t.Fatalf("%v: Encode = %d, %v", in.Opcode, n, err)
			}
			p, err := bth.Parse(buf[:n])
			if err != nil {
				t.Fatalf("%v: Parse: %v", in.Opcode, err)
			}
			if got := p.Decode(); got != want {
				t.Fatalf("%v: Decode\n%+v\nwant\n%+v", in.Opcode, got, want)
			}
			if !bytes.Equal(p.Payload(), payload) || p.ICRC() != 0 || !allZero(buf[in.HdrLen+plen:n]) {
				t.Fatalf("%v: payload, pad or ICRC placeholder wrong", in.Opcode)
			}
			b := p.BTH()
			if b.Opcode() != h.Opcode || b.SE() != h.SE || b.MigReq() != h.MigReq || b.PadCount() != int(want.Pad) ||
				b.TVer() != 0 || b.PKey() != h.PKey || b.FECN() != h.FECN || b.BECN() != h.BECN ||
				b.Resv6() != h.Resv6 || b.DestQP() != h.DestQP || b.AckReq() != h.AckReq || b.Resv7() != h.Resv7 || b.PSN() != h.PSN {
				t.Fatalf("%v: BTH view disagrees with the header", in.Opcode)
			}
		}
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// TestBTHSetters checks the single-field setters against the accessors
// and that each leaves the other fields alone.
func TestBTHSetters(t *testing.T) {
	b := bth.BTH(make([]byte, bth.Len))
	b.SetOpcode(bth.RCSendOnly)
	b.SetFlags(true, true, 3, 0)
	b.SetPKey(0x1234)
	b.SetDestQP(0xabcdef)
	b.SetFECN(true)
	b.SetBECN(true)
	b.SetAckReq(true)
	b.SetPSN(0x765432)
	if !bytes.Equal(b, []byte{0x04, 0xf0, 0x12, 0x34, 0xc0, 0xab, 0xcd, 0xef, 0x80, 0x76, 0x54, 0x32}) {
		t.Fatalf("BTH % x", []byte(b))
	}
	b.SetSE(false)
	b.SetPadCount(1)
	b.SetFECN(false)
	b.SetAckReq(false)
	if b.SE() || !b.MigReq() || b.PadCount() != 1 || b.FECN() || !b.BECN() || b.AckReq() || b.PSN() != 0x765432 {
		t.Errorf("after clearing: % x", []byte(b))
	}
	b.SetRaw(0xff, 0xff)
	if b.Resv6() != 0x3f || b.Resv7() != 0x7f || !b.FECN() || !b.AckReq() {
		t.Errorf("SetRaw: % x", []byte(b))
	}
	b.SetDestQP(1) // clears the reserved bits of byte 4, keeps FECN/BECN
	if b.Resv6() != 0 || !b.FECN() || !b.BECN() {
		t.Errorf("SetDestQP: % x", []byte(b))
	}
}

// TestEncodeRejects checks each Encode error and that a failed Encode
// writes nothing.
func TestEncodeRejects(t *testing.T) {
	cases := []struct {
		h       bth.Header
		payload []byte
		buf     int
		want    error
	}{
		{bth.Header{Opcode: 0x1f}, nil, 64, bth.ErrUnknownOpcode},
		{bth.Header{Opcode: 0x80}, nil, 64, bth.ErrUnknownOpcode},
		{bth.Header{Opcode: bth.RCAck}, []byte{1}, 64, bth.ErrPayload},
		{bth.Header{Opcode: bth.RCReadRequest}, []byte{1, 2, 3, 4}, 64, bth.ErrPayload},
		{bth.Header{Opcode: bth.RCCompareSwap}, []byte{1}, 64, bth.ErrPayload},
		{bth.Header{Opcode: bth.RCAtomicWrite}, []byte{1}, 64, bth.ErrAtomicWrite},
		{bth.Header{Opcode: bth.RCSendOnly}, []byte{1, 2, 3}, 12 + 4 + 4 - 1, bth.ErrBufferSmall},
		{bth.Header{Opcode: bth.RCAck}, nil, 19, bth.ErrBufferSmall},
		{bth.Header{Opcode: bth.RCAck}, nil, 0, bth.ErrBufferSmall},
	}
	for _, c := range cases {
		buf := bytes.Repeat([]byte{0xee}, c.buf)
		n, err := c.h.Encode(buf, c.payload)
		if !errors.Is(err, c.want) || n != 0 {
			t.Errorf("%v with %d payload bytes into %d: %d, %v; want %v", c.h.Opcode, len(c.payload), c.buf, n, err, c.want)
		}
		if !bytes.Equal(buf, bytes.Repeat([]byte{0xee}, c.buf)) {
			t.Errorf("%v: failed Encode wrote to the buffer", c.h.Opcode)
		}
	}
}

// TestParseRejects checks truncation at every length for every opcode,
// every non-zero TVer, pad counts larger than the body or on payload-less
// opcodes, and bodies the pad does not align.
func TestParseRejects(t *testing.T) {
	buf := make([]byte, 256)
	for v := 0; v < 256; v++ {
		in, ok := bth.Lookup(bth.Opcode(v))
		if !ok {
			b := make([]byte, 64)
			b[0] = byte(v)
			if _, err := bth.Parse(b); !errors.Is(err, bth.ErrUnknownOpcode) {
				t.Errorf("%#x: %v, want ErrUnknownOpcode", v, err)
			}
			continue
		}
		plen := 0
		if in.Op == bth.OpAtomicWrite {
			plen = 8
		}
		h := bth.Header{Opcode: in.Opcode}
		n, err := h.Encode(buf, make([]byte, plen))
		if err != nil {
			t.Fatal(err)
		}
		for cut := 0; cut < in.HdrLen+bth.ICRCLen; cut++ {
			if _, err := bth.Parse(buf[:cut]); !errors.Is(err, bth.ErrTruncated) {
				t.Errorf("%v cut to %d: %v, want ErrTruncated", in.Opcode, cut, err)
			}
		}
		for tver := 1; tver < 16; tver++ {
			b := bytes.Clone(buf[:n])
			b[1] |= byte(tver)
			if _, err := bth.Parse(b); !errors.Is(err, bth.ErrTVer) {
				t.Errorf("%v TVer %d: %v", in.Opcode, tver, err)
			}
		}
		if !in.Has(bth.Payload) {
			b := bytes.Clone(buf[:n])
			b[1] |= 1 << 4
			if _, err := bth.Parse(b); !errors.Is(err, bth.ErrPayload) {
				t.Errorf("%v with pad count: %v", in.Opcode, err)
			}
			if _, err := bth.Parse(append(bytes.Clone(buf[:n]), 0, 0, 0, 0)); !errors.Is(err, bth.ErrPayload) {
				t.Errorf("%v with 4 extra bytes: %v", in.Opcode, err)
			}
			continue
		}
		if in.Op == bth.OpAtomicWrite {
			continue
		}
		// Payload-carrying: an empty body with a pad count, and bodies of
		// 1..3 and 5 bytes (unaligned whatever the pad).
		b := bytes.Clone(buf[:n])
		b[1] |= 2 << 4
		if _, err := bth.Parse(b); !errors.Is(err, bth.ErrPayload) {
			t.Errorf("%v pad 2 on an empty body: %v", in.Opcode, err)
		}
		for _, body := range []int{1, 2, 3, 5} {
			b := append(bytes.Clone(buf[:in.HdrLen]), make([]byte, body+bth.ICRCLen)...)
			if _, err := bth.Parse(b); !errors.Is(err, bth.ErrAlign) {
				t.Errorf("%v with a %d-byte body: %v", in.Opcode, body, err)
			}
		}
	}
}

// TestFind: every opcode in the table is found again from its class,
// operation, position and carried flags, and shapes the table lacks are
// refused.
func TestFind(t *testing.T) {
	n := 0
	for i := range 256 {
		in, ok := bth.Lookup(bth.Opcode(i))
		if !ok {
			continue
		}
		n++
		if op, ok := bth.Find(in.Class, in.Op, in.Flags, in.Flags); !ok || op != bth.Opcode(i) {
			t.Errorf("%v: found %v %v", in.Name, op, ok)
		}
	}
	if n < 40 {
		t.Fatalf("only %d opcodes in the table", n)
	}
	for _, c := range []struct {
		c         bth.Class
		op        bth.Op
		pos, with bth.Flags
		want      bth.Opcode
		ok        bool
	}{
		{bth.RC, bth.OpSend, bth.Last, bth.Imm, bth.RCSendLastImm, true},
		{bth.UC, bth.OpWrite, bth.Only, bth.Imm, bth.UCWriteOnlyImm, true},
		{bth.RC, bth.OpSend, bth.Only, bth.Inv, bth.RCSendOnlyInv, true},
		{bth.UD, bth.OpSend, bth.Only, 0, bth.UDSendOnly, true},
		{bth.UD, bth.OpSend, bth.First, 0, 0, false},
		{bth.UC, bth.OpSend, bth.Last, bth.Inv, 0, false},
		{bth.UC, bth.OpReadRequest, bth.Only, 0, 0, false},
		{bth.RC, bth.OpWrite, bth.Middle, bth.Imm, 0, false},
		{bth.Class(7), bth.OpSend, bth.Only, 0, 0, false},
		{bth.RC, bth.Op(200), bth.Only, 0, 0, false},
	} {
		if op, ok := bth.Find(c.c, c.op, c.pos, c.with); op != c.want || ok != c.ok {
			t.Errorf("bth.Find(%v, %d, %#x, %#x) = %v %v, want %v %v", c.c, c.op, c.pos, c.with, op, ok, c.want, c.ok)
		}
	}
}
