package devstats

import (
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/testaddr"
	"github.com/rxego/rxego/transport"
)

// TestNames checks the names tools and the conformance suite rely on, and
// that a fresh engine counts nothing.
func TestNames(t *testing.T) {
	var c rxego.Stats
	c.SentPkts = 3
	c.RcvdRNRErr = 2
	c.Drops[rxego.DropNoRecvWQE] = 1
	m := Engine(c)
	for name, want := range map[string]uint64{"sent_pkts": 3, "rcvd_rnr_err": 2, "drop_no_recv_wqe": 1, "rcvd_pkts": 0} {
		if got, ok := m[name]; !ok || got != want {
			t.Errorf("%s = %d (present %v), want %d", name, got, ok, want)
		}
	}
	if len(m) != 28+len(rxego.DropReasons()) {
		t.Errorf("%d engine counters, want %d", len(m), 28+len(rxego.DropReasons()))
	}
	var s transport.Stats
	s.SentPackets, s.Drops[transport.DropBadICRC] = 7, 4
	tm := Transport(s)
	if tm["udp_sent_packets"] != 7 || tm["udp_drop_bad_icrc"] != 4 {
		t.Errorf("transport counters: %v", tm)
	}
	for k := range tm {
		if !strings.HasPrefix(k, "udp_") {
			t.Errorf("transport counter %q lacks the udp_ prefix", k)
		}
	}
}

// TestMapAndSettle counts a WRITE between two devices and checks that
// Settle sees them go quiet.
func TestMapAndSettle(t *testing.T) {
	a, b := testaddr.Open(t, nil), testaddr.Open(t, nil)
	if !Settle(a, 20*time.Millisecond, time.Second) {
		t.Fatal("an idle device did not settle")
	}
	if m := Map(a); m["sent_pkts"] != 0 || m["udp_sent_packets"] != 0 {
		t.Fatalf("fresh device counted traffic: %v", m)
	}
	qa, mrb := connectPair(t, a, b)
	src := make([]byte, 3000)
	mra, err := qa.pd.RegMR(src, rxego.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	wr := rxego.SendWR{ID: 1, Opcode: rxego.WRWrite, Flags: rxego.SendSignaled, RemoteAddr: mrb.IOVA(), RKey: mrb.RKey(),
		SGL: []rxego.SGE{{Addr: mra.IOVA(), Length: uint32(len(src)), LKey: mra.LKey()}}}
	if err := qa.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	wcs := make([]rxego.WC, 1)
	deadline := time.Now().Add(5 * time.Second)
	for n, _ := qa.cq.Poll(wcs); n == 0; n, _ = qa.cq.Poll(wcs) {
		if time.Now().After(deadline) {
			t.Fatal("no completion")
		}
		time.Sleep(time.Millisecond)
	}
	if wcs[0].Status != 0 {
		t.Fatalf("status %v", wcs[0].Status)
	}
	if !Settle(a, 50*time.Millisecond, 2*time.Second) {
		t.Fatal("device did not settle after the WRITE")
	}
	ma, mb := Map(a), Map(b)
	// 3000 bytes at MTU 1024: 3 request packets one way, 1 ACK back.
	if ma["sent_pkts"] != 3 || ma["udp_sent_packets"] != 3 || mb["rcvd_pkts"] != 3 || ma["rdma_sends"] != 1 || mb["rdma_recvs"] != 1 {
		t.Errorf("requester %v\nresponder %v", ma, mb)
	}
	if ma["udp_recv_packets"] != mb["udp_sent_packets"] || mb["udp_sent_packets"] == 0 {
		t.Errorf("ACKs: requester received %d, responder sent %d", ma["udp_recv_packets"], mb["udp_sent_packets"])
	}
}

type side struct {
	pd *rxego.PD
	cq *rxego.CQ
	qp *rxego.QP
}

// connectPair connects an RC QP on a to one on b and returns a's side and
// a remotely writable 4 KiB MR on b.
func connectPair(t *testing.T, a, b *rxego.Device) (side, *rxego.MR) {
	t.Helper()
	mk := func(d *rxego.Device) side {
		pd, err := d.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		cq, err := d.CreateCQ(8)
		if err != nil {
			t.Fatal(err)
		}
		q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq, RecvCQ: cq,
			Caps: rxego.Caps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return side{pd, cq, q}
	}
	sa, sb := mk(a), mk(b)
	buf := make([]byte, 4096)
	mrb, err := sb.pd.RegMR(buf, rxego.AccessLocalWrite|rxego.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := sa.qp.Connect(rxego.RemoteQP{Addr: b.Addr(), QPN: sb.qp.Num(), PSN: 200}, &rxego.ConnectOptions{LocalPSN: 100}); err != nil {
		t.Fatal(err)
	}
	if err := sb.qp.Connect(rxego.RemoteQP{Addr: a.Addr(), QPN: sa.qp.Num(), PSN: 100}, &rxego.ConnectOptions{LocalPSN: 200}); err != nil {
		t.Fatal(err)
	}
	return sa, mrb
}
