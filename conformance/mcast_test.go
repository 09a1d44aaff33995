package conformance

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/conformance/lab"
	"github.com/rxego/rxego/internal/devstats"
)

// mckeyQKey is rdma_cm's Q_Key for UDP port space QPs and multicast
// (RDMA_UDP_QKEY), which mckey's datagrams carry.
const mckeyQKey = 0x01234567

// mcastGroup is the IPv4 group p's multicast cases use, inside the lab:
// one per kernel (from the host address's last byte), since both kernels'
// cases share the bridge and run at once.
func (p *Peer) mcastGroup() string {
	a := netip.MustParseAddr(p.HostIP).As4()
	return fmt.Sprintf("239.1.2.%d", a[3])
}

// TestMulticastMckey runs mckey (rdmacm-utils) in the guest against an
// rxego UD QP attached with rxego.AttachMcast, on every kernel: as sender
// (rxe's datagrams to the group, QPN 0xFFFFFF, reach rxego's QP whole) and
// as receiver (rxego's datagrams to the group reach mckey, which joined
// with rdma_join_multicast). rxego joins with AttachMcast, not rdma_cm.
func TestMulticastMckey(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, rxeSends := range []bool{true, false} {
			role := "rxego receives"
			if !rxeSends {
				role = "rxego sends"
			}
			// rxego sends until mckey has what it wants: the last datagrams
			// may meet a receiver that is gone (Tail).
			p.Case(t, Case{Name: "mckey 239.1.2.x", Role: role, Tail: !rxeSends}, func(t *testing.T) Outcome { return p.mckey(t, rxeSends) })
		}
	})
}

func (p *Peer) mckey(t *testing.T, rxeSends bool) Outcome {
	const count, size = 10, 100
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Multicast leaves by a route: in the guest for rxe's sends, in the
	// lab namespace for rxego's.
	if res, err := p.Guest.Run(ctx, "ip", "route", "replace", "224.0.0.0/4", "dev", "eth0"); err != nil {
		t.Fatalf("guest route: %v %s", err, res.Stderr)
	}
	if out, err := p.Lab.Command("ip", "route", "replace", "224.0.0.0/4", "dev", p.Lab.Bridge()).CombinedOutput(); err != nil {
		t.Fatalf("lab route: %v %s", err, out)
	}
	group := p.mcastGroup()
	mgid := netip.MustParseAddr("::ffff:" + group)
	var dev *rxego.Device
	var q *rxego.QP
	var pd *rxego.PD
	var cq *rxego.CQ
	var mr *rxego.MR
	buf := make([]byte, count*2048)
	err := p.Lab.InNetns(func() (err error) {
		if dev, err = rxego.Open(p.HostIP, nil); err != nil {
			return err
		}
		if pd, err = dev.AllocPD(); err != nil {
			return err
		}
		if cq, err = dev.CreateCQ(64); err != nil {
			return err
		}
		if mr, err = pd.RegMR(buf, rxego.AccessLocalWrite); err != nil {
			return err
		}
		if q, err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.UD, SendCQ: cq, RecvCQ: cq,
			Caps: rxego.Caps{MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
			return err
		}
		if err = rxego.ActivateUD(q, mckeyQKey, 0); err != nil {
			return err
		}
		if rxeSends {
			return rxego.AttachMcast(q, mgid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	args := []string{"mckey", "-m", group, "-b", p.Guest.IP(), "-C", strconv.Itoa(count), "-S", strconv.Itoa(size)}
	if rxeSends {
		for i := range count {
			if err := q.PostRecv(rxego.RecvWR{ID: uint64(i), SGL: []rxego.SGE{{Addr: mr.IOVA() + uint64(i)*2048, Length: 2048, LKey: mr.LKey()}}}); err != nil {
				t.Fatal(err)
			}
		}
		// -o: a send-only join, so the guest does not join the IP group
		// and rxe does not take in its own datagrams.
		args = append(args, "-s", "-o")
	}
	proc, err := p.Guest.Start(args...)
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	fail := func(f string, a ...any) {
		t.Helper()
		p.logQPState(t)
		stdout, stderr, _ := proc.Output()
		t.Fatalf(f+"\nmckey stdout: %s\nmckey stderr: %s", append(a, stdout, stderr)...)
	}
	got := 0
	var res lab.Result
	if rxeSends {
		// Every datagram rxe put on the wire must arrive whole; Case
		// checks that against rxe's sent_pkts. rxe 6.12 completes all of
		// mckey's sends but puts only the first on the wire (its
		// hw_counters say sent_pkts=1), so the count is rxe's, not -C.
		if res, err = proc.Wait(ctx); err != nil {
			fail("mckey: %v", err)
		}
		devstats.Settle(dev, 250*time.Millisecond, 5*time.Second)
		wcs := make([]rxego.WC, count+1)
		for _, wc := range wcs[:cq.Poll(wcs)] {
			if wc.Status != rxego.WCSuccess || wc.ByteLen != 40+size || wc.Src.Addr() != netip.MustParseAddr(p.Guest.IP()) {
				fail("datagram %d: %+v", got, wc)
			}
			got++
		}
		if got == 0 || got > count {
			fail("%d datagrams arrived", got)
		}
	} else {
		// mckey's receiver joins, then posts its receives: send until it
		// has all it wants (it exits then), a datagram every 50 ms.
		ah, err := pd.CreateAH(netip.AddrPortFrom(mgid, 0))
		if err != nil {
			t.Fatal(err)
		}
		type end struct {
			res lab.Result
			err error
		}
		done := make(chan end, 1)
		go func() { r, err := proc.Wait(ctx); done <- end{r, err} }()
		wc := make([]rxego.WC, 1)
	send:
		for i := 0; i < 400; i++ {
			select {
			case e := <-done:
				if e.err != nil {
					fail("mckey: %v", e.err)
				}
				res = e.res
				break send
			case <-time.After(50 * time.Millisecond):
			}
			if err := q.PostSend(rxego.SendWR{ID: uint64(i), Opcode: rxego.WRSend, Flags: rxego.SendSignaled, AH: ah,
				RemoteQPN: rxego.MulticastQPN, RemoteQKey: mckeyQKey,
				SGL: []rxego.SGE{{Addr: mr.IOVA(), Length: size, LKey: mr.LKey()}}}); err != nil {
				t.Fatal(err)
			}
			if _, err := cq.PollWait(ctx, wc); err != nil || wc[0].Status != rxego.WCSuccess {
				t.Fatalf("send %d: %+v %v", i, wc[0], err)
			}
			got++
		}
	}
	if res.Stdout == nil {
		fail("mckey did not end after %d datagrams", got)
	}
	want := regexp.MustCompile(`test complete|receiving data transfers|initiating data transfers`)
	if !want.Match(res.Stdout) {
		fail("mckey output")
	}
	devstats.Settle(dev, 250*time.Millisecond, 5*time.Second)
	note := fmt.Sprintf("rxego received %d datagrams to %s (mckey -C %d)", got, group, count)
	if !rxeSends {
		note = fmt.Sprintf("mckey received %d; rxego sent %d to %s", count, got, group)
	}
	return Outcome{Note: note, Rxego: devstats.Map(dev)}
}
