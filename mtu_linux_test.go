package rxego_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/netns"
	"github.com/rxego/rxego/qp"
)

// vethPair makes two network namespaces joined by a veth pair with MTU
// 1500: 198.18.0.1/24 in the first, 198.18.0.2/24 in the second, no route
// out. It returns the namespaces' names; they are deleted at cleanup.
func vethPair(t *testing.T) (a, b string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2")
	}
	id := fmt.Sprintf("%d", os.Getpid()%100000)
	a, b = "rxmtuA"+id, "rxmtuB"+id
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", a).Run()
		exec.Command("ip", "netns", "del", b).Run()
	})
	for _, args := range [][]string{
		{"netns", "add", a},
		{"netns", "add", b},
		{"-n", a, "link", "add", "mtua", "mtu", "1500", "type", "veth", "peer", "name", "mtub", "mtu", "1500", "netns", b},
		{"-n", a, "addr", "add", "198.18.0.1/24", "dev", "mtua"},
		{"-n", b, "addr", "add", "198.18.0.2/24", "dev", "mtub"},
		{"-n", a, "link", "set", "mtua", "up"},
		{"-n", b, "link", "set", "mtub", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	return a, b
}

// openIn opens a Device on addr inside namespace ns with one RC QP.
func openIn(t *testing.T, ns, addr string) *side {
	t.Helper()
	f, err := os.Open("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var dev *rxego.Device
	if err := netns.Do(f, func() error {
		var err error
		dev, err = rxego.Open(addr, nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(256)
	q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq, RecvCQ: cq, Caps: rxego.Caps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	m, err := pd.RegMR(buf, rxego.AccessLocalWrite|rxego.AccessRemoteWrite|rxego.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	return &side{dev, pd, cq, q, m, buf}
}

// TestLinkMTU: on a 1500-byte veth the port's active MTU is 1024, as rxe
// derives it; path MTU 4096 is refused at the modify to RTR and 1024
// carries a 64 KiB WRITE. When the link's MTU then drops under the QP
// (576: 1024-byte packets no longer fit), the kernel refuses each send
// (EMSGSIZE, for GSO runs too) and the work request completes with
// LOC_QP_OP_ERR, the QP goes to ERR and the device stops sending, where it
// used to retransmit for ever without a word to the application.
func TestLinkMTU(t *testing.T) {
	nsA, nsB := vethPair(t)
	a, b := openIn(t, nsA, "198.18.0.1"), openIn(t, nsB, "198.18.0.2")
	if m := a.dev.ActiveMTU(); m != qp.MTU1024 {
		t.Fatalf("active MTU %d bytes on a 1500-byte link, want 1024", m.Bytes())
	}
	err := a.qp.Connect(rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qp.Num(), PSN: 200}, &rxego.ConnectOptions{LocalPSN: 100, MTU: qp.MTU4096})
	if !errors.Is(err, qp.ErrInvalidModify) {
		t.Fatalf("path MTU 4096 on a 1500-byte link: %v, want ErrInvalidModify", err)
	}
	connectPair(t, a, b, &rxego.ConnectOptions{MTU: qp.MTU1024})
	for i := range a.buf {
		a.buf[i] = byte(i * 7)
	}
	write := func(id uint64, n int) {
		t.Helper()
		wr := rxego.SendWR{ID: id, Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
			SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: uint32(n), LKey: a.mr.LKey()}}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
	}
	write(1, len(a.buf))
	if wc := wait1(t, a.cq); wc.Status != qp.WCSuccess {
		t.Fatalf("64 KiB WRITE at MTU 1024: %+v", wc)
	}
	b.dev.Sync()
	if !bytes.Equal(a.buf, b.buf) {
		t.Fatal("WRITE data differs")
	}

	if out, err := exec.Command("ip", "-n", nsA, "link", "set", "mtua", "mtu", "576").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	errs := a.dev.Stats().SendErr
	start := time.Now()
	write(2, 8192) // eight 1024-byte packets: one GSO run
	write(3, 100)
	wc := wait1(t, a.cq)
	if wc.ID != 2 || wc.Status != qp.WCLocQPOpErr {
		t.Fatalf("WRITE over a link that cannot carry it: %+v, want LOC_QP_OP_ERR", wc)
	}
	if wc := wait1(t, a.cq); wc.ID != 3 || wc.Status != qp.WCWRFlushErr {
		t.Fatalf("WRITE behind it: %+v, want WR_FLUSH_ERR", wc)
	}
	took := time.Since(start)
	if s := a.qp.State(); s != qp.Err {
		t.Fatalf("QP state %v, want ERR", s)
	}
	if a.dev.Stats().SendErr == errs {
		t.Fatal("send_err did not count the refused send")
	}
	sent := a.dev.Transport().Stats().SentPackets
	time.Sleep(200 * time.Millisecond) // longer than two retransmission timeouts (timeout 14: 67 ms)
	if now := a.dev.Transport().Stats().SentPackets; now != sent {
		t.Fatalf("%d packets sent after the QP went to ERR", now-sent)
	}
	t.Logf("error completion %v after the post", took)
}

// TestLoopbackActiveMTU: loopback's MTU (65536) allows path MTU 4096.
func TestLoopbackActiveMTU(t *testing.T) {
	a := open(t, rxego.RC, 64)
	if m := a.dev.ActiveMTU(); m != qp.MTU4096 {
		t.Fatalf("active MTU on loopback %d bytes, want 4096", m.Bytes())
	}
}
