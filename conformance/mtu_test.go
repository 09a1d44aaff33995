package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/app/devstats"
)

// mtuMsgSize is the message size of the link-MTU case: two packets at
// path MTU 1024.
const mtuMsgSize = 2048

// TestLinkMTU checks the path MTU against the link, on the lab's
// 1500-byte bridge, with ibv_rc_pingpong -m 1024 in the guest:
//
//   - rxego's active MTU (Device.ActiveMTU, from the interface) equals
//     the active_mtu rxe derives from its 1500-byte netdev (ibv_devinfo);
//   - path MTU 4096 is refused at the modify to RTR (rxe would accept it
//     and lose every full-size packet at its sender);
//   - at 1024 one 2-packet message goes each way, intact;
//   - then a host route to the guest with MTU 576 makes the kernel refuse
//     rxego's next 2-packet message (EMSGSIZE): the send completes with
//     LOC_QP_OP_ERR and the QP goes to ERR at once, instead of counting
//     send_err and retransmitting for ever.
func TestLinkMTU(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		p.Case(t, Case{Name: "path mtu over the link", Role: "rxego client",
			Expect: []string{"send_err"}, Require: []string{"rxego:send_err"}},
			func(t *testing.T) Outcome { return p.linkMTU(t) })
	})
}

var activeMTURe = regexp.MustCompile(`active_mtu:\s*(\d+)`)

func (p *Peer) linkMTU(t *testing.T) Outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := p.Guest.Run(ctx, "ibv_devinfo", "-d", "rxe0", "-v")
	if err != nil {
		t.Fatal(err)
	}
	m := activeMTURe.FindSubmatch(res.Stdout)
	if m == nil {
		t.Fatalf("no active_mtu in ibv_devinfo:\n%s", res.Stdout)
	}
	rxeMTU, _ := strconv.Atoi(string(m[1]))

	var dev *rxego.Device
	if err := p.Lab.InNetns(func() error {
		var err error
		dev, err = rxego.Open(p.HostIP, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	if got := dev.ActiveMTU().Bytes(); got != rxeMTU {
		t.Fatalf("rxego's active MTU %d bytes, rxe's on the same link %d", got, rxeMTU)
	}
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(16)
	q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq, RecvCQ: cq,
		Caps: rxego.Caps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2*mtuMsgSize)
	mr, err := pd.RegMR(buf, rxego.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	sge := func(i int) []rxego.SGE {
		return []rxego.SGE{{Addr: mr.IOVA() + uint64(i*mtuMsgSize), Length: mtuMsgSize, LKey: mr.LKey()}}
	}
	pattern(buf[mtuMsgSize:], 1)

	const psn = 0x1234
	proc, conn, remote := p.pingpongServer(t, ctx, ppDest{qpn: q.Num(), psn: psn, gid: netip.MustParseAddr(p.HostIP)},
		"-m", "1024", "-s", strconv.Itoa(mtuMsgSize), "-n", "1")
	r := rxego.RemoteQP{Addr: netip.AddrPortFrom(netip.MustParseAddr(p.Guest.IP()), rxego.DefaultPort), QPN: remote.qpn, PSN: remote.psn}
	err = q.Connect(r, &rxego.ConnectOptions{LocalPSN: psn, MTU: rxego.MTU4096})
	if !errors.Is(err, rxego.ErrInvalidModify) {
		t.Fatalf("path MTU 4096 over a %d-byte active MTU: %v, want ErrInvalidModify", rxeMTU, err)
	}
	// The failed connect moved the QP back to RESET (rxego's rollback):
	// INIT again, where it can take the receive.
	if st := q.State(); st != rxego.StateReset {
		t.Fatalf("QP in %v after the refused connect, want RESET", st)
	}
	if err := q.Init(0); err != nil {
		t.Fatal(err)
	}
	if err := q.PostRecv(rxego.RecvWR{ID: 1, SGL: sge(0)}); err != nil {
		t.Fatal(err)
	}
	if err := q.Connect(r, &rxego.ConnectOptions{LocalPSN: psn, MTU: rxego.MTU1024}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("done\x00")); err != nil {
		t.Fatal(err)
	}
	send := func(id uint64) {
		t.Helper()
		if err := q.PostSend(rxego.SendWR{ID: id, Opcode: rxego.WRSend, Flags: rxego.SendSignaled, SGL: sge(1)}); err != nil {
			t.Fatal(err)
		}
	}
	wcs := make([]rxego.WC, 4)
	next := func() rxego.WC {
		t.Helper()
		n, err := cq.PollWait(ctx, wcs[:1])
		if err != nil || n != 1 {
			t.Fatalf("no completion: %v", err)
		}
		return wcs[0]
	}
	send(2)
	for range 2 {
		if wc := next(); wc.Status != rxego.WCSuccess {
			t.Fatalf("completion %+v", wc)
		}
	}
	if seq, ok := patternSeq(buf[:mtuMsgSize]); !ok || seq != 1 {
		t.Fatal("the echo is not our message")
	}
	if _, err := proc.Wait(ctx); err != nil {
		t.Fatal(err)
	}

	// The link to the guest now carries 576 bytes: 1024-byte packets
	// cannot leave.
	route := []string{"route", "add", p.Guest.IP() + "/32", "dev", "br0", "mtu", "lock", "576"}
	if out, err := p.Lab.Command("ip", route...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v\n%s", route, err, out)
	}
	defer p.Lab.Command("ip", "route", "del", p.Guest.IP()+"/32", "dev", "br0").Run()
	t0 := time.Now()
	send(3)
	wc := next()
	if wc.ID != 3 || wc.Status != rxego.WCLocQPOpErr {
		t.Fatalf("send over a 576-byte route: %+v, want LOC_QP_OP_ERR", wc)
	}
	took := time.Since(t0)
	if s := q.State(); s != rxego.StateErr {
		t.Fatalf("QP state %v, want ERR", s)
	}
	devstats.Settle(dev, 250*time.Millisecond, 5*time.Second)
	st := devstats.Map(dev)
	return Outcome{Note: fmt.Sprintf("active MTU %d both; 4096 refused; 2 x %d bytes at 1024; over a 576 route: LOC_QP_OP_ERR after %v",
		rxeMTU, mtuMsgSize, took.Round(time.Microsecond)), Rxego: st}
}
