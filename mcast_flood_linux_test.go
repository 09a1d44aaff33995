package rxego_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/netns"
	"github.com/rxego/rxego/qp"
)

// TestMcastNoRecvCounted (issue 24): UD multicast takes datagrams from any
// sender, so a flood (here 40 datagrams) uses up a member's receives (8
// posted) and the rest is lost. That loss is counted under its own drop
// reason, mcast_no_recv_wqe, and per group by McastNoRecvDrops, not under
// no_recv_wqe (before, it was counted there with unicast's, and nowhere
// by group).
func TestMcastNoRecvCounted(t *testing.T) {
	const sent, posted = 40, 8
	ns := mcastNet(t)
	mgid := netip.MustParseAddr("::ffff:239.1.2.6")
	var a, b *side
	err := netns.Do(ns, func() error {
		devs := make([]*rxego.Device, 2)
		for i := range devs {
			d, err := rxego.Open(fmt.Sprintf("198.18.0.%d", i+1), nil)
			if err != nil {
				return err
			}
			t.Cleanup(func() { d.Close() })
			devs[i] = d
		}
		a, b = sideOn(t, devs[0], rxego.UD, 8192), sideOn(t, devs[1], rxego.UD, 8192)
		for _, s := range []*side{a, b} {
			if err := s.qp.ActivateUD(0x3333, 0); err != nil {
				return err
			}
		}
		return b.qp.AttachMcast(mgid)
	})
	if err != nil {
		t.Fatal(err)
	}
	mcRecv(t, b, posted)
	ah, err := a.pd.CreateAH(netip.AddrPortFrom(mgid, 0))
	if err != nil {
		t.Fatal(err)
	}
	copy(a.buf[4096:], "flood")
	for i := range sent {
		if err := a.qp.PostSend(rxego.SendWR{ID: uint64(i), Opcode: rxego.WRSend, Flags: rxego.SendSignaled, AH: ah,
			RemoteQPN: rxego.MulticastQPN, RemoteQKey: 0x3333,
			SGL: []rxego.SGE{{Addr: a.mr.IOVA() + 4096, Length: 5, LKey: a.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		if wc := wait1(t, a.cq); wc.Status != qp.WCSuccess {
			t.Fatalf("send completion %+v", wc)
		}
	}
	for range posted {
		if wc := wait1(t, b.cq); wc.Status != qp.WCSuccess {
			t.Fatalf("receive completion %+v", wc)
		}
	}
	g := mgid.Unmap()
	deadline := time.Now().Add(5 * time.Second)
	for b.dev.McastNoRecvDrops()[g] < sent-posted && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	st := b.dev.Stats()
	if got := b.dev.McastNoRecvDrops()[g]; got != sent-posted {
		t.Errorf("group %v: %d datagrams counted as dropped for want of a receive, want %d", g, got, sent-posted)
	}
	if got := st.Drops[qp.DropMcastNoRecvWQE]; got != sent-posted {
		t.Errorf("%d mcast_no_recv_wqe drops, want %d", got, sent-posted)
	}
	if got := st.Drops[qp.DropNoRecvWQE]; got != 0 {
		t.Errorf("%d no_recv_wqe drops, want 0 (the loss is multicast's)", got)
	}
}
