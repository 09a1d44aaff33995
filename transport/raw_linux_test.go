package transport

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego/icrc"
)

// TestRawMode receives through the raw socket: packets carry their real
// IP ID and are checked in full, a GSO run that reaches it whole over lo
// is split, and a packet whose ICRC was computed for a different ID than
// the one the kernel wrote is rejected (socket mode cannot tell).
func TestRawMode(t *testing.T) {
	needCaps(t, capNetRaw)
	b := listenAny(t, "127.0.0.2", Options{Mode: RecvRaw})
	sock := listenAny(t, "127.0.0.4", Options{NoGRO: true})
	a := listenAny(t, "127.0.0.1", Options{})
	if s := b.Stats(); s.Mode != RecvRaw || s.GRO {
		t.Fatalf("stats %+v", s)
	}
	var run []byte
	for i := range 5 {
		run = append(run, rocePacket(200, uint32(10+i))...)
	}
	var big []byte // longer than any one RoCE packet
	for i := range 4 {
		big = append(big, rocePacket(4096, uint32(20+i))...)
	}
	msgs := []Message{
		{Buf: rocePacket(100, 1), Peer: b.LocalAddr(), TOS: 0x03},
		{Buf: run, Peer: b.LocalAddr(), Seg: 200},
		{Buf: rocePacket(100, 2), Peer: b.LocalAddr()},
		{Buf: big, Peer: b.LocalAddr(), Seg: 4096},
	}
	if n, err := a.Send(msgs); n != 4 || err != nil {
		t.Fatal(n, err)
	}
	got := recvN(t, b, 11, 5*time.Second)
	wantID := map[uint32]uint16{1: 0, 10: 0, 11: 1, 12: 2, 13: 3, 14: 4, 2: 0, 20: 0, 21: 1, 22: 2, 23: 3}
	for _, m := range got {
		psn := psnOf(m.Buf)
		size := map[bool]int{true: 100, false: 200}[psn < 10]
		if psn >= 20 {
			size = 4096
		}
		if id, ok := wantID[psn]; !ok || m.IPID != id || m.Peer != a.LocalAddr() || len(m.Buf) != size {
			t.Errorf("PSN %d: id %d peer %v len %d", psn, m.IPID, m.Peer, len(m.Buf))
		}
		if psn == 1 && m.TOS != 0x03 {
			t.Errorf("TOS %#x", m.TOS)
		}
	}
	if s := b.Stats(); s.GROBatches != 2 || s.GROSegments != 9 || s.RecvPackets != 11 {
		t.Errorf("stats %+v", s)
	}

	// A plain socket in the default PMTU mode: the kernel picks the ID.
	u, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 3)})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	from := u.LocalAddr().(*net.UDPAddr).AddrPort()
	for _, c := range []Conn{b, sock} {
		v := icrc.V4{Src: from.Addr().As4(), Dst: c.LocalAddr().Addr().As4(), SrcPort: from.Port(), DstPort: c.LocalAddr().Port(), DF: true}
		p := rocePacket(64, 5)
		v.Fill(0, p)
		bad := rocePacket(64, 6)
		v.Fill(0, bad)
		bad[20] ^= 1
		for _, d := range [][]byte{p, bad} {
			if _, err := u.WriteToUDPAddrPort(d, c.LocalAddr()); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Socket mode recovers some ID and accepts the first; raw mode sees
	// the real, non-zero ID and rejects it. Both reject the corrupted one.
	// A last good packet from a marks the end.
	for _, c := range []Conn{b, sock} {
		if n, err := a.Send([]Message{{Buf: rocePacket(32, 7), Peer: c.LocalAddr()}}); n != 1 {
			t.Fatal(err)
		}
	}
	got = recvN(t, sock, 2, 5*time.Second)
	if psnOf(got[0].Buf) != 5 || psnOf(got[1].Buf) != 7 || sock.Stats().Drops[DropBadICRC] != 1 {
		t.Errorf("socket mode: stats %+v", sock.Stats())
	}
	got = recvN(t, b, 1, 5*time.Second)
	if s := b.Stats(); psnOf(got[0].Buf) != 7 || s.Drops[DropBadICRC] != 2 || s.RecvPackets != 12 {
		t.Errorf("raw mode: PSN %d stats %+v", psnOf(got[0].Buf), s)
	}
}

// TestUnprivileged checks what works without privileges: everything but
// raw mode, which fails with EPERM and says why. Run as root, it runs
// itself again under setpriv with the capabilities dropped.
func TestUnprivileged(t *testing.T) {
	if hasCap(capNetRaw) {
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Skip("needs setpriv to drop capabilities")
		}
		cmd := exec.Command(setpriv, "--bounding-set=-net_raw,-net_admin,-sys_admin", os.Args[0],
			"-test.run=^TestUnprivileged$", "-test.count=1", "-test.v")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestUnprivileged") {
			t.Fatalf("unprivileged run: %v\n%s", err, out)
		}
		return
	}
	// A random port: a fixed one may be taken by a test running in parallel.
	c, err := listenFree("127.0.0.1", Options{Mode: RecvRaw})
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, syscall.EPERM) || !strings.Contains(err.Error(), "CAP_NET_RAW") {
		t.Errorf("raw Listen unprivileged: %v", err)
	}
	// Buffer sizes fall back to SO_RCVBUF; GSO and GRO need no privilege.
	a := listenAny(t, "127.0.0.1", Options{})
	b := listenAny(t, "127.0.0.2", Options{})
	run := append(rocePacket(64, 1), rocePacket(64, 2)...)
	if n, err := a.Send([]Message{{Buf: run, Peer: b.LocalAddr(), Seg: 64}}); n != 1 {
		t.Fatal(err)
	}
	got := recvN(t, b, 2, 5*time.Second)
	if got[1].IPID != 1 || !a.Stats().GSO || !b.Stats().GRO {
		t.Errorf("unprivileged GSO/GRO: id %d stats %+v %+v", got[1].IPID, a.Stats(), b.Stats())
	}
}
