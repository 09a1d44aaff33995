//go:build linux

package livecap_test

import (
	"context"
	"errors"
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
	c, err := livecap.Open("lo", 50*time.Millisecond)
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
