package rxego

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego/qp"
)

// openTest opens a device with opts on a free random loopback address.
func openTest(t *testing.T, opts *Options) *Device {
	t.Helper()
	for range 50 {
		a := netip.AddrFrom4([4]byte{127, byte(1 + rand.IntN(254)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
		d, err := Open(a.String(), opts)
		if err == nil {
			t.Cleanup(func() { d.Close() })
			return d
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatal(err)
		}
	}
	t.Fatal("no free loopback address")
	return nil
}

// TestSteering checks that on two devices of four shards each, with 8 QP
// pairs, every shard's engine takes in its QPs' packets and no packet
// reaches its shard through another shard's receive loop: the kernel's
// BPF program put each on its QP's socket.
func TestSteering(t *testing.T) {
	const shards, nqp, size = 4, 8, 64 << 10
	devs := [2]*Device{openTest(t, &Options{Shards: shards}), openTest(t, &Options{Shards: shards})}
	var qps [2][]*QP
	var mrs [2]*MR
	var cqs [2]*CQ
	for s, d := range devs {
		pd, _ := d.AllocPD()
		cqs[s], _ = d.CreateCQ(4 * nqp)
		mrs[s], _ = pd.RegMR(make([]byte, nqp*size), AccessLocalWrite|AccessRemoteWrite)
		for range nqp {
			q, err := pd.CreateQP(QPInitAttr{Type: RC, SendCQ: cqs[s], RecvCQ: cqs[s], Caps: Caps{MaxSendWR: 4, MaxRecvWR: 4}})
			if err != nil {
				t.Fatal(err)
			}
			qps[s] = append(qps[s], q)
		}
	}
	for i := range nqp {
		o := &ConnectOptions{MTU: qp.MTU4096}
		if err := qps[0][i].Connect(RemoteQP{Addr: devs[1].Addr(), QPN: qps[1][i].Num()}, o); err != nil {
			t.Fatal(err)
		}
		if err := qps[1][i].Connect(RemoteQP{Addr: devs[0].Addr(), QPN: qps[0][i].Num()}, o); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wcs := make([]WC, nqp)
	for range 4 {
		for i, q := range qps[0] {
			off := uint64(i * size)
			if err := q.PostSend(SendWR{Opcode: WRWrite, Flags: SendSignaled, RemoteAddr: mrs[1].IOVA() + off, RKey: mrs[1].RKey(),
				SGL: []SGE{{Addr: mrs[0].IOVA() + off, Length: size, LKey: mrs[0].LKey()}}}); err != nil {
				t.Fatal(err)
			}
		}
		for got := 0; got < nqp; {
			n, err := cqs[0].PollWait(ctx, wcs)
			if err != nil {
				t.Fatal(err)
			}
			for _, wc := range wcs[:n] {
				if wc.Status != qp.WCSuccess {
					t.Fatalf("%+v", wc)
				}
			}
			got += n
		}
	}
	for s, d := range devs {
		for i := range d.Shards() {
			if n := d.dev.ShardCounters(i).RcvdPkts.Load(); n == 0 {
				t.Errorf("device %d shard %d received nothing", s, i)
			}
			if n := d.dev.HandedOn(i); n != 0 {
				t.Errorf("device %d: %d packets reached shard %d's receive loop for another shard", s, n, i)
			}
		}
	}
}
