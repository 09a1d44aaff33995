package reliability_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/transport"
	"github.com/rxego/rxego/transport/impair"
)

// shardedEnd is one side of a sharded test: a device of several shards
// whose QPs share one send CQ, one receive CQ, one SRQ and one MR.
type shardedEnd struct {
	dev      *rxego.Device
	scq, rcq *rxego.CQ
	srq      *rxego.SRQ
	qps      []*rxego.QP
	mr       *rxego.MR
	buf      []byte
}

// Layout of each side's buffer in the sharded tests.
const (
	shCounter = 0       // the FETCH_ADD counter (responder)
	shFetched = 4096    // FETCH_ADD results, one slot per operation (requester)
	shWrite   = 1 << 20 // per-QP WRITE regions of shWriteLen
	shRecv    = 2 << 20 // SRQ receive slots of shSendLen
	shSrc     = 3 << 20 // the requester's WRITE and SEND sources
	shBufLen  = 4 << 20

	shWriteLen = 1024
	shSendLen  = 64
)

// openSharded opens a device of shards shards with nqp RC QPs, over conn
// (nil: the device's own steered socket group on a fresh address).
func openSharded(t *testing.T, shards, nqp int, conn transport.Conn) *shardedEnd {
	t.Helper()
	o := &rxego.Options{Conn: conn, Shards: shards, Window: 128}
	var dev *rxego.Device
	var err error
	if conn != nil {
		dev, err = rxego.Open(conn.LocalAddr().String(), o)
	} else {
		for range 32 {
			a, _ := nextLoopback()
			if dev, err = rxego.Open(a.String(), o); !errors.Is(err, syscall.EADDRINUSE) {
				break
			}
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	e := &shardedEnd{dev: dev, buf: make([]byte, shBufLen)}
	pd, _ := dev.AllocPD()
	if e.scq, err = dev.CreateCQ(4 * nqp); err != nil {
		t.Fatal(err)
	}
	if e.rcq, err = dev.CreateCQ(4 * nqp); err != nil {
		t.Fatal(err)
	}
	if e.srq, err = pd.CreateSRQ(4*nqp, 1); err != nil {
		t.Fatal(err)
	}
	if e.mr, err = pd.RegMR(e.buf, allAccess); err != nil {
		t.Fatal(err)
	}
	for range nqp {
		q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: e.scq, RecvCQ: e.rcq, SRQ: e.srq,
			Caps: rxego.Caps{MaxSendWR: 8, MaxSendSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		e.qps = append(e.qps, q)
	}
	return e
}

// connectSharded connects a.qps[i] with b.qps[i].
func connectSharded(t *testing.T, a, b *shardedEnd) {
	t.Helper()
	o := rxego.ConnectOptions{MTU: rxego.MTU1024, Timeout: 8, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16}
	for i := range a.qps {
		o.LocalPSN = uint32(1000 * i)
		if err := a.qps[i].Connect(rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qps[i].Num(), PSN: uint32(5000 * i)}, &o); err != nil {
			t.Fatal(err)
		}
		o.LocalPSN = uint32(5000 * i)
		if err := b.qps[i].Connect(rxego.RemoteQP{Addr: a.dev.Addr(), QPN: a.qps[i].Num(), PSN: uint32(1000 * i)}, &o); err != nil {
			t.Fatal(err)
		}
	}
}

// runSharded runs rounds of, on every QP of a, a WRITE into its own
// region of b, a SEND into b's shared SRQ and a FETCH_ADD of 1 on b's one
// counter, and checks: every completion succeeds; the SENDs arrive
// through the one SRQ on QPs of every shard, each payload the one its QP
// sent that round; each QP's region holds its last WRITE; the counter
// ends at the number of FETCH_ADDs and their results are 0..n-1, each
// once (atomics exactly once across shards).
func runSharded(t *testing.T, a, b *shardedEnd, rounds int, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	nqp := len(a.qps)
	idx := map[uint32]int{} // b's QPN -> QP index
	for i, q := range b.qps {
		idx[q.Num()] = i
	}
	shards := map[int]bool{}
	wcs := make([]rxego.WC, 4*nqp)
	for r := range rounds {
		for i := range nqp {
			slot := uint64(shRecv + ((r%2)*nqp+i)*shSendLen)
			if err := b.srq.PostRecv(rxego.RecvWR{ID: slot, SGL: []rxego.SGE{{Addr: b.mr.IOVA() + slot, Length: shSendLen, LKey: b.mr.LKey()}}}); err != nil {
				t.Fatal(err)
			}
		}
		for i, q := range a.qps {
			src := uint64(shSrc + i*shWriteLen)
			for k := range shWriteLen / 8 {
				binary.LittleEndian.PutUint64(a.buf[src+uint64(8*k):], uint64(r)<<32|uint64(i)<<16|uint64(k))
			}
			op := uint64(r*nqp + i)
			wrs := []rxego.SendWR{
				{ID: 1, Opcode: rxego.WRWrite, Flags: rxego.SendSignaled, RemoteAddr: b.mr.IOVA() + uint64(shWrite+i*shWriteLen), RKey: b.mr.RKey(),
					SGL: []rxego.SGE{{Addr: a.mr.IOVA() + src, Length: shWriteLen, LKey: a.mr.LKey()}}},
				{ID: 2, Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
					SGL: []rxego.SGE{{Addr: a.mr.IOVA() + src, Length: shSendLen, LKey: a.mr.LKey()}}},
				{ID: 3, Opcode: rxego.WRFetchAdd, Flags: rxego.SendSignaled, RemoteAddr: b.mr.IOVA() + shCounter, RKey: b.mr.RKey(), CompareAdd: 1,
					SGL: []rxego.SGE{{Addr: a.mr.IOVA() + shFetched + 8*op, Length: 8, LKey: a.mr.LKey()}}},
			}
			if err := q.PostSend(wrs...); err != nil {
				t.Fatal(err)
			}
		}
		for got := 0; got < 3*nqp; {
			n, err := a.scq.PollWait(ctx, wcs)
			if err != nil {
				t.Fatalf("round %d: %d of %d send completions: %v; a: %d retransmits; b: %d duplicates", r, got, 3*nqp, err, a.dev.Stats().Retransmits, b.dev.Stats().DuplicateRequest)
			}
			for _, wc := range wcs[:n] {
				if wc.Status != rxego.WCSuccess {
					t.Fatalf("round %d: %+v", r, wc)
				}
			}
			got += n
		}
		for got := 0; got < nqp; {
			n, err := b.rcq.PollWait(ctx, wcs)
			if err != nil {
				t.Fatalf("round %d: %d of %d receive completions: %v", r, got, nqp, err)
			}
			for _, wc := range wcs[:n] {
				i, ok := idx[wc.QPN]
				if wc.Status != rxego.WCSuccess || !ok || wc.ByteLen != shSendLen {
					t.Fatalf("round %d: receive %+v", r, wc)
				}
				shards[transport.GroupMember(wc.QPN, b.dev.Shards())] = true
				b.dev.Sync()
				if v := binary.LittleEndian.Uint64(b.buf[wc.ID:]); v != uint64(r)<<32|uint64(i)<<16 {
					t.Fatalf("round %d: QP %d's SEND carried %#x", r, i, v)
				}
			}
			got += n
		}
	}
	b.dev.Sync()
	a.dev.Sync()
	for i := range nqp {
		want := uint64(rounds-1)<<32 | uint64(i)<<16 | 5
		if v := binary.LittleEndian.Uint64(b.buf[shWrite+i*shWriteLen+40:]); v != want {
			t.Errorf("QP %d's region holds %#x, want %#x", i, v, want)
		}
	}
	total := rounds * nqp
	if v := binary.LittleEndian.Uint64(b.buf[shCounter:]); v != uint64(total) {
		t.Errorf("counter %d after %d FETCH_ADDs", v, total)
	}
	got := make([]uint64, total)
	for k := range got {
		got[k] = binary.LittleEndian.Uint64(a.buf[shFetched+8*k:])
	}
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	for k, v := range got {
		if v != uint64(k) {
			t.Fatalf("FETCH_ADD results sorted: [%d] = %d: some ran twice or not at all", k, v)
		}
	}
	if len(shards) != min(b.dev.Shards(), nqp) {
		t.Errorf("SRQ served QPs of %d shards, want %d", len(shards), min(b.dev.Shards(), nqp))
	}
}

// TestShardsUnderFaults runs the sharded workload (8 QPs over 4 shards a
// side, one CQ pair, SRQ and MR per device) under loss, duplication and
// reordering of every packet each side receives.
func TestShardsUnderFaults(t *testing.T) {
	rounds := 200
	if testing.Short() {
		rounds = 50
	}
	for fi, f := range []fault{faults[1], faults[3], faults[4]} {
		t.Run(f.name, func(t *testing.T) {
			addrA, addrB := nextLoopback()
			ca, cb := f.cfg, f.cfg
			ca.Seed, cb.Seed = uint64(300+fi), uint64(400+fi)
			ia := impair.Wrap(listen(t, addrA, transport.Options{}), ca)
			ib := impair.Wrap(listen(t, addrB, transport.Options{}), cb)
			a, b := openSharded(t, 4, 8, ia), openSharded(t, 4, 8, ib)
			connectSharded(t, a, b)
			start := time.Now()
			runSharded(t, a, b, rounds, 120*time.Second)
			t.Logf("%d rounds of 8 QPs in %v; a received %+v; b %+v", rounds, time.Since(start).Round(time.Millisecond), ia.ImpairStats().Recv, ib.ImpairStats().Recv)
		})
	}
}

// TestShardsSteered runs the sharded workload between two devices on
// their own socket groups: the kernel steers every packet to its QP's
// shard.
func TestShardsSteered(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			a, b := openSharded(t, n, 8, nil), openSharded(t, n, 8, nil)
			connectSharded(t, a, b)
			runSharded(t, a, b, 100, 60*time.Second)
		})
	}
}
