package rxego_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/netns"
	"github.com/rxego/rxego/qp"
)

// TestMcastDestroyBusy: destroying a UD QP attached to multicast groups
// fails with ErrBusy, naming how many, and changes nothing: the QP still
// receives the group's datagram whole. After it detaches from both, the
// destroy succeeds, and a destroyed QP cannot attach. A device closes
// cleanly with a QP still attached.
func TestMcastDestroyBusy(t *testing.T) {
	ns := mcastNet(t)
	g1, g2 := netip.MustParseAddr("::ffff:239.1.2.4"), netip.MustParseAddr("::ffff:239.1.2.5")
	var a, b, c *side
	err := netns.Do(ns, func() error {
		devs := make([]*rxego.Device, 3)
		for i := range devs {
			d, err := rxego.Open(fmt.Sprintf("198.18.0.%d", i+1), nil)
			if err != nil {
				return err
			}
			t.Cleanup(func() { d.Close() })
			devs[i] = d
		}
		a, b, c = sideOn(t, devs[0], rxego.UD, 8192), sideOn(t, devs[1], rxego.UD, 8192), sideOn(t, devs[2], rxego.UD, 8192)
		for _, s := range []*side{a, b, c} {
			if err := s.qp.ActivateUD(0x3333, 0); err != nil {
				return err
			}
		}
		for _, g := range []netip.Addr{g1, g2} {
			if err := b.qp.AttachMcast(g); err != nil {
				return err
			}
		}
		return c.qp.AttachMcast(g1)
	})
	if err != nil {
		t.Fatal(err)
	}

	err = b.qp.Destroy()
	if !errors.Is(err, rxego.ErrBusy) || !strings.Contains(err.Error(), "attached to 2 multicast group") {
		t.Fatalf("Destroy of a QP attached to two groups: %v; want ErrBusy naming 2 groups", err)
	}

	// Nothing changed: b still receives what is sent to g1.
	mcRecv(t, b, 2)
	ah, err := a.pd.CreateAH(netip.AddrPortFrom(g1, 0))
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("still attached")
	copy(a.buf[4096:], msg)
	if err := a.qp.PostSend(rxego.SendWR{ID: 7, Opcode: rxego.WRSend, Flags: rxego.SendSignaled, AH: ah,
		RemoteQPN: rxego.MulticastQPN, RemoteQKey: 0x3333,
		SGL: []rxego.SGE{{Addr: a.mr.IOVA() + 4096, Length: uint32(len(msg)), LKey: a.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, a.cq); wc.Status != qp.WCSuccess {
		t.Fatalf("send completion %+v", wc)
	}
	wc := wait1(t, b.cq)
	if wc.Status != qp.WCSuccess || wc.ByteLen != uint32(40+len(msg)) || wc.QPN != b.qp.Num() {
		t.Fatalf("b's completion after the refused destroy: %+v", wc)
	}
	b.dev.Sync()
	if off := int(wc.ID)*1024 + 40; !bytes.Equal(b.buf[off:off+len(msg)], msg) {
		t.Errorf("b received %q, want %q", b.buf[off:off+len(msg)], msg)
	}

	if err := b.qp.DetachMcast(g1); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Destroy(); !errors.Is(err, rxego.ErrBusy) || !strings.Contains(err.Error(), "attached to 1 multicast group") {
		t.Fatalf("Destroy of a QP attached to one group: %v; want ErrBusy naming 1 group", err)
	}
	if err := b.qp.DetachMcast(g2); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Destroy(); err != nil {
		t.Fatalf("Destroy after detaching: %v", err)
	}
	if err := netns.Do(ns, func() error { return b.qp.AttachMcast(g1) }); !errors.Is(err, rxego.ErrClosed) {
		t.Errorf("attach of a destroyed QP: %v; want ErrClosed", err)
	}
	// b's CQ is free again: its QP is gone.
	if err := b.cq.Close(); err != nil {
		t.Errorf("CQ.Close after the QP's destroy: %v", err)
	}

	// c is still attached to g1: its device closes all the same.
	if err := c.dev.Close(); err != nil {
		t.Fatalf("Close of a device with an attached QP: %v", err)
	}
	if err := c.qp.Destroy(); !errors.Is(err, rxego.ErrClosed) {
		t.Errorf("Destroy after the device closed: %v; want ErrClosed", err)
	}
}
