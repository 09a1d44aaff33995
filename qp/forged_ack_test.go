package qp

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/reth"
)

// TestSparseForgedResponses (issue 24): a sender under sparse forged
// in-window responses (40 in all, one every 100 ms: RNR NAKs, PSN sequence
// error NAKs, or ghost ACKs, with a real 2% loss so that the responder
// has PSNs to refuse) must not be wedged for good. After the forger stops
// the QP is either in RTS and working (a last WRITE completes and its
// bytes arrive) or in ERR, having reported an error completion; never
// in RTS resending for ever while nothing completes. retry_cnt and
// rnr_retry are 7, rxe's "unlimited".
func TestSparseForgedResponses(t *testing.T) {
	kinds := []struct {
		name string
		syn  reth.Syndrome
	}{
		{"RNR NAK", reth.RNRSyndrome(1)},
		{"sequence error NAK", reth.NAKSyndrome(reth.NAKPSNSeqError)},
		{"ghost ACK", reth.ACKSyndrome(31)},
	}
	for _, k := range kinds {
		for seed := uint64(1); seed <= 2; seed++ {
			t.Run(k.name, func(t *testing.T) { forgedResponsesRun(t, k.syn, seed) })
		}
	}
}

func forgedResponsesRun(t *testing.T, syn reth.Syndrome, seed uint64) {
	const (
		window   = 16
		maxPosts = 6000
		forgings = 40
		msgSize  = 256
	)
	o := defaultConn()
	o.timeout = 12 // 16.8 ms
	f, a, b := pair(t, RC, o)
	f.rng = rand.New(rand.NewPCG(seed, 24))
	f.delay = func(wirePkt) time.Duration { return 5 * time.Millisecond }
	f.drop = func(p wirePkt) bool { return p.dst == b.n.addr && f.rng.Float64() < 0.02 }
	src, sbuf := a.n.reg(t, window*msgSize, allAccess)
	dst, dbuf := b.n.reg(t, window*msgSize, allAccess)
	posted, outstanding, errs := 0, 0, 0
	pumping := true
	var firstErr WC
	var pump func()
	pump = func() {
		for _, wc := range pollAll(a.scq) {
			outstanding--
			if wc.Status != WCSuccess && wc.Status != WCWRFlushErr && errs == 0 {
				firstErr = wc
			}
			if wc.Status != WCSuccess {
				errs++
			}
		}
		for pumping && posted < maxPosts && outstanding < window && a.qp.State() == RTS {
			i := posted % window
			if err := a.qp.PostSend(SendWR{ID: uint64(posted), Opcode: WRWrite, Flags: SendSignaled,
				SGL: sge(src, i*msgSize, msgSize), RemoteAddr: dst.IOVA() + uint64(i*msgSize), RKey: dst.RKey()}); err != nil {
				t.Fatal(err)
			}
			posted++
			outstanding++
		}
		if pumping {
			f.after(time.Millisecond, pump)
		}
	}
	f.after(0, pump)
	forged := 0
	var forge func()
	forge = func() {
		q := a.qp
		q.e.mu.Lock()
		lo, hi := q.req.compPSN, q.req.maxSent
		q.e.mu.Unlock()
		if n := hi.Diff(lo); n > 0 {
			pkt := make([]byte, bth.Len+reth.AETHLen+bth.ICRCLen)
			h := bth.BTH(pkt)
			h.SetOpcode(bth.RCAck)
			h.SetPKey(bth.DefaultPKey)
			h.SetDestQP(q.Num())
			h.SetPSN(lo.Add(f.rng.IntN(int(n))))
			reth.AETH(pkt[bth.Len:]).Set(syn, 0)
			f.queue = append(f.queue, wirePkt{data: pkt, src: b.n.addr, dst: a.n.addr})
		}
		if forged++; forged < forgings {
			f.after(100*time.Millisecond, forge)
		}
	}
	f.after(50*time.Millisecond, forge)
	f.runFor(forgings * 100 * time.Millisecond)
	f.runFor(20 * time.Second) // the forger has stopped: long enough for any bounded retrying to end
	pumping = false
	pump()
	state := a.qp.State()
	t.Logf("%d forged, %d WRITEs posted, %d not successful (first error %v), A in %v, B's responder at PSN %d, A's completed PSN %d",
		forged, posted, errs, firstErr.Status, state, b.qp.resp.ePSN, a.qp.req.compPSN)
	if state == Err {
		if firstErr.Status == WCSuccess {
			t.Fatal("A went to ERR without an error completion")
		}
		return
	}
	if state != RTS || outstanding != 0 {
		t.Fatalf("A in %v with %d WRITEs neither completed nor failed after the forger stopped: wedged", state, outstanding)
	}
	// RTS: it must still work.
	copy(sbuf[:msgSize], bytes.Repeat([]byte{0xa5}, msgSize))
	a.post(t, SendWR{ID: 1 << 40, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(src, 0, msgSize), RemoteAddr: dst.IOVA(), RKey: dst.RKey()})
	f.run(10 * time.Second)
	wcs := pollAll(a.scq)
	if len(wcs) != 1 || wcs[0].Status != WCSuccess || !bytes.Equal(dbuf[:msgSize], sbuf[:msgSize]) {
		t.Fatalf("A in RTS but a last WRITE got %v (bytes arrived: %v): wedged", wcs, bytes.Equal(dbuf[:msgSize], sbuf[:msgSize]))
	}
}
