//go:build linux

package livecap_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cmd/rxego/internal/livecap"
	"github.com/rxego/rxego/icrc"
	"github.com/rxego/rxego/internal/capfile"
	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// TestGSOOnLoopback captures on lo while rxego sends 4 KiB WRITEs at a
// 1024-byte path MTU (one GSO datagram of four packets each), and checks
// that the kernel reports the datagrams' segment size, that the size
// inferred from the RoCE headers is the same, and that every segment
// SplitGSO cuts out carries a good ICRC: rxego computed each over the IP
// ID the kernel gives that segment.
func TestGSOOnLoopback(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("live capture needs root (CAP_NET_RAW)")
	}
	c, err := livecap.Open("lo", 50*time.Millisecond, livecap.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.KnowsGSO() {
		t.Log("kernel before 6.2: the segment size is inferred only")
	}
	a, b := testaddr.Open(t, nil), testaddr.Open(t, nil)
	var qps [2]*rxego.QP
	var mrs [2]*rxego.MR
	var cq *rxego.CQ
	for i, d := range []*rxego.Device{a, b} {
		pd, _ := d.AllocPD()
		ccq, _ := d.CreateCQ(16)
		if i == 0 {
			cq = ccq
		}
		qps[i], err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: ccq, RecvCQ: ccq, Caps: rxego.Caps{MaxSendWR: 8, MaxRecvWR: 8}})
		if err != nil {
			t.Fatal(err)
		}
		mrs[i], _ = pd.RegMR(make([]byte, 4096), rxego.AccessLocalWrite|rxego.AccessRemoteWrite)
	}
	devs := []*rxego.Device{a, b}
	for i := range 2 {
		o := 1 - i
		if err := qps[i].Connect(rxego.RemoteQP{Addr: devs[o].Addr(), QPN: qps[o].Num()}, &rxego.ConnectOptions{MTU: rxego.MTU1024}); err != nil {
			t.Fatal(err)
		}
	}
	host := a.Addr().Addr()
	link := c.LinkType()
	seen := 0
	for k := 0; k < 20 && seen < 3; k++ {
		err := qps[0].PostSend(rxego.SendWR{ID: uint64(k), Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
			SGL:        []rxego.SGE{{Addr: mrs[0].IOVA(), Length: 4096, LKey: mrs[0].LKey()}},
			RemoteAddr: mrs[1].IOVA(), RKey: mrs[1].RKey()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		wc := make([]rxego.WC, 1)
		if _, err := cq.PollWait(ctx, wc); err != nil || wc[0].Status != 0 {
			t.Fatalf("write %d: %v %+v", k, err, wc[0])
		}
		cancel()
		for {
			fr, err := c.Next()
			if errors.Is(err, livecap.ErrTimeout) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			f, ok := capfile.Split(link, fr.Data)
			if !ok || netipSrc(f.IP) != host {
				continue
			}
			inferred := capfile.InferGSOSize(link, fr.Data)
			if c.KnowsGSO() && fr.GSOSize != inferred {
				t.Errorf("%d-byte frame: kernel segment size %d, inferred %d", len(fr.Data), fr.GSOSize, inferred)
			}
			if inferred == 0 {
				if len(f.RoCE) > 1024+100 {
					t.Errorf("%d-byte RoCE datagram not split", len(f.RoCE))
				}
				continue
			}
			seen++
			// WRITE_FIRST (with its RETH) or WRITE_MIDDLE at MTU 1024.
			if inferred != 12+16+1024+icrc.Len && inferred != 12+1024+icrc.Len {
				t.Errorf("segment size %d for a WRITE at MTU 1024", inferred)
			}
			segs := capfile.SplitGSO(link, fr.Data, inferred)
			if len(segs) < 2 {
				t.Fatalf("%d segments", len(segs))
			}
			for i, d := range segs {
				s, ok := capfile.Split(link, d)
				crc, good := icrc.FromHeaders(s.IP, s.UDP, s.RoCE)
				if !ok || !good || crc != icrc.Get(s.RoCE) {
					t.Errorf("segment %d: ICRC does not check", i+1)
				}
				if id, base := uint16(s.IP[4])<<8|uint16(s.IP[5]), uint16(f.IP[4])<<8|uint16(f.IP[5]); id != base+uint16(i) {
					t.Errorf("segment %d: IP ID %d, datagram's %d", i+1, id, base)
				}
			}
		}
	}
	if seen < 3 {
		t.Fatalf("saw %d GSO datagrams of 4 KiB WRITEs, want 3", seen)
	}
}

// netipSrc returns an IPv4 header's source address.
func netipSrc(ip []byte) (a netip.Addr) {
	a, _ = netip.AddrFromSlice(ip[12:16])
	return a
}

// TestHostFilterAndDrops sends UDP datagrams to port 4791 on loopback
// from one address while three captures are open without reading: one
// for another host, whose kernel filter must keep every frame out; one
// for the sender with a buffer of a few frames, which must count drops;
// and one for the sender with the default buffer, which must see every
// datagram and drop none.
func TestHostFilterAndDrops(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("live capture needs root (CAP_NET_RAW)")
	}
	src, dst, other := testaddr.Loopback(), testaddr.Loopback(), testaddr.Loopback()
	open := func(o livecap.Options) *livecap.Capture {
		c, err := livecap.Open("lo", 10*time.Millisecond, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	elsewhere := open(livecap.Options{Host: other})
	small := open(livecap.Options{Host: src, Buffer: 1})
	whole := open(livecap.Options{Host: src})
	// Unconnected, so the ICMP errors of a port no one listens on do not
	// fail the next write.
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: src.AsSlice()})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const sent = 200
	payload := make([]byte, 1000)
	for range sent {
		if _, err := conn.WriteToUDP(payload, &net.UDPAddr{IP: dst.AsSlice(), Port: 4791}); err != nil {
			t.Fatal(err)
		}
	}
	stats := func(c *livecap.Capture) livecap.Stats {
		s, err := c.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := stats(elsewhere); s.Frames != 0 {
		t.Errorf("a capture for %v took in %d frames of %v's traffic", other, s.Frames, src)
	}
	if s := stats(small); s.Dropped == 0 || s.Frames < sent {
		t.Errorf("a capture with a minimal buffer: %+v, want %d frames or more, some dropped", s, sent)
	}
	s := stats(whole)
	if s.Dropped != 0 || s.Frames < sent {
		t.Errorf("a capture with the default buffer: %+v, want %d frames or more, none dropped", s, sent)
	}
	got := 0
	for {
		fr, err := whole.Next()
		if errors.Is(err, livecap.ErrTimeout) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if f, ok := capfile.Split(whole.LinkType(), fr.Data); ok && netipSrc(f.IP) == src && len(f.RoCE) == len(payload) {
			got++
		}
	}
	if got != sent {
		t.Errorf("read %d of the %d datagrams back", got, sent)
	}
}
