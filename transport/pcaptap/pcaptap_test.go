package pcaptap_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/internal/testenv/testaddr"
	"github.com/rxego/rxego/transport"
	"github.com/rxego/rxego/transport/pcaptap"
)

// end is one side of a connected RC QP pair.
type end struct {
	dev *rxego.Device
	cq  *rxego.CQ
	qp  *rxego.QP
	mr  *rxego.MR
	buf []byte
}

func newEnd(t *testing.T, dev *rxego.Device) *end {
	t.Helper()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(16)
	q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq, RecvCQ: cq, Caps: rxego.Caps{MaxSendWR: 8, MaxRecvWR: 8}})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8192)
	m, err := pd.RegMR(buf, rxego.AccessLocalWrite|rxego.AccessRemoteWrite|rxego.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	return &end{dev, cq, q, m, buf}
}

func connect(t *testing.T, a, b *end) {
	t.Helper()
	if err := a.qp.Connect(rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qp.Num(), PSN: 500}, &rxego.ConnectOptions{LocalPSN: 100}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(rxego.RemoteQP{Addr: a.dev.Addr(), QPN: a.qp.Num(), PSN: 100}, &rxego.ConnectOptions{LocalPSN: 500}); err != nil {
		t.Fatal(err)
	}
}

// traffic runs a 3000-byte WRITE (three packets and an ACK) and a
// 2500-byte READ from a to b.
func traffic(t *testing.T, a, b *end) {
	t.Helper()
	for _, wr := range []rxego.SendWR{
		{ID: 1, Opcode: rxego.WRWrite, Flags: rxego.SendSignaled, SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: 3000, LKey: a.mr.LKey()}},
			RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()},
		{ID: 2, Opcode: rxego.WRRead, Flags: rxego.SendSignaled, SGL: []rxego.SGE{{Addr: a.mr.IOVA() + 4096, Length: 2500, LKey: a.mr.LKey()}},
			RemoteAddr: b.mr.IOVA() + 4096, RKey: b.mr.RKey()},
	} {
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		wc := make([]rxego.WC, 1)
		_, err := a.cq.PollWait(ctx, wc)
		cancel()
		if err != nil || wc[0].Status != 0 {
			t.Fatalf("WR %d: %v %v", wr.ID, err, wc[0].Status)
		}
	}
}

func readAll(t *testing.T, path string) []trace.Record {
	t.Helper()
	var recs []trace.Record
	if err := trace.ReadFile(path, func(r trace.Record) error { recs = append(recs, r); return nil }); err != nil {
		t.Fatal(err)
	}
	return recs
}

// TestDeviceCapture records one device's traffic over loopback sockets
// and checks that every frame reads back with a matching ICRC (so the
// rebuilt IP and UDP headers are the ones the ICRC was computed over),
// in the right direction, with as many packets as the transport counted.
func TestDeviceCapture(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.pcapng")
	w, err := pcaptap.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	a := newEnd(t, testaddr.Open(t, &rxego.Options{Tap: w, SourcePorts: rxego.DefaultSourcePorts}))
	b := newEnd(t, testaddr.Open(t, nil))
	connect(t, a, b)
	traffic(t, a, b)
	a.dev.SetTap(nil)
	st := a.dev.Transport().Stats()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, path)
	if len(recs) != int(st.SentPackets+st.RecvPackets) || w.Packets() != len(recs) {
		t.Fatalf("%d frames read, writer wrote %d, transport sent %d and received %d", len(recs), w.Packets(), st.SentPackets, st.RecvPackets)
	}
	la, lb := a.dev.Addr(), b.dev.Addr()
	out := 0
	for _, r := range recs {
		if r.RoCE == nil || !r.ICRCOK {
			t.Errorf("frame %d does not check: %s", r.Frame, r.String())
			continue
		}
		// a sends from one of its source ports (rxego.Options.SourcePorts),
		// the one b's QP hashes to, and receives on its own port.
		fromA := r.Src == la.Addr() && r.Dst == lb.Addr() && r.SrcPort >= transport.SourcePortBase &&
			r.DstPort == lb.Port() && r.DestQP == b.qp.Num()
		fromB := r.Src == lb.Addr() && r.Dst == la.Addr() && r.DstPort == la.Port() && r.DestQP == a.qp.Num()
		if !fromA && !fromB || r.IPID == nil {
			t.Errorf("frame %d: addresses or QPN wrong: %s", r.Frame, r.String())
		}
		if fromA {
			out++
		}
	}
	if out != int(st.SentPackets) {
		t.Errorf("%d frames from a, it sent %d", out, st.SentPackets)
	}
	// WRITE First/Middle/Last, READ request out; ACK, READ response
	// First/Middle/Last in.
	if st.SentPackets != 4 || st.RecvPackets != 4 {
		t.Errorf("sent %d received %d packets, want 4 and 4", st.SentPackets, st.RecvPackets)
	}
}

// TestIPv6 records an IPv6 pair on an in-memory network and checks the
// UDP checksum (computed, as the kernel does over IPv6) and the ICRC.
func TestIPv6(t *testing.T) {
	pn := transport.NewPipeNetwork()
	var devs []*rxego.Device
	path := filepath.Join(t.TempDir(), "v6.pcapng")
	w, err := pcaptap.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, addr := range []string{"[fd00::1]:4791", "[fd00::2]:4791"} {
		c, err := pn.Listen(netip.MustParseAddrPort(addr), transport.Options{})
		if err != nil {
			t.Fatal(err)
		}
		o := &rxego.Options{Conn: c}
		if i == 0 {
			o.Tap = w
		}
		d, err := rxego.Open(addr, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		devs = append(devs, d)
	}
	a, b := newEnd(t, devs[0]), newEnd(t, devs[1])
	connect(t, a, b)
	traffic(t, a, b)
	a.dev.SetTap(nil)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, path)
	if len(recs) != 8 {
		t.Fatalf("%d frames, want 8", len(recs))
	}
	for _, r := range recs {
		if r.RoCE == nil || !r.ICRCOK || r.IPID != nil || !r.Src.Is6() {
			t.Errorf("frame %d: %s", r.Frame, r.String())
		}
	}
	checkUDP6(t, path)
	tsharkClean(t, path, 8)
}

// tsharkClean checks with tshark, when installed, that a capture has n
// frames, all decoded as InfiniBand with good IP and UDP checksums and
// neither malformed nor flagged by the expert system.
func tsharkClean(t *testing.T, path string, n int) {
	t.Helper()
	if _, err := exec.LookPath("tshark"); err != nil {
		t.Log("tshark not installed: not checked with it")
		return
	}
	out, err := exec.Command("tshark", "-n", "-r", path, "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
		"-T", "fields", "-E", "separator=|", "-e", "infiniband.bth.opcode", "-e", "udp.checksum.status",
		"-e", "_ws.malformed", "-e", "_ws.expert").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for _, l := range lines {
		f := strings.Split(l, "|")
		// udp.checksum.status 1 is "Good"; an IPv6 frame must not have 0.
		if len(f) != 4 || f[0] == "" || f[1] != "1" || f[2] != "" || f[3] != "" {
			t.Errorf("tshark: %q", l)
		}
	}
	if len(lines) != n {
		t.Errorf("tshark read %d frames, want %d", len(lines), n)
	}
}

// checkUDP6 verifies the UDP checksum of every IPv6 frame of a capture.
func checkUDP6(t *testing.T, path string) {
	t.Helper()
	n := 0
	err := eachFrame(path, func(data []byte) {
		p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
		ip, _ := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
		udp, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if ip == nil || udp == nil {
			t.Errorf("frame without IPv6/UDP: %v", p)
			return
		}
		var s uint32
		add := func(b []byte) {
			for i := 0; i+1 < len(b); i += 2 {
				s += uint32(binary.BigEndian.Uint16(b[i:]))
			}
			if len(b)%2 == 1 {
				s += uint32(b[len(b)-1]) << 8
			}
		}
		add(ip.SrcIP)
		add(ip.DstIP)
		s += uint32(ip.Length) + 17
		add(ip.Payload)
		for s > 0xffff {
			s = s&0xffff + s>>16
		}
		if s != 0xffff || udp.Checksum == 0 || ip.HopLimit != pcaptap.TTL {
			t.Errorf("UDP checksum %#04x does not verify (sum %#x), hop limit %d", udp.Checksum, s, ip.HopLimit)
		}
		n++
	})
	if err != nil || n == 0 {
		t.Fatalf("%d frames: %v", n, err)
	}
}

// TestIPv4Headers checks the rebuilt IPv4 header field by field.
func TestIPv4Headers(t *testing.T) {
	pkt := make([]byte, 16) // a BTH and an ICRC; contents do not matter here
	src, dst := netip.MustParseAddrPort("127.1.2.3:4791"), netip.MustParseAddrPort("127.4.5.6:49152")
	frame, ok := pcaptap.AppendFrame(nil, src, dst, 0x1a, 0xbeef, pkt)
	if !ok {
		t.Fatal("not built")
	}
	p := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	eth := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	udp := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
	if eth.SrcMAC.String() != "02:00:7f:01:02:03" || eth.DstMAC.String() != "02:00:7f:04:05:06" {
		t.Errorf("MACs %v %v", eth.SrcMAC, eth.DstMAC)
	}
	if ip.TOS != 0x1a || ip.Id != 0xbeef || ip.Flags != layers.IPv4DontFragment || ip.TTL != 64 || ip.Length != 20+8+16 ||
		ip.SrcIP.String() != "127.1.2.3" || ip.DstIP.String() != "127.4.5.6" {
		t.Errorf("IPv4 header %+v", ip)
	}
	var s uint32
	for i := 0; i < 20; i += 2 {
		s += uint32(binary.BigEndian.Uint16(frame[14+i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	if s != 0xffff {
		t.Errorf("IPv4 header checksum does not verify: %#x", s)
	}
	if udp.SrcPort != 4791 || udp.DstPort != 49152 || udp.Length != 24 || udp.Checksum != 0 || !bytes.Equal(udp.Payload, pkt) {
		t.Errorf("UDP %+v", udp)
	}
	if _, ok := pcaptap.AppendFrame(nil, src, netip.MustParseAddrPort("[::1]:4791"), 0, 0, pkt); ok {
		t.Error("mixed families accepted")
	}
	if _, ok := pcaptap.AppendFrame(nil, src, dst, 0, 0, make([]byte, 70000)); ok {
		t.Error("oversized packet accepted")
	}
}

// TestDropAndEmpty checks that dropped packets are written (their ICRC
// shows bad) and that a Writer closed without packets leaves a valid,
// empty capture; a second Close fails.
func TestDropAndEmpty(t *testing.T) {
	dir := t.TempDir()
	empty, err := pcaptap.Create(filepath.Join(dir, "empty.pcapng"))
	if err != nil {
		t.Fatal(err)
	}
	if err := empty.Close(); err != nil {
		t.Fatal(err)
	}
	if err := empty.Close(); err == nil {
		t.Error("second Close succeeded")
	}
	if recs := readAll(t, filepath.Join(dir, "empty.pcapng")); len(recs) != 0 {
		t.Errorf("%d records in an empty capture", len(recs))
	}
	var buf bytes.Buffer
	w := pcaptap.New(&buf)
	pkt := []byte{0x04, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1, 1, 2, 3, 4} // RC SEND ONLY, wrong ICRC
	local, remote := netip.MustParseAddrPort("127.0.0.9:4791"), netip.MustParseAddrPort("127.0.0.8:4791")
	w.Drop(transport.DropBadICRC, time.Unix(1, 0), local, remote, 0, pkt)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var recs []trace.Record
	if err := trace.Read(&buf, func(r trace.Record) error { recs = append(recs, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].RoCE == nil || recs[0].ICRCOK || recs[0].Src != remote.Addr() {
		t.Fatalf("records %+v", recs)
	}
	w.Packet(transport.Out, time.Now(), local, remote, 0, 0, pkt) // after Close: ignored, no panic
}

// TestConcurrent taps from several goroutines at once (run with -race)
// and checks every frame arrives whole.
func TestConcurrent(t *testing.T) {
	var buf bytes.Buffer
	w := pcaptap.New(&buf)
	local, remote := netip.MustParseAddrPort("127.0.0.9:4791"), netip.MustParseAddrPort("127.0.0.8:4791")
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pkt := make([]byte, 16+g*100)
			pkt[0] = 0x04
			for i := 0; i < 250; i++ {
				w.Packet(transport.Dir(g%2), time.Now(), local, remote, 0, uint16(i), pkt)
			}
		}()
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := trace.Read(&buf, func(r trace.Record) error { n++; return nil }); err != nil || n != 1000 || w.Packets() != 1000 {
		t.Fatalf("read %d frames (%v), writer counted %d", n, err, w.Packets())
	}
}

// eachFrame calls fn with every frame of a pcapng file.
func eachFrame(path string, fn func([]byte)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		return err
	}
	for i := 0; i < 1_000_000; i++ {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		fn(data)
	}
	return errors.New("too many frames")
}
