package transport

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
)

// TestInterfaceMTU: an address on loopback, assigned (127.0.0.1) or not
// (127.0.0.5, which the kernel routes there too), gets the loopback
// interface's MTU; an address no interface holds is an error.
func TestInterfaceMTU(t *testing.T) {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Skip(err)
	}
	lo := 0
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagLoopback != 0 {
			lo = ifi.MTU
			break
		}
	}
	if lo == 0 {
		t.Skip("no loopback interface")
	}
	for _, a := range []string{"127.0.0.1", "127.0.0.5", "::ffff:127.0.0.1"} {
		if got, err := InterfaceMTU(netip.MustParseAddr(a)); err != nil || got != lo {
			t.Errorf("InterfaceMTU(%s) = %d, %v; want the loopback MTU %d", a, got, err, lo)
		}
	}
	if got, err := InterfaceMTU(netip.MustParseAddr("192.0.2.77")); err == nil {
		t.Errorf("InterfaceMTU of an address no interface holds = %d, want an error", got)
	}
}

// TestUnsendable: only EMSGSIZE means a message can never leave.
func TestUnsendable(t *testing.T) {
	for err, want := range map[error]bool{
		syscall.EMSGSIZE: true, &net.OpError{Err: syscall.EMSGSIZE}: true,
		syscall.ENOBUFS: false, syscall.EHOSTUNREACH: false, errors.New("other"): false,
	} {
		if got := Unsendable(err); got != want {
			t.Errorf("Unsendable(%v) = %v, want %v", err, got, want)
		}
	}
}
