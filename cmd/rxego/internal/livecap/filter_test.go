//go:build linux

package livecap_test

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/net/bpf"

	"github.com/rxego/rxego/cmd/rxego/internal/livecap"
)

// frame builds an Ethernet frame carrying UDP from src:sport to dst:dport
// (IPv4 or IPv6 by the addresses), with fragOff as IPv4's flags and
// fragment offset field.
func frame(src, dst netip.Addr, sport, dport uint16, fragOff uint16) []byte {
	// The two versions differ only in where things lie.
	etherType, ipLen, first, proto, srcAt, dstAt := uint16(0x86dd), 40, byte(0x60), 6, 8, 24
	if src.Is4() {
		etherType, ipLen, first, proto, srcAt, dstAt = 0x0800, 20, 0x45, 9, 12, 16
	}
	b := make([]byte, 14+ipLen+8+16)
	binary.BigEndian.PutUint16(b[12:], etherType)
	ip := b[14:]
	ip[0], ip[proto] = first, 17
	if src.Is4() {
		binary.BigEndian.PutUint16(ip[6:], fragOff)
	}
	copy(ip[srcAt:], src.AsSlice())
	copy(ip[dstAt:], dst.AsSlice())
	binary.BigEndian.PutUint16(ip[ipLen:], sport)
	binary.BigEndian.PutUint16(ip[ipLen+2:], dport)
	return b
}

// TestFilter runs the kernel filter in x/net/bpf's VM over frames to and
// from a host and others: "udp port 4791" alone, and with "and host".
func TestFilter(t *testing.T) {
	h4, o4 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	p4 := netip.MustParseAddr("198.18.0.3")
	h6, o6 := netip.MustParseAddr("fd00::1:2:3:4"), netip.MustParseAddr("fd00::1:2:3:5")
	p6 := netip.MustParseAddr("fd00::9")
	type frameCase struct {
		name             string
		data             []byte
		roce, h4ok, h6ok bool // passes "udp port 4791"; with host h4; with host h6
	}
	cases := []frameCase{
		{"v4 from host", frame(h4, o4, 4791, 4791, 0), true, true, false},
		{"v4 to host", frame(o4, h4, 50000, 4791, 0), true, true, false},
		{"v4 reply to host", frame(o4, h4, 4791, 50000, 0), true, true, false},
		{"v4 others", frame(o4, p4, 4791, 4791, 0), true, false, false},
		{"v4 host, other port", frame(h4, o4, 4790, 4792, 0), false, false, false},
		{"v4 host, a fragment", frame(h4, o4, 4791, 4791, 0x0010), false, false, false},
		{"v4 host, DF set", frame(h4, o4, 4791, 4791, 0x4000), true, true, false},
		{"v6 from host", frame(h6, o6, 4791, 4791, 0), true, false, true},
		{"v6 to host", frame(o6, h6, 4791, 4791, 0), true, false, true},
		{"v6 others", frame(o6, p6, 4791, 4791, 0), true, false, false},
		{"v6 host, other port", frame(o6, h6, 1, 2, 0), false, false, false},
	}
	// Addresses that share all but one word with the host: every word
	// must match, not only the first or the last.
	for i := range 4 {
		near := h6.As16()
		near[4*i+3] ^= 0x80
		c := frameCase{name: "v6 host differs in word " + string(rune('0'+i)), data: frame(netip.AddrFrom16(near), o6, 4791, 4791, 0), roce: true}
		cases = append(cases, c)
	}
	for _, f := range []struct {
		host netip.Addr
		want func(frameCase) bool
	}{
		{netip.Addr{}, func(c frameCase) bool { return c.roce }},
		{h4, func(c frameCase) bool { return c.h4ok }},
		{netip.AddrFrom16(h4.As16()), func(c frameCase) bool { return c.h4ok }}, // IPv4-mapped: the IPv4 address
		{h6, func(c frameCase) bool { return c.h6ok }},
	} {
		vm, err := bpf.NewVM(livecap.Filter(f.host))
		if err != nil {
			t.Fatalf("host %v: %v", f.host, err)
		}
		for _, c := range cases {
			n, err := vm.Run(c.data)
			if err != nil {
				t.Fatalf("host %v, %s: %v", f.host, c.name, err)
			}
			if got := n > 0; got != f.want(c) {
				t.Errorf("host %v, %s: passed %v, want %v", f.host, c.name, got, f.want(c))
			}
		}
	}
}
