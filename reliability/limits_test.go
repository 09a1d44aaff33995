package reliability_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/transport"
	"github.com/rxego/rxego/transport/impair"
)

// waitFor polls cond every millisecond until it holds or d passed.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestUnknownQPFloodIsFlat floods a live endpoint with requests for QPs it
// does not have: each must be dropped and counted without allocating, so
// the endpoint's memory stays flat however long the flood lasts.
func TestUnknownQPFloodIsFlat(t *testing.T) {
	n := 1_000_192 // a multiple of the 256-packet batch
	switch {
	case raceEnabled:
		n = 100_096
	case testing.Short():
		n = 200_192
	}
	addrA, addrB := nextLoopback()
	att := listen(t, addrA, transport.Options{})
	defer att.Close()
	v := newVictim(t, addrB, att.LocalAddr(), 4)
	known := map[uint32]bool{}
	for _, q := range v.qps {
		known[q.Num()] = true
	}
	// 256 distinct packets of every request kind, sent over and over.
	rng := rand.New(rand.NewPCG(3, 4))
	ops := []bth.Opcode{bth.RCSendOnly, bth.RCWriteOnly, bth.RCReadRequest, bth.RCCompareSwap, bth.UDSendOnly, bth.UCSendOnly, bth.RCAck}
	msgs := make([]transport.Message, 256)
	for i := range msgs {
		h := bth.Header{Opcode: ops[i%len(ops)], PKey: bth.DefaultPKey, PSN: bth.PSN(rng.Uint32() & bth.PSNMask)}
		for h.DestQP = rng.Uint32() & bth.PSNMask; known[h.DestQP]; h.DestQP = rng.Uint32() & bth.PSNMask {
		}
		h.RETH = bth.RETHFields{VA: rng.Uint64(), RKey: rng.Uint32(), DMALen: 64}
		var payload []byte
		if h.Opcode != bth.RCReadRequest && h.Opcode != bth.RCCompareSwap && h.Opcode != bth.RCAck {
			payload = make([]byte, 64)
		}
		buf := make([]byte, 256)
		k, err := h.Encode(buf, payload)
		if err != nil {
			t.Fatal(err)
		}
		msgs[i] = transport.Message{Buf: buf[:k], Peer: v.dev.Addr()}
	}
	// Stats returns a value: the spinning below must not allocate.
	drops := func() uint64 { return v.dev.Stats().Drops[rxego.DropUnknownQP] }
	flood := func(count int) {
		before := drops()
		for sent := 0; sent < count; sent += len(msgs) {
			if _, err := att.Send(msgs); err != nil {
				t.Fatal(err)
			}
			// Keep at most 8192 packets in flight, well within the victim's
			// socket buffer: a datagram the kernel dropped would never be
			// counted by the engine. Spinning, not sleeping, keeps the
			// waiting free of allocations.
			for spin := time.Now(); drops()-before+8192 < uint64(sent); runtime.Gosched() {
				if time.Since(spin) > 10*time.Second {
					t.Fatalf("victim stopped draining the flood at %d of %d", drops()-before, sent)
				}
			}
		}
		waitFor(t, 10*time.Second, "victim counting the flood", func() bool { return drops()-before == uint64(count) })
	}
	flood(64 * 256) // warm up: buffers, batch slices, lazily made state
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	flood(n)
	runtime.ReadMemStats(&m1)
	runtime.GC()
	var m2 runtime.MemStats
	runtime.ReadMemStats(&m2)
	allocs := m1.Mallocs - m0.Mallocs
	t.Logf("%d packets to unknown QPs: %d allocations in the whole process (%.5f per packet), %d bytes; live heap %d -> %d bytes; transport drops %v",
		n, allocs, float64(allocs)/float64(n), m1.TotalAlloc-m0.TotalAlloc, m0.HeapAlloc, m2.HeapAlloc, v.dev.Transport().Stats().Drops)
	// The test's own polling allocates a little (timers, goroutine
	// wake-ups); per packet it must be nothing.
	if allocs > uint64(n)/100 {
		t.Fatalf("%d allocations for %d dropped packets", allocs, n)
	}
	if m2.HeapAlloc > m0.HeapAlloc+8<<20 {
		t.Fatalf("live heap grew from %d to %d bytes", m0.HeapAlloc, m2.HeapAlloc)
	}
	for _, q := range v.qps {
		if q.State() != rxego.StateRTS {
			t.Fatalf("QP %d left RTS", q.Num())
		}
	}
}

// bigRead sets up a victim QP with a registered buffer of size bytes at
// MTU 256 and returns the READ request for all of it.
func bigRead(t *testing.T, size int) (*victim, transport.Conn, transport.Message, *rxego.MR) {
	t.Helper()
	addrA, addrB := nextLoopback()
	att := listen(t, addrA, transport.Options{})
	t.Cleanup(func() { att.Close() })
	v := newVictim(t, addrB, att.LocalAddr(), 1)
	if err := v.qps[0].Modify(&rxego.QPAttr{State: rxego.StateReset}, rxego.AttrState); err != nil {
		t.Fatal(err)
	}
	if err := v.qps[0].Connect(rxego.RemoteQP{Addr: att.LocalAddr(), QPN: 0x100, PSN: v.psn}, &rxego.ConnectOptions{MTU: rxego.MTU256}); err != nil {
		t.Fatal(err)
	}
	pd := v.qps[0].PD()
	big, err := pd.RegMR(make([]byte, size), rxego.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	h := bth.Header{Opcode: bth.RCReadRequest, PKey: bth.DefaultPKey, DestQP: v.qps[0].Num(), AckReq: true, PSN: bth.PSN(v.psn),
		RETH: bth.RETHFields{VA: big.IOVA(), RKey: big.RKey(), DMALen: uint32(size)}}
	buf := make([]byte, 64)
	k, err := h.Encode(buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	return v, att, transport.Message{Buf: buf[:k], Peer: v.dev.Addr()}, big
}

// TestLongReadSharesTheEngine sends one READ for 64 MiB at MTU 256:
// 262,144 response packets. The responder must send them a bounded number
// per engine turn, so the engine serves everything else in between: an
// observer taking the engine lock (Device.Sync) must get it many times
// while the responses are going out.
func TestLongReadSharesTheEngine(t *testing.T) {
	const size = 64 << 20
	v, att, req, _ := bigRead(t, size)
	const npk = size / 256
	sent := func() uint64 { return v.dev.Stats().SentPkts }
	base := sent()
	var during atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			v.dev.Sync()
			if s := sent() - base; s > 0 && s < npk {
				during.Add(1)
			}
			runtime.Gosched()
		}
	}()
	start := time.Now()
	if _, err := att.Send([]transport.Message{req}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "all READ responses sent", func() bool { return sent()-base >= npk })
	close(stop)
	wg.Wait()
	t.Logf("%d READ responses in %v; the engine was free %d times while sending them", npk, time.Since(start).Round(time.Millisecond), during.Load())
	if during.Load() < 10 {
		t.Fatalf("the engine was free only %d times during a %d-packet READ response", during.Load(), npk)
	}
}

// TestDuplicateReadsDoNotMultiply sends a READ for 4 MiB (16,384 responses)
// and 20 duplicates of it right behind: each duplicate restarts the one
// response stream, as rxe does, instead of adding a stream of its own, so
// the responder sends far fewer than 21 streams' worth.
func TestDuplicateReadsDoNotMultiply(t *testing.T) {
	const size = 4 << 20
	const npk = size / 256
	v, att, req, _ := bigRead(t, size)
	base := v.dev.Stats().SentPkts
	reqs := make([]transport.Message, 21)
	for i := range reqs {
		reqs[i] = req
	}
	if _, err := att.Send(reqs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the duplicates processed", func() bool { return v.dev.Stats().DuplicateRequest == 20 })
	// Let the stream finish: the count stops moving.
	for prev := uint64(0); ; time.Sleep(50 * time.Millisecond) {
		cur := v.dev.Stats().SentPkts
		if cur == prev {
			break
		}
		prev = cur
	}
	total := v.dev.Stats().SentPkts - base
	t.Logf("READ of %d packets and 20 duplicates: %d packets sent (%.2f streams)", npk, total, float64(total)/npk)
	// Duplicates that arrive while the stream goes out restart it: what was
	// sent before each restart is sent again, so back-to-back duplicates
	// cost about one more stream. One stream each would be 21.
	if total < npk || total > 5*npk {
		t.Fatalf("%d packets sent for a %d-packet READ and its duplicates", total, npk)
	}
}

// TestLongReadInPipeline posts READs long enough to be sent a burst per
// engine turn (1 MiB at MTU 1024: 1,024 responses) with WRITEs and SENDs
// right behind them, with and without loss: the requests the responder
// refuses while a READ response goes out must be resent and everything
// must complete, in order, with the right bytes.
func TestLongReadInPipeline(t *testing.T) {
	const big, small, rounds = 1 << 20, 4096, 8
	for _, loss := range []float64{0, 0.02} {
		t.Run(fmt.Sprintf("loss%.0f%%", loss*100), func(t *testing.T) {
			addrA, addrB := nextLoopback()
			imp := &impair.Config{Seed: 21, Loss: loss}
			ec := endConfig{size: rounds * (big + 2*small), depth: 64, window: 4096, impair: imp}
			ec.addr = addrA
			a := openEnd(t, ec)
			ec.addr = addrB
			b := openEnd(t, ec)
			connect(t, a, b, rxego.ConnectOptions{MTU: rxego.MTU1024, Timeout: 12, RetryCnt: 7, MaxRdAtomic: 16})
			pattern(a.buf, 1)
			pattern(b.buf, 2)
			want := append([]byte(nil), b.buf...)
			var wrs []rxego.SendWR
			for i := range rounds {
				base := i * (big + 2*small)
				// READ b's region into a; then WRITE and SEND a's next bytes to b.
				wrs = append(wrs,
					rxego.SendWR{Opcode: rxego.WRRead, SGL: a.sge(base, big), RemoteAddr: b.addr(base), RKey: b.mr.RKey()},
					rxego.SendWR{Opcode: rxego.WRWrite, SGL: a.sge(base+big, small), RemoteAddr: b.addr(base + big), RKey: b.mr.RKey()},
					rxego.SendWR{Opcode: rxego.WRSend, SGL: a.sge(base+big+small, small)})
				copy(want[base+big:base+big+2*small], a.buf[base+big:base+big+2*small])
				if err := b.qp.PostRecv(rxego.RecvWR{ID: uint64(i), SGL: b.sge(base+big+small, small)}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range wrs {
				wrs[i].ID, wrs[i].Flags = uint64(i), rxego.SendSignaled
			}
			a.dev.Sync()
			b.dev.Sync()
			if err := a.qp.PostSend(wrs...); err != nil {
				t.Fatal(err)
			}
			pollN(t, a.scq, len(wrs), 60*time.Second, func(i int, wc rxego.WC) {
				if wc.Status != rxego.WCSuccess || wc.ID != uint64(i) {
					t.Fatalf("completion %d: %+v (%v); a: %s; b: %s", i, wc, wc.Status, a.stats(), b.stats())
				}
			})
			pollN(t, b.rcq, rounds, 10*time.Second, func(i int, wc rxego.WC) {
				if wc.Status != rxego.WCSuccess || wc.ID != uint64(i) || wc.ByteLen != small {
					t.Fatalf("receive completion %d: %+v", i, wc)
				}
			})
			a.dev.Sync()
			b.dev.Sync()
			if !bytes.Equal(b.buf, want) {
				t.Fatalf("responder memory differs at byte %d", firstDiff(b.buf, want))
			}
			for i := range rounds {
				base := i * (big + 2*small)
				if !bytes.Equal(a.buf[base:base+big], b.buf[base:base+big]) {
					t.Fatalf("READ %d data differs", i)
				}
			}
			t.Logf("%d x (1 MiB READ, WRITE, SEND), loss %.0f%%: responder refused %d requests while busy; a: %s; b: %s",
				rounds, loss*100, b.dev.Stats().Drops[rxego.DropBusy], a.stats(), b.stats())
		})
	}
}
