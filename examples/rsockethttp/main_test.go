package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// TestDemo runs the HTTPS server and client on two loopback addresses of
// their own and checks both answers.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	if err := demoOn(&out, testaddr.Loopback().String(), testaddr.Loopback().String()); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	if !strings.Contains(s, "GET /hello: 200 OK hello over rsocket, ") || !strings.Contains(s, "POST /sha256: 200 OK 1048576 bytes, sha256 ") {
		t.Fatalf("output:\n%s", s)
	}
}
