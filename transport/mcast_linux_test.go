package transport

import (
	"errors"
	"net/netip"
	"testing"
)

// TestListenMulticastRefuses: a unicast group, or a group joined on an
// address of the other family, is refused before any socket exists.
func TestListenMulticastRefuses(t *testing.T) {
	for _, c := range []struct{ group, iface string }{
		{"127.0.0.1", "127.0.0.1"},
		{"239.1.2.3", "::1"},
		{"ff0e::1", "127.0.0.1"},
	} {
		_, err := ListenMulticast(netip.AddrPortFrom(netip.MustParseAddr(c.group), 0), netip.MustParseAddr(c.iface), Options{})
		if !errors.Is(err, ErrAddress) {
			t.Errorf("group %s on %s: %v", c.group, c.iface, err)
		}
	}
}
