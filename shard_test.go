package rxego

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
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

// TestDefaultShards: with Options.Shards 0 a device has one shard per
// CPU up to MaxShards, but one on two CPUs or fewer; Shards set is taken
// as it is.
func TestDefaultShards(t *testing.T) {
	for cpus, want := range map[int]int{1: 1, 2: 1, 3: 3, 4: 4, 16: 16, 64: MaxShards} {
		if got := defaultShards(cpus); got != want {
			t.Errorf("%d CPUs: %d shards, want %d", cpus, got, want)
		}
	}
	if got, want := openTest(t, nil).Shards(), defaultShards(runtime.NumCPU()); got != want {
		t.Errorf("Open with no options: %d shards on %d CPUs, want %d", got, runtime.NumCPU(), want)
	}
	if got := openTest(t, &Options{Shards: 3}).Shards(); got != 3 {
		t.Errorf("Shards 3: the device has %d", got)
	}
}

// TestSteering checks that on two devices of four shards each, with 8 QP
// pairs, every shard's engine takes in its QPs' packets and no packet
// reaches its shard through another shard's receive loop: the kernel's
// BPF program put each on its QP's socket.
func TestSteering(t *testing.T) {
	const shards, nqp, size = 4, 8, 64 << 10
	devs, qps, mrs, cqs, _ := shardedPair(t, [2]*Options{{Shards: shards}, {Shards: shards}}, nqp, size)
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
		waitSuccesses(ctx, t, cqs[0], wcs)
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

// shardedPair opens two devices with opts and connects nqp RC QP pairs
// between them at MTU 4096, each pair on size bytes of its own in both
// sides' MR (an MR of nqp*size bytes per device, its bytes in bufs; one
// CQ per device).
func shardedPair(t *testing.T, opts [2]*Options, nqp, size int) (devs [2]*Device, qps [2][]*QP, mrs [2]*MR, cqs [2]*CQ, bufs [2][]byte) {
	t.Helper()
	devs = [2]*Device{openTest(t, opts[0]), openTest(t, opts[1])}
	for s, d := range devs {
		pd, _ := d.AllocPD()
		cqs[s], _ = d.CreateCQ(4 * nqp)
		bufs[s] = make([]byte, nqp*size)
		mrs[s], _ = pd.RegMR(bufs[s], AccessLocalWrite|AccessRemoteWrite)
		for range nqp {
			q, err := pd.CreateQP(QPInitAttr{Type: RC, SendCQ: cqs[s], RecvCQ: cqs[s], Caps: Caps{MaxSendWR: 4, MaxRecvWR: 4}})
			if err != nil {
				t.Fatal(err)
			}
			qps[s] = append(qps[s], q)
		}
	}
	for i := range nqp {
		// A 4.3 s ACK timeout: a loaded test machine's stall must not
		// pass for a loss (TestMixedShardsKeepOrder counts resends).
		o := &ConnectOptions{MTU: qp.MTU4096, Timeout: 20}
		if err := qps[0][i].Connect(RemoteQP{Addr: devs[1].Addr(), QPN: qps[1][i].Num()}, o); err != nil {
			t.Fatal(err)
		}
		if err := qps[1][i].Connect(RemoteQP{Addr: devs[0].Addr(), QPN: qps[0][i].Num()}, o); err != nil {
			t.Fatal(err)
		}
	}
	return devs, qps, mrs, cqs, bufs
}

// TestBatchSendsOnShardSenders checks the parallel send of Device.Batch:
// one goroutine posts a 64 KiB WRITE on each of 8 QPs over 4 shards in
// one batch; every shard but the last builds and sends its packets on its
// own sender goroutine, Batch returns only once all of them are on the
// wire (the sockets' counters say so at once), and every byte arrives.
func TestBatchSendsOnShardSenders(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4)) // parallel sending needs 4
	const shards, nqp, size = 4, 8, 64 << 10
	devs, qps, mrs, cqs, bufs := shardedPair(t, [2]*Options{{Shards: shards}, {Shards: shards}}, nqp, size)
	src, dst := bufs[0], bufs[1]
	for i := range src {
		src[i] = byte(i*7 + i>>12)
	}
	before := devs[0].Transport().Stats().SentPackets
	var err error
	devs[0].Batch(func() {
		for i, q := range qps[0] {
			off := uint64(i * size)
			if e := q.PostSend(SendWR{ID: uint64(i), Opcode: WRWrite, Flags: SendSignaled, RemoteAddr: mrs[1].IOVA() + off, RKey: mrs[1].RKey(),
				SGL: []SGE{{Addr: mrs[0].IOVA() + off, Length: size, LKey: mrs[0].LKey()}}}); e != nil && err == nil {
				err = e
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// 16 packets per WRITE at MTU 4096; a slow start (16 PSNs) sends at
	// least that much of each before any ACK.
	if sent := devs[0].Transport().Stats().SentPackets - before; sent < nqp*size/4096 {
		t.Errorf("%d packets on the wire when Batch returned, want %d", sent, nqp*size/4096)
	}
	runs := 0
	for i := range shards {
		runs += int(devs[0].dev.SenderRuns(i))
	}
	if runs != shards-1 {
		t.Errorf("shard senders ran %d batches, want %d (every shard with posts but the last)", runs, shards-1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waitSuccesses(ctx, t, cqs[0], make([]WC, nqp))
	devs[1].Sync()
	if !bytes.Equal(src, dst) {
		t.Error("the WRITEs' bytes differ at the target")
	}
}

// TestMixedShardsKeepOrder sends 64 KiB SENDs on 8 QPs at once between
// a device of one shard and one of four, each way. The sender's batch
// holds every QP's packets back to back; were another QP's packets
// merged into a QP's GSO datagram (same peer, port and length), the
// receiver's BPF steering would hand the whole datagram to the first
// packet's shard, those packets would reach their QP out of order with
// the ones that came the right way, and go-back-N would send windows
// again. The receiver's ACKs for many QPs may share a datagram (a late
// ACK is stale). So: every byte arrives, nothing is dropped out of
// sequence and nothing is resent.
func TestMixedShardsKeepOrder(t *testing.T) {
	for _, c := range []struct {
		name           string
		sender, target int
	}{{"1 to 4", 1, 4}, {"4 to 1", 4, 1}} {
		t.Run(c.name, func(t *testing.T) {
			const nqp, size = 8, 64 << 10
			devs, qps, mrs, cqs, bufs := shardedPair(t, [2]*Options{{Shards: c.sender}, {Shards: c.target}}, nqp, size)
			src, dst := bufs[0], bufs[1]
			for i := range src {
				src[i] = byte(i*13 + i>>12)
			}
			for round := range 4 {
				for i, q := range qps[1] {
					off := uint64(i * size)
					if err := q.PostRecv(RecvWR{ID: uint64(i), SGL: []SGE{{Addr: mrs[1].IOVA() + off, Length: size, LKey: mrs[1].LKey()}}}); err != nil {
						t.Fatal(err)
					}
				}
				var err error
				devs[0].Batch(func() {
					for i, q := range qps[0] {
						off := uint64(i * size)
						if e := q.PostSend(SendWR{ID: uint64(i), Opcode: WRSend, Flags: SendSignaled,
							SGL: []SGE{{Addr: mrs[0].IOVA() + off, Length: size, LKey: mrs[0].LKey()}}}); e != nil && err == nil {
							err = e
						}
					}
				})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				waitSuccesses(ctx, t, cqs[0], make([]WC, nqp))
				waitSuccesses(ctx, t, cqs[1], make([]WC, nqp))
				cancel()
				if !bytes.Equal(src, dst) {
					t.Fatalf("round %d: the SENDs' bytes differ at the receiver", round)
				}
				clear(dst)
			}
			if n := devs[1].Stats().Drops[DropOutOfSequence]; n != 0 {
				t.Errorf("the receiver dropped %d packets out of sequence", n)
			}
			if n := devs[0].Stats().Retransmits; n != 0 {
				t.Errorf("the sender resent %d packets", n)
			}
		})
	}
}

// TestQPsTakeShardsInTurn checks how a device numbers its QPs: the
// shards take turns, and a shard's QPs take consecutive numbers of its
// blocks, so one peer's packets to several of them may share a GSO
// datagram and still be steered to their shard.
func TestQPsTakeShardsInTurn(t *testing.T) {
	d := openTest(t, &Options{Shards: 3})
	pd, _ := d.AllocPD()
	cq, _ := d.CreateCQ(16)
	var nums []uint32
	for range 9 {
		q, err := pd.CreateQP(QPInitAttr{Type: RC, SendCQ: cq, RecvCQ: cq, Caps: Caps{MaxSendWR: 1, MaxRecvWR: 1}})
		if err != nil {
			t.Fatal(err)
		}
		nums = append(nums, q.Num())
	}
	first := d.dev.ShardOf(nums[0])
	for i, n := range nums {
		if s := d.dev.ShardOf(n); s != (first+i)%3 {
			t.Errorf("QP %d (number %d) is on shard %d, want %d", i, n, s, (first+i)%3)
		}
		if i >= 3 && (n != nums[i-3]+1 || n/transport.QPNBlock != nums[i-3]/transport.QPNBlock) {
			t.Errorf("QP %d has number %d, want %d, the next of its shard's block", i, n, nums[i-3]+1)
		}
	}
}

// waitSuccesses waits for len(wcs) completions on cq, each a success.
func waitSuccesses(ctx context.Context, t *testing.T, cq *CQ, wcs []WC) {
	t.Helper()
	for got := 0; got < len(wcs); {
		n, err := cq.PollWait(ctx, wcs[got:])
		if err != nil {
			t.Fatal(err)
		}
		for _, wc := range wcs[got : got+n] {
			if wc.Status != qp.WCSuccess {
				t.Fatalf("%+v", wc)
			}
		}
		got += n
	}
}
