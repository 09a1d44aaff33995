// Package testaddr hands tests their own loopback addresses, so that test
// binaries running in parallel (go test runs packages concurrently) never
// fight over UDP port 4791 on the same address.
package testaddr

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"syscall"
	"testing"

	"github.com/rxego/rxego"
)

// Loopback returns a random address in 127.0.0.0/8 outside 127.0.0.0/24,
// where people and other tools usually are.
func Loopback() netip.Addr {
	a := [4]byte{127, byte(1 + rand.IntN(254)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))}
	return netip.AddrFrom4(a)
}

// Open opens an rxego device on a free random loopback address, retrying
// when the address is taken, and closes it when the test ends.
func Open(tb testing.TB, opts *rxego.Options) *rxego.Device {
	tb.Helper()
	var last error
	for i := 0; i < 50; i++ {
		d, err := rxego.Open(Loopback().String(), opts)
		if err == nil {
			tb.Cleanup(func() { d.Close() })
			return d
		}
		last = err
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	tb.Fatalf("testaddr: no free loopback address: %v", last)
	return nil
}
