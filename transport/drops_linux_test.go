package transport

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/rxego/rxego/icrc"
	"github.com/rxego/rxego/internal/inetsum"
	"golang.org/x/sys/unix"
)

// injector writes hand-made IPv4 datagrams (IP_HDRINCL) from src:sport:
// what no socket would send, to see how a Conn drops each.
type injector struct {
	t      *testing.T
	fd     int
	src    netip.AddrPort
	nextID uint16
}

func newInjector(t *testing.T, src netip.AddrPort) *injector {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return &injector{t: t, fd: fd, src: src, nextID: 0x100}
}

// datagram is one RoCE packet's IPv4 datagram: a fresh packet with PSN
// psn and an ICRC right for its ID and DF bit; udpCsum picks the UDP
// checksum: 0 none, 1 right, 2 wrong.
func (j *injector) datagram(dst netip.AddrPort, psn uint32, df bool, udpCsum int) (ip []byte, id uint16) {
	j.nextID++
	id = j.nextID
	// Longer than CHECKSUM_BREAK (76 bytes): the kernel checks shorter
	// datagrams' UDP checksums before any socket lookup and drops a bad
	// one unseen by the socket (counted in InCsumErrors only).
	pkt := rocePacket(256, psn)
	v := icrc.V4{Src: j.src.Addr().As4(), Dst: dst.Addr().As4(), SrcPort: j.src.Port(), DstPort: dst.Port(), DF: df}
	v.Fill(id, pkt)
	ip = make([]byte, 20+8+len(pkt))
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	binary.BigEndian.PutUint16(ip[4:], id)
	if df {
		ip[6] = 0x40
	}
	copy(ip[12:], v.Src[:])
	copy(ip[16:], v.Dst[:])
	u := ip[20:]
	binary.BigEndian.PutUint16(u[0:], j.src.Port())
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(pkt)))
	copy(u[8:], pkt)
	if udpCsum > 0 {
		c := inetsum.UDP(ip[12:20], u)
		if udpCsum == 2 {
			c ^= 0x0100
		}
		binary.BigEndian.PutUint16(u[6:], c)
	}
	return ip, id
}

func (j *injector) send(ip []byte) {
	dst := unix.SockaddrInet4{Addr: [4]byte(ip[16:20])}
	if err := unix.Sendto(j.fd, ip, 0, &dst); err != nil {
		j.t.Fatal(err)
	}
}

// sendFragments sends ip (DF clear) as two fragments, the first carrying
// 128 bytes of the UDP datagram.
func (j *injector) sendFragments(ip []byte) {
	first := append([]byte(nil), ip[:20+128]...)
	binary.BigEndian.PutUint16(first[2:], uint16(len(first)))
	first[6] = 0x20 // MF
	second := append(append([]byte(nil), ip[:20]...), ip[20+128:]...)
	binary.BigEndian.PutUint16(second[2:], uint16(len(second)))
	binary.BigEndian.PutUint16(second[6:], 128/8) // offset in 8-byte units
	j.send(first)
	j.send(second)
}

// loopbackNetns makes a network namespace with only its loopback up, for
// a test that needs the namespace's counters to itself; it is deleted at
// cleanup.
func loopbackNetns(t *testing.T) string {
	t.Helper()
	needCaps(t, capSysAdmin, capNetAdmin, capNetRaw)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2")
	}
	ns := fmt.Sprintf("rxtL%d%d", os.Getpid()%100000, netSeq.Add(1))
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	for _, args := range [][]string{{"netns", "add", ns}, {"-n", ns, "link", "set", "lo", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	return ns
}

// TestDropReasons injects, on loopback inside a namespace the test makes
// (so the namespace's UDP checksum counter is the test's alone), one
// datagram of each kind a RoCEv2 receiver must drop, between good ones,
// in socket and raw mode: a bad UDP checksum (the kernel drops it in
// socket mode and counts it in InCsumErrors; before, rxego counted it as
// an overflow), two packets without DF and a fragmented one (before, all
// bad_icrc in socket mode). Each must be counted under its own reason and
// nothing under another, except that socket mode, which cannot see DF,
// counts the first packet without DF as bad_icrc (see noDFWitness); the
// good ones, one with a real UDP checksum, arrive.
func TestDropReasons(t *testing.T) {
	ns := loopbackNetns(t)
	for _, mode := range []RecvMode{RecvSocket, RecvRaw} {
		var c Conn
		var j *injector
		in(t, ns, func() {
			c = listenAny(t, "127.0.0.2", Options{Mode: mode, NoGRO: true})
			j = newInjector(t, netip.MustParseAddrPort("127.0.0.9:5000"))
		})
		dst := c.LocalAddr()
		good := func(psn uint32, csum int) { ip, _ := j.datagram(dst, psn, true, csum); j.send(ip) }
		good(1, 0)
		good(2, 1)
		ip, _ := j.datagram(dst, 3, true, 2)
		j.send(ip)
		good(4, 0) // carries the socket's drop count (SO_RXQ_OVFL)
		ip, _ = j.datagram(dst, 5, false, 0)
		j.send(ip)
		ip, _ = j.datagram(dst, 5, false, 0)
		j.send(ip)
		ip, _ = j.datagram(dst, 6, false, 0)
		j.sendFragments(ip)
		good(7, 1)
		got := recvN(t, c, 4, 5*time.Second)
		var psns []uint32
		for _, m := range got {
			psns = append(psns, psnOf(m.Buf))
		}
		want := map[DropReason]uint64{DropBadUDPChecksum: 1, DropNoDF: 2, DropFragment: 1}
		if mode == RecvSocket {
			want[DropNoDF], want[DropBadICRC] = 1, 1
		}
		s := c.Stats()
		for r := DropReason(0); r < NumDropReasons; r++ {
			if s.Drops[r] != want[r] {
				t.Errorf("%v mode: %d %v drops, want %d (all: %v)", mode, s.Drops[r], r, want[r], s.Drops)
			}
		}
		if len(psns) != 4 || psns[0] != 1 || psns[1] != 2 || psns[2] != 4 || psns[3] != 7 {
			t.Errorf("%v mode: received PSNs %v, want [1 2 4 7]", mode, psns)
		}
	}
}
