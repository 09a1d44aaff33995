package rsocket

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"
)

// TestIOWrite: the server maps a buffer, the client writes into it
// directly (riowrite), then says so on the stream; the server finds the
// bytes in place. Offsets outside the mapping and mappings beyond the
// peer's room fail with ErrNoMapping.
func TestIOWrite(t *testing.T) {
	p := newPair(t, nil)
	cli, srv := p.connect(t, nil, &Config{IOMapSize: 2})
	defer cli.Close()
	defer srv.Close()
	for _, c := range []*Conn{cli, srv} {
		c.SetDeadline(time.Now().Add(20 * time.Second))
	}
	buf := make([]byte, 300_000)
	off, err := srv.IOMap(buf, 4096)
	if err != nil || off != 4096 {
		t.Fatalf("IOMap: %d, %v", off, err)
	}
	if _, err := srv.IOMap(make([]byte, 10), -1); err != nil {
		t.Fatalf("second IOMap: %v", err)
	}
	if _, err := srv.IOMap(make([]byte, 10), 0); !errors.Is(err, ErrNoMapping) {
		t.Fatalf("third IOMap into a peer with room for 2: %v, want ErrNoMapping", err)
	}
	if _, err := srv.Write([]byte("mapped")); err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 6)
	if _, err := io.ReadFull(cli, msg); err != nil || string(msg) != "mapped" {
		t.Fatalf("client read %q, %v", msg, err)
	}
	data := pattern(11, 200_000)
	if n, err := cli.IOWrite(data, 4096+50_000); err != nil || n != len(data) {
		t.Fatalf("IOWrite: %d, %v", n, err)
	}
	if n, err := cli.IOWrite([]byte("x"), 4096+300_000); !errors.Is(err, ErrNoMapping) || n != 0 {
		t.Fatalf("IOWrite past the mapping: %d, %v; want ErrNoMapping", n, err)
	}
	if _, err := cli.Write([]byte("done")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(srv, msg[:4]); err != nil || string(msg[:4]) != "done" {
		t.Fatalf("server read %q, %v", msg[:4], err)
	}
	if !bytes.Equal(buf[50_000:250_000], data) || !bytes.Equal(buf[:50_000], make([]byte, 50_000)) {
		t.Fatal("the mapped buffer does not hold exactly the bytes written")
	}
	if err := srv.IOUnmap(buf); err != nil {
		t.Fatal(err)
	}
	if err := srv.IOUnmap(buf); err == nil {
		t.Fatal("second IOUnmap succeeded")
	}
}
