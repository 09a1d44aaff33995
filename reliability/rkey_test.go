package reliability_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/reth"
	"github.com/rxego/rxego/transport"
)

// rkeyRequests is how many forged requests TestRKeyFlood sends.
func rkeyRequests() int {
	switch {
	case raceEnabled:
		return 100_000
	case testing.Short():
		return 200_000
	}
	return 1_000_000
}

// victim is a live endpoint holding registered memory: many RC QPs
// connected to the attacker's address, and MRs of every kind a forged
// request might name.
type victim struct {
	dev   *rxego.Device
	qps   []*rxego.QP
	psn   uint32
	mrs   []*rxego.MR // in the QPs' PD: full access, then local only
	other *rxego.MR   // full access, in another PD
	dead  *rxego.MR   // deregistered
	bufs  [][]byte    // every buffer above, to check that none changed
	orig  [][]byte
}

// forge is one class of forged request; build fills h for it.
type forge struct {
	name  string
	build func(v *victim, rng *rand.Rand, h *bth.Header)
}

// randomOp picks READ, WRITE, CMP_SWAP, FETCH_ADD or ATOMIC_WRITE and
// points it at va, rkey with length n (atomics: 8).
func randomOp(rng *rand.Rand, h *bth.Header, rkey uint32, va uint64, n uint32) {
	ops := []bth.Opcode{bth.RCReadRequest, bth.RCWriteOnly, bth.RCCompareSwap, bth.RCFetchAdd, bth.RCAtomicWrite}
	h.Opcode = ops[rng.IntN(len(ops))]
	switch h.Opcode {
	case bth.RCCompareSwap, bth.RCFetchAdd:
		h.Atomic = bth.AtomicFields{VA: va, RKey: rkey, SwapAdd: rng.Uint64(), Compare: rng.Uint64()}
	case bth.RCWriteOnly:
		h.RETH = bth.RETHFields{VA: va, RKey: rkey, DMALen: 8} // carries 8 bytes
	case bth.RCAtomicWrite:
		h.RETH = bth.RETHFields{VA: va, RKey: rkey, DMALen: 8}
	default:
		h.RETH = bth.RETHFields{VA: va, RKey: rkey, DMALen: max(n, 1)}
	}
}

// inside returns an 8-byte-aligned address well inside m.
func inside(rng *rand.Rand, m *rxego.MR) uint64 {
	return m.IOVA() + uint64(rng.IntN(m.Len()/8-1))*8
}

var forges = []forge{
	{"random rkey and address", func(v *victim, rng *rand.Rand, h *bth.Header) {
		randomOp(rng, h, rng.Uint32(), rng.Uint64(), rng.Uint32())
	}},
	{"live MR index, random key byte and address", func(v *victim, rng *rand.Rand, h *bth.Header) {
		randomOp(rng, h, v.mrs[0].RKey()&^0xff|uint32(rng.IntN(256)), rng.Uint64(), rng.Uint32())
	}},
	{"stale key byte", func(v *victim, rng *rand.Rand, h *bth.Header) {
		randomOp(rng, h, v.mrs[0].RKey()^uint32(1+rng.IntN(255)), inside(rng, v.mrs[0]), 8)
	}},
	{"rkey of another PD", func(v *victim, rng *rand.Rand, h *bth.Header) {
		randomOp(rng, h, v.other.RKey(), inside(rng, v.other), 8)
	}},
	{"deregistered MR", func(v *victim, rng *rand.Rand, h *bth.Header) {
		randomOp(rng, h, v.dead.RKey(), v.dead.IOVA()+uint64(rng.IntN(v.dead.Len()/8-1))*8, 8)
	}},
	{"MR without remote access", func(v *victim, rng *rand.Rand, h *bth.Header) {
		randomOp(rng, h, v.mrs[1].RKey(), inside(rng, v.mrs[1]), 8)
	}},
	{"range wrapping the address space", func(v *victim, rng *rand.Rand, h *bth.Header) {
		n := uint32(16 + rng.IntN(1<<20))
		randomOp(rng, h, v.mrs[0].RKey(), -uint64(8+rng.IntN(int(n)-8))&^7, n)
	}},
	{"range past the end", func(v *victim, rng *rand.Rand, h *bth.Header) {
		m := v.mrs[0]
		end := m.IOVA() + uint64(m.Len())
		randomOp(rng, h, m.RKey(), end, 16) // atomics: the word just past the end
		if h.Opcode == bth.RCReadRequest || h.Opcode == bth.RCWriteOnly {
			h.RETH.VA = end - 4 // straddles the end
		}
	}},
	{"range before the start", func(v *victim, rng *rand.Rand, h *bth.Header) {
		randomOp(rng, h, v.mrs[0].RKey(), v.mrs[0].IOVA()-8, 8)
	}},
	{"misaligned atomic", func(v *victim, rng *rand.Rand, h *bth.Header) {
		va := inside(rng, v.mrs[0]) + uint64(1+rng.IntN(7))
		h.Opcode = []bth.Opcode{bth.RCCompareSwap, bth.RCFetchAdd, bth.RCAtomicWrite}[rng.IntN(3)]
		h.Atomic = bth.AtomicFields{VA: va, RKey: v.mrs[0].RKey(), SwapAdd: 1}
		h.RETH = bth.RETHFields{VA: va, RKey: v.mrs[0].RKey(), DMALen: 8}
	}},
}

// newVictim opens the victim device with k QPs connected to attacker.
func newVictim(t *testing.T, addr, attacker netip.AddrPort, k int) *victim {
	t.Helper()
	dev, err := rxego.Open(addr.String(), &rxego.Options{Conn: listen(t, addr, transport.Options{SocketRecvBuffer: 32 << 20})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	v := &victim{dev: dev, psn: 0x777}
	pd, _ := dev.AllocPD()
	pd2, _ := dev.AllocPD()
	reg := func(pd *rxego.PD, access rxego.Access) *rxego.MR {
		buf := make([]byte, 64<<10)
		pattern(buf, byte(len(v.bufs)))
		m, err := pd.RegMR(buf, access)
		if err != nil {
			t.Fatal(err)
		}
		v.bufs, v.orig = append(v.bufs, buf), append(v.orig, append([]byte(nil), buf...))
		return m
	}
	v.dead = reg(pd, allAccess)
	if err := v.dead.Deregister(); err != nil {
		t.Fatal(err)
	}
	v.mrs = []*rxego.MR{reg(pd, allAccess), reg(pd, rxego.AccessLocalWrite)}
	v.other = reg(pd2, allAccess)
	cq, _ := dev.CreateCQ(16)
	for i := range k {
		q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq, RecvCQ: cq, Caps: rxego.Caps{MaxSendWR: 1, MaxRecvWR: 1}})
		if err != nil {
			t.Fatal(err)
		}
		v.qps = append(v.qps, q)
		v.arm(t, i, attacker)
	}
	dev.Sync()
	return v
}

// arm (re)connects QP i to the attacker, expecting PSN v.psn next.
func (v *victim) arm(t *testing.T, i int, attacker netip.AddrPort) {
	q := v.qps[i]
	if q.State() != rxego.StateReset {
		if err := q.Modify(&rxego.QPAttr{State: rxego.StateReset}, rxego.AttrState); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Connect(rxego.RemoteQP{Addr: attacker, QPN: uint32(0x100 + i), PSN: v.psn}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestRKeyFlood sends forged RDMA requests with random and targeted bad
// rkeys and addresses to a live endpoint, each to a QP in RTS at exactly
// the PSN it expects, from the address it is connected to: so every one
// reaches the responder's key, PD, access and bounds checks. The responder
// answers each with a NAK and moves the QP to ERR (class C error, as rxe
// does); the test re-arms the QPs after each round. Not one byte of the
// endpoint's memory may change and no data or atomic result may come back.
func TestRKeyFlood(t *testing.T) {
	const k = 512 // QPs, each taking one forged request per round
	n := rkeyRequests()
	addrA, addrB := nextLoopback()
	att := listen(t, addrA, transport.Options{SocketRecvBuffer: 32 << 20})
	defer att.Close()
	v := newVictim(t, addrB, att.LocalAddr(), k)
	rng := rand.New(rand.NewPCG(42, 7))
	perForge := make([]int, len(forges))
	var naks [32]int
	pkts := make([][]byte, k)
	for i := range pkts {
		pkts[i] = make([]byte, 128)
	}
	msgs := make([]transport.Message, k)
	in := make([]transport.Message, 64)
	payload := make([]byte, 8)
	start := time.Now()
	for sent := 0; sent < n; {
		round := min(k, n-sent)
		for i := range round {
			f := rng.IntN(len(forges))
			perForge[f]++
			h := bth.Header{PKey: bth.DefaultPKey, DestQP: v.qps[i].Num(), AckReq: true, PSN: bth.PSN(v.psn)}
			forges[f].build(v, rng, &h)
			var pl []byte
			if h.Opcode == bth.RCWriteOnly || h.Opcode == bth.RCAtomicWrite {
				pl = payload
			}
			m, err := h.Encode(pkts[i], pl)
			if err != nil {
				t.Fatal(err)
			}
			msgs[i] = transport.Message{Buf: pkts[i][:m], Peer: v.dev.Addr()}
		}
		if _, err := att.Send(msgs[:round]); err != nil {
			t.Fatal(err)
		}
		// Every request is answered by exactly one NAK, and nothing else.
		for got := 0; got < round; {
			nin, err := recvTimeout(att, in, 10*time.Second)
			if err != nil {
				t.Fatalf("round at %d: %d of %d answers: %v; victim: %s", sent, got, round, err, engineStats(v.dev))
			}
			for _, m := range in[:nin] {
				p, err := bth.Parse(m.Buf)
				if err != nil || p.Info.Opcode != bth.RCAck || p.AETH().Syndrome().Kind() != reth.KindNAK {
					t.Fatalf("the endpoint answered a forged request with %x", m.Buf)
				}
				naks[p.AETH().Syndrome().Value()]++
			}
			got += nin
		}
		for i := range round {
			v.arm(t, i, att.LocalAddr())
		}
		sent += round
	}
	took := time.Since(start)
	v.dev.Sync()
	for i, buf := range v.bufs {
		if !bytes.Equal(buf, v.orig[i]) {
			t.Fatalf("registered buffer %d changed at byte %d", i, firstDiff(buf, v.orig[i]))
		}
	}
	s := v.dev.Stats()
	var counts string
	for i, f := range forges {
		counts += fmt.Sprintf("\n  %-45s %d", f.name, perForge[i])
	}
	byReason := map[rxego.DropReason]uint64{}
	var dropped uint64
	for _, r := range []rxego.DropReason{rxego.DropBadAccess, rxego.DropOutOfBounds, rxego.DropMisaligned, rxego.DropBadLength} {
		byReason[r] = s.Drops[r]
		dropped += byReason[r]
	}
	t.Logf("%d forged requests to %d QPs in %v (%.0f/s): %d remote access NAKs, %d invalid request NAKs; "+
		"engine: drops %v, rdma_recvs=%d; per class:%s",
		n, k, took.Round(time.Millisecond), float64(n)/took.Seconds(), naks[reth.NAKRemoteAccess], naks[reth.NAKInvalidRequest],
		byReason, s.RDMARecvs, counts)
	if dropped != uint64(n) {
		t.Fatalf("%d requests counted as dropped for bad access, bounds, alignment or length, want %d", dropped, n)
	}
	if naks[reth.NAKRemoteAccess]+naks[reth.NAKInvalidRequest] != n {
		t.Fatalf("NAK codes %v: want only remote access and invalid request, %d in all", naks, n)
	}
	if s.RDMARecvs != 0 {
		t.Fatalf("the responder executed %d forged requests", s.RDMARecvs)
	}
}

// recvTimeout receives one batch from c, failing after d.
func recvTimeout(c transport.Conn, msgs []transport.Message, d time.Duration) (int, error) {
	type res struct {
		n   int
		err error
	}
	ch := make(chan res, 1)
	go func() {
		n, err := c.Recv(msgs)
		ch <- res{n, err}
	}()
	select {
	case r := <-ch:
		return r.n, r.err
	case <-time.After(d):
		c.Close() // unblocks the Recv; the test fails anyway
		<-ch
		return 0, fmt.Errorf("nothing received in %v", d)
	}
}

// engineStats formats a device's engine counters for failure messages.
func engineStats(d *rxego.Device) string {
	e := &end{dev: d}
	return e.stats()
}
