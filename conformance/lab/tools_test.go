package lab_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego/conformance/lab"
)

// TestLabTools checks the lab's own instruments with two guests of the
// oldest kernel: sockets opened through InNetns, a hand-made RoCEv2 packet
// from the host namespace, bridge captures, nftables loss rules, and that
// Close leaves nothing behind. The oldest, because its subtests share one
// pair of guests and run rxe-to-rxe traffic, and 6.12's rxe corrupts its
// heap now and then (conformance/README.md, "A guest that dies"): a death
// there would fail the lab's instruments for the referee's fault.
func TestLabTools(t *testing.T) {
	l := newLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, c := bootPair(t, l, lab.Kernels[0])

	t.Run("InNetnsUDP", func(t *testing.T) {
		pc, err := l.ListenPacket("udp4", lab.HostIP+":5000")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		if _, err := s.Run(ctx, "bash", "-c", "echo hello-from-guest >/dev/udp/"+lab.HostIP+"/5000"); err != nil {
			t.Fatal(err)
		}
		pc.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 100)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		if string(buf[:n]) != "hello-from-guest\n" || netip.MustParseAddrPort(from.String()).Addr().String() != s.IP() {
			t.Fatalf("got %q from %v", buf[:n], from)
		}
	})

	t.Run("HandMadeRoCEv2", func(t *testing.T) {
		// A UD SEND to QP1 (GSI) passes rxe's header checks whatever its
		// MAD says, so rcvd_pkts counts it iff its ICRC is right.
		dst := netip.MustParseAddr(s.IP())
		src := netip.MustParseAddr(lab.HostIP)
		before, err := s.HWCounters()
		if err != nil {
			t.Fatal(err)
		}
		bad := udToQP1(src, dst, 0x1234)
		bad[len(bad)-1] ^= 0xff
		good := udToQP1(src, dst, 0x1235)
		if err := l.InNetns(func() error { return sendRaw(dst, bad, good) }); err != nil {
			t.Fatal(err)
		}
		// Both went out in order, so once the good one is counted the bad
		// one has been handled too.
		var delta uint64
		for i := 0; i < 50 && delta == 0; i++ {
			time.Sleep(100 * time.Millisecond)
			after, err := s.HWCounters()
			if err != nil {
				t.Fatal(err)
			}
			delta = lab.CounterDelta(before, after)["rcvd_pkts"]
		}
		if delta != 1 {
			t.Fatalf("rxe counted %d packets, want 1 (the one with the right ICRC)", delta)
		}
	})

	t.Run("Capture", func(t *testing.T) {
		path := filepath.Join(l.RunDir(), "pingpong.pcap")
		capt, err := l.Capture(path)
		if err != nil {
			t.Fatal(err)
		}
		serverClient(t, ctx, s, c, 18515, "ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-n", "5")
		if err := capt.Stop(); err != nil {
			t.Fatal(err)
		}
		flows, err := roceFlows(path)
		if err != nil {
			t.Fatal(err)
		}
		// Frames forwarded between the guests are in the capture, both ways.
		if flows[s.IP()+">"+c.IP()] == 0 || flows[c.IP()+">"+s.IP()] == 0 {
			t.Fatalf("RoCEv2 frames per direction: %v", flows)
		}
	})

	t.Run("Loss", func(t *testing.T) {
		if err := l.SetLoss(c.IP(), s.IP(), 100); err != nil {
			t.Fatal(err)
		}
		before, err := s.HWCounters()
		if err != nil {
			t.Fatal(err)
		}
		p, err := s.Start("ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-n", "5")
		if err != nil {
			t.Fatal(err)
		}
		defer p.Kill()
		if err := s.WaitTCPListen(ctx, 18515); err != nil {
			t.Fatal(err)
		}
		// Every RoCE packet from the client is dropped: it retries forever
		// (retry_cnt 7) until the agent's timeout kills it.
		res, err := c.Exec(ctx, lab.Cmd{Argv: []string{"ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-n", "5", s.IP()},
			Timeout: 4 * time.Second})
		var ee *lab.ExitError
		if !errors.As(err, &ee) || !res.TimedOut {
			t.Fatalf("client under 100%% loss: %v (%+v)", err, res)
		}
		p.Kill()
		after, err := s.HWCounters()
		if err != nil {
			t.Fatal(err)
		}
		if d := lab.CounterDelta(before, after)["rcvd_pkts"]; d != 0 {
			t.Fatalf("server received %d RoCE packets through a 100%% loss rule", d)
		}
		rs, err := l.LossRuleset()
		if err != nil {
			t.Fatal(err)
		}
		if dropped(rs) == 0 {
			t.Fatalf("no drops counted:\n%s", rs)
		}
		if err := l.ClearLoss(); err != nil {
			t.Fatal(err)
		}
		if rs, _ := l.LossRuleset(); dropped(rs) != 0 || regexp.MustCompile(`table bridge`).MatchString(rs) {
			t.Fatalf("rules left after ClearLoss:\n%s", rs)
		}
		serverClient(t, ctx, s, c, 18515, "ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-n", "5")
	})

	t.Run("HostPeer", func(t *testing.T) {
		// The shape of an rxego interop test: a peer at HostIP inside the
		// namespace answers ibv_rc_pingpong's TCP exchange and receives
		// rxe's RoCEv2 packets on its own UDP socket.
		udp, err := l.ListenPacket("udp4", lab.HostIP+":4791")
		if err != nil {
			t.Fatal(err)
		}
		defer udp.Close()
		ln, err := l.Listen("tcp4", lab.HostIP+":18515")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		exch := make(chan error, 1)
		go func() { exch <- pingpongServerExchange(ln, 0x123) }()
		p, err := c.Start("ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-n", "1", lab.HostIP)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Kill()
		if err := <-exch; err != nil {
			t.Fatal(err)
		}
		udp.SetReadDeadline(time.Now().Add(30 * time.Second))
		buf := make([]byte, 2048)
		n, from, err := udp.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		// BTH: opcode 0x00 (RC SEND First: 4096 bytes at MTU 1024) or
		// 0x04 (SEND Only), P_Key 0xffff, destination QP 0x123.
		if n < 12+4 || (buf[0] != 0x00 && buf[0] != 0x04) ||
			binary.BigEndian.Uint16(buf[2:]) != 0xffff ||
			binary.BigEndian.Uint32(buf[4:])&0xffffff != 0x123 {
			t.Fatalf("from %v: % x", from, buf[:min(n, 32)])
		}
		if got := netip.MustParseAddrPort(from.String()).Addr().String(); got != c.IP() {
			t.Fatalf("RoCE packet from %s, want %s", got, c.IP())
		}
	})

	t.Run("Close", func(t *testing.T) {
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join("/run/netns", l.Name())); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s still there: %v", l.Name(), err)
		}
		for _, g := range []*lab.Guest{s, c} {
			if !g.Exited() {
				t.Errorf("guest %s still running", g.IP())
			}
		}
		if _, err := s.ReadFile("/proc/version"); err == nil {
			t.Error("agent still answers after Close")
		}
	})
}

// pingpongServerExchange plays ibv_rc_pingpong's server side of the TCP
// exchange: read the client's "LID:QPN:PSN:GID" record, answer with QP qpn
// at GID ::ffff:HostIP, read "done".
func pingpongServerExchange(ln net.Listener, qpn uint32) error {
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(60 * time.Second))
	conn, err := ln.Accept()
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	rec := make([]byte, 52) // "%04x:%06x:%06x:%s" with a 32-digit GID, NUL
	if _, err := io.ReadFull(conn, rec); err != nil {
		return fmt.Errorf("client record: %w", err)
	}
	h4 := netip.MustParseAddr(lab.HostIP).As4()
	gid := fmt.Sprintf("00000000000000000000ffff%02x%02x%02x%02x", h4[0], h4[1], h4[2], h4[3])
	reply := fmt.Sprintf("%04x:%06x:%06x:%s\x00", 0, qpn, 0, gid)
	if _, err := conn.Write([]byte(reply)); err != nil {
		return err
	}
	done := make([]byte, 5)
	if _, err := io.ReadFull(conn, done); err != nil || string(done) != "done\x00" {
		return fmt.Errorf("client done: %q %v", done, err)
	}
	return nil
}

// dropped sums the packet counters of an nft ruleset listing.
func dropped(ruleset string) int {
	n := 0
	for _, m := range regexp.MustCompile(`counter packets (\d+)`).FindAllStringSubmatch(ruleset, -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

// udToQP1 builds an IPv4 RoCEv2 UD SEND Only to QP1 carrying a 256-byte
// all-zero MAD, with IP ID id and a correct ICRC (CRC-32 over eight 0xFF
// bytes, the IP header with TOS, TTL and checksum all ones, the UDP header
// with checksum all ones, the BTH with byte 4 all ones, and the rest;
// appended little-endian).
func udToQP1(src, dst netip.Addr, id uint16) []byte {
	const ipLen, udpLen, bthLen, dethLen, madLen, icrcLen = 20, 8, 12, 8, 256, 4
	p := make([]byte, ipLen+udpLen+bthLen+dethLen+madLen+icrcLen)
	ip := p[:ipLen]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(len(p)))
	binary.BigEndian.PutUint16(ip[4:], id)
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	ip[8] = 64
	ip[9] = syscall.IPPROTO_UDP
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
	udp := p[ipLen : ipLen+udpLen]
	binary.BigEndian.PutUint16(udp[0:], 0xc001)
	binary.BigEndian.PutUint16(udp[2:], 4791)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(p)-ipLen))
	bth := p[ipLen+udpLen:]
	bth[0] = 0x64                               // UD SEND Only
	binary.BigEndian.PutUint16(bth[2:], 0xffff) // default P_Key
	bth[7] = 1                                  // destination QP 1
	deth := p[ipLen+udpLen+bthLen:]
	binary.BigEndian.PutUint32(deth[0:], 0x80010000) // GSI Q_Key
	deth[7] = 1                                      // source QP 1

	body := len(p) - icrcLen
	masked := make([]byte, 8+body)
	for i := range 8 {
		masked[i] = 0xff
	}
	copy(masked[8:], p[:body])
	m := masked[8:]
	m[1], m[8], m[10], m[11] = 0xff, 0xff, 0xff, 0xff // TOS, TTL, checksum
	m[ipLen+6], m[ipLen+7] = 0xff, 0xff               // UDP checksum
	m[ipLen+udpLen+4] = 0xff                          // BTH FECN/BECN/resv6
	binary.LittleEndian.PutUint32(p[body:], crc32.ChecksumIEEE(masked))
	return p
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// sendRaw sends complete IPv4 packets through a raw socket (IP_HDRINCL), so
// that the IP ID, which the ICRC covers, is the one given.
func sendRaw(dst netip.Addr, pkts ...[]byte) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	for _, p := range pkts {
		if err := syscall.Sendto(fd, p, 0, &syscall.SockaddrInet4{Addr: dst.As4()}); err != nil {
			return err
		}
	}
	return nil
}

// roceFlows counts IPv4 UDP/4791 frames per "src>dst" in a pcap file
// (Ethernet link type, as tcpdump writes on a bridge).
func roceFlows(path string) (map[string]int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(data) < 24 {
		return nil, fmt.Errorf("%s: %d bytes, no pcap header", path, len(data))
	}
	var bo binary.ByteOrder
	switch binary.LittleEndian.Uint32(data) {
	case 0xa1b2c3d4, 0xa1b23c4d:
		bo = binary.LittleEndian
	case 0xd4c3b2a1, 0x4d3cb2a1:
		bo = binary.BigEndian
	default:
		return nil, fmt.Errorf("%s: not a pcap file", path)
	}
	if lt := bo.Uint32(data[20:]); lt != 1 {
		return nil, fmt.Errorf("%s: link type %d, want Ethernet", path, lt)
	}
	flows := make(map[string]int)
	for off := 24; off+16 <= len(data); {
		n := int(bo.Uint32(data[off+8:]))
		off += 16
		if n < 0 || off+n > len(data) {
			return nil, fmt.Errorf("%s: truncated record", path)
		}
		f := data[off : off+n]
		off += n
		if len(f) < 14+20+8 || binary.BigEndian.Uint16(f[12:]) != 0x0800 {
			continue
		}
		ip := f[14:]
		ihl := int(ip[0]&0x0f) * 4
		if ip[9] != syscall.IPPROTO_UDP || len(ip) < ihl+8 || binary.BigEndian.Uint16(ip[ihl+2:]) != 4791 {
			continue
		}
		s, _ := netip.AddrFromSlice(ip[12:16])
		d, _ := netip.AddrFromSlice(ip[16:20])
		flows[s.String()+">"+d.String()]++
	}
	return flows, nil
}
