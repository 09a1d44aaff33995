package cm

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rxego/rxego"
)

// forgedSource is where a forged request claims to come from: a random
// address in 198.18.0.0/15 and source port, in the rdma_cm IP header
// that is the request's private data.
func forgedSource(t *testing.T, rng *rand.Rand) (netip.Addr, []byte) {
	src := netip.AddrFrom4([4]byte{198, 18, byte(rng.IntN(256)), byte(1 + rng.IntN(254))})
	priv := make([]byte, IPHeaderSize)
	hdr := IPHeader{Version: IPHeaderVersion, SrcPort: uint16(rng.Uint32()), Src: src, Dst: serverAddr}
	if err := hdr.Marshal(priv); err != nil {
		t.Fatal(err)
	}
	return src, priv
}

// startFlood hands m forged MADs from a goroutine, burst of them a
// millisecond, until n are sent, ten seconds have passed or the test is
// done with it (stop ends the flood and waits for the goroutine). sent
// counts the MADs handed in so far.
func startFlood(t *testing.T, m *Manager, seed uint64, n, burst int64,
	forge func(*testing.T, *rand.Rand) (netip.Addr, []byte)) (sent *atomic.Int64, stop func()) {
	sent = new(atomic.Int64)
	done := make(chan struct{})
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		rng := rand.New(rand.NewPCG(seed, seed+1))
		end := time.Now().Add(10 * time.Second)
		for sent.Load() < n && time.Now().Before(end) {
			for range burst {
				m.receive(forge(t, rng))
			}
			sent.Add(burst)
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	return sent, func() { close(done); <-flooded }
}

// forgedREQ is a REQ for port as a flooder sends it: random
// communication ID, CA GUID and source address, never retransmitted, its
// REP never answered.
func forgedREQ(t *testing.T, rng *rand.Rand, port uint16) (netip.Addr, []byte) {
	src, priv := forgedSource(t, rng)
	req := REQ{LocalCommID: rng.Uint32() | 1, ServiceID: ServiceID(PortSpaceTCP, port), LocalCAGUID: rng.Uint64() | 1,
		LocalQPN: rng.Uint32() & 0xffffff, TransportType: TransportRC, StartingPSN: rng.Uint32() & 0xffffff,
		RemoteCMResponseTimeout: 20, LocalCMResponseTimeout: 20, RetryCount: 7, PKey: 0xffff,
		PathMTU: uint8(rxego.MTU1024), RNRRetryCount: 7, MaxCMRetries: 15,
		Primary:     Path{LocalLID: 0xffff, RemoteLID: 0xffff, LocalGID: src.As16(), RemoteGID: serverAddr.As16(), HopLimit: 64, LocalACKTimeout: 14},
		PrivateData: priv}
	mad, err := Marshal(rng.Uint64(), &req)
	if err != nil {
		t.Fatal(err)
	}
	return src, mad[:]
}

// TestREQFlood: a bounded flood of forged REQs (100,000 at about 100,000
// a second, from random sources, on the in-memory network) against a
// listener served one request at a time, as rxego rping -s serves. The
// forged requests fill the backlog and every one the server takes goes
// half-open; a live client that dials during the flood is dropped once,
// retransmits its REQ, is served from the retried lane as soon as the
// half-open request before it expires, and exchanges data while the
// flood goes on. The manager's state stays bounded throughout.
func TestREQFlood(t *testing.T) {
	const (
		port    = 7300
		floodN  = 100_000
		burst   = 100
		halfOpn = 50 * time.Millisecond
	)
	scfg := fastConfig()
	scfg.HalfOpenTimeout = halfOpn
	p := newPair(t, scfg, fastConfig(), nil, nil)
	ctx := testCtx(t)
	l, err := p.srv.m.Listen(port)
	if err != nil {
		t.Fatal(err)
	}
	srvEP, cliEP := p.srv.newEndpoint(t, 4096), p.cli.newEndpoint(t, 4096)

	// The flood: bounded in count and time, stopped early when the test
	// is done with it.
	sent, stop := startFlood(t, p.srv.m, 7, floodN, burst, func(t *testing.T, rng *rand.Rand) (netip.Addr, []byte) {
		return forgedREQ(t, rng, port)
	})
	defer stop()

	// The server: one slot, given back when a request goes half-open.
	type result struct {
		c   *Conn
		err error
	}
	served := make(chan result, 1)
	var halfOpen int
	go func() {
		for {
			req, err := l.Accept(ctx)
			if err != nil {
				served <- result{err: err}
				return
			}
			c, err := req.Accept(ctx, srvEP.q, nil)
			if errors.Is(err, ErrHalfOpen) {
				halfOpen++
				if err = srvEP.q.Modify(&rxego.QPAttr{State: rxego.StateReset}, rxego.AttrState); err == nil {
					continue
				}
			}
			served <- result{c, err}
			return
		}
	}()

	for sent.Load() < 1000 { // the backlog is full of forged requests
		time.Sleep(time.Millisecond)
	}
	start, before := time.Now(), sent.Load()
	if _, err := p.cli.m.Dial(ctx, netip.AddrPortFrom(serverAddr, port), cliEP.q, nil); err != nil {
		t.Fatalf("live client during the flood: %v", err)
	}
	took, during := time.Since(start), sent.Load()-before
	r := <-served
	if r.err != nil {
		t.Fatalf("server: %v", r.err)
	}
	if sent.Load() >= floodN {
		t.Fatalf("the flood ended (%d REQs) before the client got in", sent.Load())
	}
	exchange(t, srvEP, cliEP)
	st := p.srv.m.Counters()
	if st["cm_backlog_shed"] == 0 || st["cm_half_open"] == 0 || halfOpen == 0 {
		t.Errorf("shed %d, half-open %d (server saw %d): the flood did not fill the backlog", st["cm_backlog_shed"], st["cm_half_open"], halfOpen)
	}
	if got := p.cli.m.Counters()["cm_sent_req"]; got < 2 {
		t.Errorf("client sent %d REQs: its first was not dropped", got)
	}
	m := p.srv.m
	m.mu.Lock()
	conns, shed := len(m.conns), m.shed.len()
	m.mu.Unlock()
	if limit := DefaultBacklog + DefaultBacklog/4 + 2; conns > limit || shed > shedRing {
		t.Errorf("server holds %d connections (limit %d), remembers %d shed REQs (limit %d)", conns, limit, shed, shedRing)
	}
	t.Logf("live client in after %v, %d forged REQs meanwhile (%d in all so far); %d shed, %d half-open (%v each), %d connections held",
		took, during, sent.Load(), st["cm_backlog_shed"], st["cm_half_open"], halfOpn, conns)
}
