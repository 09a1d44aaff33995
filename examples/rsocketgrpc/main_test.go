package main

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
)

// loopback is a random address of 127.0.0.0/8 outside 127.0.0.0/24.
func loopback() string {
	return netip.AddrFrom4([4]byte{127, byte(1 + rand.IntN(254)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))}).String()
}

// TestHealth runs the gRPC health service over rsocket and checks both
// answers.
func TestHealth(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out, loopback(), loopback()); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	want := "health of kv over rsocket: SERVING\nhealth of batch over rsocket: NOT_SERVING\n"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("output %q, want %q", out.String(), want)
	}
}
