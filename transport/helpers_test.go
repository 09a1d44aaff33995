package transport

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"
)

// rocePacket returns an RC SEND Only packet of n bytes (n >= 16, a
// multiple of 4) for QP 0x11 with PSN psn, a payload derived from psn and a
// zero ICRC placeholder.
func rocePacket(n int, psn uint32) []byte {
	b := make([]byte, n)
	b[0] = 0x04 // RC SEND Only
	binary.BigEndian.PutUint16(b[2:], 0xffff)
	b[7] = 0x11
	b[9], b[10], b[11] = byte(psn>>16), byte(psn>>8), byte(psn)
	for i := 12; i < n-4; i++ {
		b[i] = byte(int(psn) + i)
	}
	return b
}

// psnOf reads the PSN of a packet built by rocePacket.
func psnOf(b []byte) uint32 { return uint32(b[9])<<16 | uint32(b[10])<<8 | uint32(b[11]) }

// samePayload reports whether got carries the headers and payload of want
// (everything but the ICRC, which the sender filled in).
func samePayload(got, want []byte) bool {
	if len(got) != len(want) {
		return false
	}
	for i := 0; i < len(want)-4; i++ {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// listenAny opens a Conn on addr at a random free high port.
func listenAny(t testing.TB, addr string, opts Options) Conn {
	t.Helper()
	c, err := listenFree(addr, opts)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// listenFree calls Listen on random ports of addr until one is not in use,
// and returns what that call returned.
func listenFree(addr string, opts Options) (Conn, error) {
	a := netip.MustParseAddr(addr)
	var err error
	for range 50 {
		var c Conn
		port := uint16(20000 + rand.IntN(40000))
		if c, err = Listen(netip.AddrPortFrom(a, port), opts); !errors.Is(err, syscall.EADDRINUSE) {
			return c, err
		}
	}
	return nil, err
}

// recvN receives until n packets have arrived or the deadline passes, and
// returns copies of them.
func recvN(t testing.TB, c Conn, n int, timeout time.Duration) []Message {
	t.Helper()
	type result struct {
		msgs []Message
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var got []Message
		buf := make([]Message, 64)
		for len(got) < n {
			k, err := c.Recv(buf)
			if err != nil {
				done <- result{got, err}
				return
			}
			for _, m := range buf[:k] {
				m.Buf = append([]byte(nil), m.Buf...)
				m.Pkt.Raw = m.Buf // Pkt is a view of Buf
				got = append(got, m)
			}
		}
		done <- result{got, nil}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("recv after %d of %d packets: %v", len(r.msgs), n, r.err)
		}
		return r.msgs
	case <-time.After(timeout):
		// Unblock the goroutine; the test fails anyway.
		c.Close()
		r := <-done
		t.Fatalf("received %d of %d packets in %v (stats %+v)", len(r.msgs), n, timeout, c.Stats())
		return nil
	}
}

// tapRec records what a Tap sees.
type tapRec struct {
	mu    sync.Mutex
	pkts  []tapPkt
	drops []tapDrop
}

type tapPkt struct {
	dir    Dir
	local  netip.AddrPort
	remote netip.AddrPort
	tos    uint8
	id     uint16
	pkt    []byte
}

type tapDrop struct {
	reason DropReason
	remote netip.AddrPort
	pkt    []byte
}

func (r *tapRec) Packet(dir Dir, at time.Time, local, remote netip.AddrPort, tos uint8, ipID uint16, pkt []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pkts = append(r.pkts, tapPkt{dir, local, remote, tos, ipID, append([]byte(nil), pkt...)})
}

func (r *tapRec) Drop(reason DropReason, at time.Time, local, remote netip.AddrPort, tos uint8, pkt []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drops = append(r.drops, tapDrop{reason, remote, append([]byte(nil), pkt...)})
}

func (r *tapRec) snapshot() ([]tapPkt, []tapDrop) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]tapPkt(nil), r.pkts...), append([]tapDrop(nil), r.drops...)
}

func netipMustAP(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
