package cm

import (
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

// forgedSIDRREQ is a SIDR_REQ for port as a flooder sends it: random
// request ID and source address, never retransmitted.
func forgedSIDRREQ(t *testing.T, rng *rand.Rand, port uint16) (netip.Addr, []byte) {
	src, priv := forgedSource(t, rng)
	mad, err := Marshal(rng.Uint64(), &SIDRREQ{RequestID: rng.Uint32(), PKey: 0xffff, ServiceID: ServiceID(PortSpaceUDP, port), PrivateData: priv})
	if err != nil {
		t.Fatal(err)
	}
	return src, mad[:]
}

// TestSIDRFlood (issue 24): a bounded flood of forged SIDR_REQs (at most
// 30,000, about 5,000 a second) against a UD listener whose application
// takes 2 ms to answer each request, so the backlog stays full. Legit
// DialUDs during the flood are each dropped at most once, retransmit, and
// are served from the retried lane: every one resolves (before, a full
// backlog answered at once with a reject, status 2, and most legit dials
// failed). The shed requests are counted, and their memory is bounded.
func TestSIDRFlood(t *testing.T) {
	const (
		port   = 7400
		floodN = 30_000
		burst  = 5
		dials  = 20
		answer = 2 * time.Millisecond
	)
	p := newPair(t, fastConfig(), fastConfig(), nil, nil)
	ctx := testCtx(t)
	l, err := p.srv.m.ListenUD(port)
	if err != nil {
		t.Fatal(err)
	}
	sq := p.srv.udEndpoint(t)

	sent, stop := startFlood(t, p.srv.m, 9, floodN, burst, func(t *testing.T, rng *rand.Rand) (netip.Addr, []byte) {
		return forgedSIDRREQ(t, rng, port)
	})
	defer stop()

	// The slow application: answers every request, 2 ms each.
	var answered atomic.Int64
	go func() {
		for {
			r, err := l.Accept(ctx)
			if err != nil {
				return
			}
			time.Sleep(answer)
			if r.Accept(sq.q, nil) == nil {
				answered.Add(1)
			}
		}
	}()
	defer l.Close()

	for sent.Load() < 200 { // the backlog is full of forged requests
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	for i := range dials {
		peer, err := p.cli.m.DialUD(ctx, netip.AddrPortFrom(serverAddr, port), nil)
		if err != nil {
			t.Fatalf("legit dial %d of %d during the flood (%d forged so far): %v", i+1, dials, sent.Load(), err)
		}
		if peer.QPN != sq.q.Num() || peer.QKey != UDPQKey {
			t.Fatalf("dial %d: peer %+v", i+1, peer)
		}
	}
	took := time.Since(start)
	if sent.Load() >= floodN {
		t.Fatalf("the flood ended (%d requests) before the dials were done", sent.Load())
	}
	st := p.srv.m.Counters()
	if st["cm_backlog_shed"] == 0 {
		t.Error("no request was shed: the flood did not fill the backlog")
	}
	m := p.srv.m
	m.mu.Lock()
	shed := m.sidr.shed.len()
	m.mu.Unlock()
	if shed > shedRing {
		t.Errorf("%d shed requests remembered (limit %d)", shed, shedRing)
	}
	t.Logf("%d legit dials in %v during the flood (%d forged requests so far); %d shed, %d answered by the application",
		dials, took, sent.Load(), st["cm_backlog_shed"], answered.Load())
}
