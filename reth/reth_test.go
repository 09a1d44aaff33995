package reth_test

import (
	"bytes"
	"testing"

	"github.com/rxego/rxego/reth"
)

// TestSyndromes checks every AETH syndrome kind: ACK with each credit
// count, RNR NAK with each timer value, each NAK code, and the reserved
// kind, against the IBTA bit layout (bits 6..5 kind, 4..0 value).
func TestSyndromes(t *testing.T) {
	for v := uint8(0); v < 32; v++ {
		if s := reth.ACKSyndrome(v); uint8(s) != v || s.Kind() != reth.KindACK || s.Value() != v || s.String() != "ACK" {
			t.Errorf("ACK credits %d: %#x %v %q", v, uint8(s), s.Kind(), s)
		}
		s := reth.RNRSyndrome(v)
		if uint8(s) != 0x20|v || s.Kind() != reth.KindRNR || s.Value() != v {
			t.Errorf("RNR timer %d: %#x %v", v, uint8(s), s.Kind())
		}
		if r := reth.Syndrome(0x40 | v); r.Kind() != reth.KindReserved || r.String()[:8] != "RESERVED" {
			t.Errorf("reserved %#x: %v %q", uint8(r), r.Kind(), r)
		}
	}
	// rxe's RNR NAK for min_rnr_timer 20, as captured.
	if s := reth.RNRSyndrome(20); uint8(s) != 0x34 || s.String() != "RNR_NAK(timer=20)" {
		t.Errorf("RNR 20: %#x %q", uint8(s), s)
	}
	naks := []struct {
		code uint8
		byte uint8
		name string
	}{
		{reth.NAKPSNSeqError, 0x60, "NAK(PSN_SEQ_ERR)"},
		{reth.NAKInvalidRequest, 0x61, "NAK(INVALID_REQ)"},
		{reth.NAKRemoteAccess, 0x62, "NAK(REMOTE_ACCESS_ERR)"}, // as captured for a bad rkey
		{reth.NAKRemoteOp, 0x63, "NAK(REMOTE_OP_ERR)"},
		{reth.NAKInvalidRDReq, 0x64, "NAK(INVALID_RD_REQ)"},
		{9, 0x69, "NAK(code=9)"},
	}
	for _, n := range naks {
		s := reth.NAKSyndrome(n.code)
		if uint8(s) != n.byte || s.Kind() != reth.KindNAK || s.Value() != n.code || s.String() != n.name {
			t.Errorf("NAK %d: %#x %v %q", n.code, uint8(s), s.Kind(), s)
		}
	}
	// The top bit is reserved: it does not change the kind.
	if reth.Syndrome(0x9f).Kind() != reth.KindACK || reth.Syndrome(0xe2).Kind() != reth.KindNAK {
		t.Error("bit 7 leaks into the kind")
	}
	if reth.CreditsInvalid != 0x1f || reth.ACKSyndrome(reth.CreditsInvalid) != 0x1f {
		t.Error("rxe's ACK syndrome is 0x1f")
	}
}

// TestViews writes each header through its setter and checks the exact
// big-endian bytes and the accessors.
func TestViews(t *testing.T) {
	r := reth.RETH(make([]byte, reth.RETHLen))
	r.Set(0x0102030405060708, 0x090a0b0c, 0x0d0e0f10)
	if !bytes.Equal(r, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}) ||
		r.VA() != 0x0102030405060708 || r.RKey() != 0x090a0b0c || r.DMALen() != 0x0d0e0f10 {
		t.Errorf("RETH % x", []byte(r))
	}
	a := reth.AETH(make([]byte, reth.AETHLen))
	a.Set(reth.NAKSyndrome(reth.NAKRemoteAccess), 0xff123456) // MSN truncated to 24 bits
	if !bytes.Equal(a, []byte{0x62, 0x12, 0x34, 0x56}) || a.Syndrome() != 0x62 || a.MSN() != 0x123456 {
		t.Errorf("AETH % x", []byte(a))
	}
	at := reth.AtomicETH(make([]byte, reth.AtomicETHLen))
	at.Set(0x1122334455667788, 0x99aabbcc, 0xfffffffffffffffe, 3)
	if at.VA() != 0x1122334455667788 || at.RKey() != 0x99aabbcc || at.SwapAdd() != 0xfffffffffffffffe || at.Compare() != 3 ||
		!bytes.Equal(at[12:20], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}) {
		t.Errorf("AtomicETH % x", []byte(at))
	}
	aa := reth.AtomicAckETH(make([]byte, reth.AtomicAckETHLen))
	aa.SetOrig(1000)
	if aa.Orig() != 1000 || aa[7] != 0xe8 || aa[6] != 0x03 {
		t.Errorf("AtomicAckETH % x", []byte(aa))
	}
	im := reth.ImmDt(make([]byte, reth.ImmDtLen))
	im.SetImm(0x12340001)
	if im.Imm() != 0x12340001 || im[0] != 0x12 {
		t.Errorf("ImmDt % x", []byte(im))
	}
	ie := reth.IETH(make([]byte, reth.IETHLen))
	ie.SetRKey(0xabcdef01)
	if ie.RKey() != 0xabcdef01 || ie[3] != 0x01 {
		t.Errorf("IETH % x", []byte(ie))
	}
	d := reth.DETH(bytes.Repeat([]byte{0xff}, reth.DETHLen))
	d.Set(0x80010000, 0xff000011) // the reserved byte is zeroed, SrcQP 24 bits
	if !bytes.Equal(d, []byte{0x80, 0x01, 0, 0, 0, 0, 0, 0x11}) || d.QKey() != 0x80010000 || d.SrcQP() != 0x11 {
		t.Errorf("DETH % x", []byte(d))
	}
	d[4] = 0xaa // a reserved byte set by a peer is not part of SrcQP
	if d.SrcQP() != 0x11 {
		t.Errorf("DETH SrcQP with reserved byte set: %#x", d.SrcQP())
	}
	f := reth.FETH(make([]byte, reth.FETHLen))
	f.Set(1, 2)
	if f.Raw() != 0x12 || f.SelectivityLevel() != 1 || f.PlacementType() != 2 {
		t.Errorf("FETH % x", []byte(f))
	}
	f.Set(7, 0x1f) // out-of-range values are masked, not spread into reserved bits
	if f.Raw() != 0x3f {
		t.Errorf("FETH masked % x", []byte(f))
	}
	rd := reth.RDETH([]byte{0xff, 0x12, 0x34, 0x56})
	if rd.EECnxt() != 0x123456 {
		t.Errorf("RDETH %#x", rd.EECnxt())
	}
	c := reth.CNP(bytes.Repeat([]byte{0xff}, reth.CNPLen))
	c.Clear()
	if !bytes.Equal(c, make([]byte, reth.CNPLen)) {
		t.Errorf("CNP % x", []byte(c))
	}
}
