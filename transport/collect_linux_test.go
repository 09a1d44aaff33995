package transport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// liveReceivers returns how many Conns of the receivers set are still
// reachable.
func liveReceivers() int {
	receivers.mu.Lock()
	defer receivers.mu.Unlock()
	receivers.cs = receivers.prune()
	return len(receivers.cs)
}

// socketOf returns what /proc/self/fd says descriptor fd is ("socket:[N]"),
// or "" when it is not open.
func socketOf(fd int32) string {
	s, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return ""
	}
	return s
}

// TestUnclosedConnCollected: a Conn dropped without Close is collected,
// and its sockets closed, as an *os.File is; the receivers set, which
// holds every receiving Conn for kickParked, does not keep it reachable.
func TestUnclosedConnCollected(t *testing.T) {
	for _, ports := range []int{0, 2} {
		t.Run(fmt.Sprintf("source ports %d", ports), func(t *testing.T) {
			before := liveReceivers()
			waitClosed(t, before, openAndDrop(t, ports)...)
		})
	}
	t.Run("group", func(t *testing.T) {
		before := liveReceivers()
		waitClosed(t, before, openGroupAndDrop(t)...)
	})
}

// waitClosed waits, collecting garbage, until every socket is closed and
// the receivers set holds no more than the before Conns it held.
func waitClosed(t *testing.T, before int, sockets ...openedSocket) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		open := ""
		for _, s := range sockets {
			if socketOf(s.fd) == s.link {
				open += fmt.Sprintf(" %d (%s)", s.fd, s.link)
			}
		}
		live := liveReceivers()
		if open == "" && live <= before { // fewer: an earlier test's dropped Conn went too
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the Conns were dropped: still open:%s; %d receiving Conns (%d before)", open, live, before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// openedSocket is a descriptor and what /proc/self/fd said it was.
type openedSocket struct {
	fd   int32
	link string
}

// openAndDrop opens a Conn with the given source ports, moves a packet
// through it, and returns its reading socket and, with source ports, one
// of its sending sockets, leaving the Conn unreferenced and not closed.
func openAndDrop(t *testing.T, ports int) []openedSocket {
	t.Helper()
	c, err := listenFree("127.0.0.1", Options{SourcePorts: ports})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := c.Send([]Message{{Buf: rocePacket(64, 1), Peer: c.LocalAddr()}}); n != 1 {
		t.Fatalf("send: %d, %v", n, err)
	}
	if got := recvN(t, c, 1, 5*time.Second); len(got) != 1 {
		t.Fatalf("received %d packets, want 1", len(got))
	}
	switch x := c.(type) {
	case *udpConn:
		return []openedSocket{opened(t, x.rp.fd)}
	case *portsConn:
		return []openedSocket{opened(t, x.rp.fd), opened(t, x.pool[0].wp.fd)}
	}
	t.Fatalf("Listen returned a %T", c)
	return nil
}

// openGroupAndDrop opens a group of two Conns and returns their reading
// sockets, leaving the Conns unreferenced and not closed.
func openGroupAndDrop(t *testing.T) []openedSocket {
	t.Helper()
	var cs []Conn
	var err error
	for range 50 {
		at := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(20000+rand.IntN(40000)))
		if cs, err = ListenGroup(at, Options{}, 2); !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	var s []openedSocket
	for _, c := range cs {
		s = append(s, opened(t, c.(*udpConn).rp.fd))
	}
	return s
}

// opened returns fd with what /proc/self/fd says it is, which must be a
// socket.
func opened(t *testing.T, fd int32) openedSocket {
	t.Helper()
	s := openedSocket{fd: fd, link: socketOf(fd)}
	if !strings.HasPrefix(s.link, "socket:") {
		t.Fatalf("descriptor %d is %q, not a socket", fd, s.link)
	}
	return s
}
