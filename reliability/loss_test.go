package reliability_test

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/transport"
	"github.com/rxego/rxego/transport/impair"
)

// fault is one impairment the loss matrix applies to every packet each end
// receives (so requests, responses and ACKs all suffer it).
type fault struct {
	name string
	cfg  impair.Config
}

var faults = []fault{
	{"loss1", impair.Config{Loss: 0.01}},
	{"loss5", impair.Config{Loss: 0.05}},
	{"loss10", impair.Config{Loss: 0.10}},
	{"dup5", impair.Config{Duplicate: 0.05}},
	{"reorder5", impair.Config{Reorder: 0.05, ReorderTimeout: time.Millisecond}},
}

// lossMessages is the message count of each run of the matrix.
func lossMessages() int {
	if testing.Short() {
		return 1000
	}
	return 10000
}

// impairedPair opens two loopback ends whose receive paths both suffer cfg
// (each with its own seed) and connects them with a short timeout.
func impairedPair(t testing.TB, cfg impair.Config, seed uint64, r opRun) (*end, *end) {
	t.Helper()
	addrA, addrB := nextLoopback()
	ca, cb := cfg, cfg
	ca.Seed, cb.Seed = seed, seed+1
	ec := endConfig{size: r.bufSize(), depth: r.inFlight + 16, window: 128}
	if consumesRecv(r.op) {
		ec.rdepth = r.n + 16
	}
	ec.addr, ec.impair = addrA, &ca
	a := openEnd(t, ec)
	ec.addr, ec.impair = addrB, &cb
	b := openEnd(t, ec)
	connect(t, a, b, rxego.ConnectOptions{MTU: rxego.MTU256, Timeout: 8, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16})
	return a, b
}

// TestOpsUnderFaults runs every RC operation under each fault: 10,000
// messages of 64 bytes or 8-byte atomics, over
// real UDP sockets on loopback, checked byte for byte and completion by
// completion.
func TestOpsUnderFaults(t *testing.T) {
	n := lossMessages()
	for fi, f := range faults {
		for oi, o := range rcOps {
			t.Run(fmt.Sprintf("%s/%s", f.name, o.name), func(t *testing.T) {
				r := opRun{op: o.op, n: n, size: 64, inFlight: 32, timeout: 60 * time.Second}
				a, b := impairedPair(t, f.cfg, uint64(100*fi+oi), r)
				took := runOp(t, a, b, r)
				t.Logf("%d %v in %v; a: %s; b: %s", n, o.name, took.Round(time.Millisecond), a.stats(), b.stats())
			})
		}
	}
}

// TestFetchAddExactlyOnce runs 100,000 FETCH_ADDs of 1 on one counter
// across 5% loss in both directions: lost requests, lost responses and the
// retries they cause must leave the counter exactly 100,000 higher, and
// every FETCH_ADD must return the count before it (checked in runOp).
func TestFetchAddExactlyOnce(t *testing.T) {
	n := 100000
	if testing.Short() {
		n = 10000
	}
	r := opRun{op: rxego.WRFetchAdd, n: n, inFlight: 32, timeout: 120 * time.Second}
	a, b := impairedPair(t, impair.Config{Loss: 0.05}, 7, r)
	took := runOp(t, a, b, r)
	t.Logf("%d FETCH_ADDs in %v; a: %s; b: %s", n, took.Round(time.Millisecond), a.stats(), b.stats())
}

// readLog records, in one order, the READ requests the responder receives
// and the READ responses the requester receives.
type readLog struct {
	mu     sync.Mutex
	events []readEvent
}

type readEvent struct {
	request bool // a READ request at the responder; else a response at the requester
	psn     bth.PSN
	va      uint64
	n       uint32
}

// tap returns a Tap recording the packets one side receives.
func (l *readLog) tap(responder bool) transport.Tap { return readTap{l, responder} }

type readTap struct {
	l         *readLog
	responder bool
}

func (r readTap) Packet(dir transport.Dir, _ time.Time, _, _ netip.AddrPort, _ uint8, _ uint16, pkt []byte) {
	p, err := bth.Parse(pkt)
	if dir != transport.In || err != nil {
		return
	}
	ev := readEvent{psn: p.BTH().PSN()}
	switch {
	case r.responder && p.Info.Opcode == bth.RCReadRequest:
		ev.request, ev.va, ev.n = true, p.RETH().VA(), p.RETH().DMALen()
	case !r.responder && p.Info.Op == bth.OpReadResponse:
	default:
		return
	}
	r.l.mu.Lock()
	r.l.events = append(r.l.events, ev)
	r.l.mu.Unlock()
}

func (readTap) Drop(transport.DropReason, time.Time, netip.AddrPort, netip.AddrPort, uint8, []byte) {}

// TestReadRetryResumes loses 5% of READ responses and checks, from what
// each side actually received, that every retried READ request asks for
// bytes from the first response the requester had not yet received: its
// PSN and address start at a response boundary that every response
// before had reached the requester, and its length ends at one.
func TestReadRetryResumes(t *testing.T) {
	const size, mtu = 16384, 1024 // 16 responses per READ
	n := 300
	if testing.Short() {
		n = 100
	}
	r := opRun{op: rxego.WRRead, n: n, size: size, inFlight: 8, timeout: 60 * time.Second}
	addrA, addrB := nextLoopback()
	ec := endConfig{size: r.bufSize(), depth: r.inFlight + 16, window: 256}
	ec.addr = addrA
	a := openEnd(t, ec)
	ec.addr, ec.impair = addrB, &impair.Config{Seed: 11, Dir: impair.Send, Loss: 0.05}
	b := openEnd(t, ec)
	var log readLog
	a.dev.Transport().SetTap(log.tap(false))
	b.dev.Transport().SetTap(log.tap(true))
	connect(t, a, b, rxego.ConnectOptions{MTU: rxego.MTU1024, Timeout: 10, RetryCnt: 7, MaxRdAtomic: 16})
	runOp(t, a, b, r)
	a.dev.Transport().SetTap(nil)
	b.dev.Transport().SetTap(nil)
	log.mu.Lock()
	defer log.mu.Unlock()
	first := bth.PSN(0xfffff0) // a's first PSN (see connect); READ i takes 16 PSNs
	got := map[bth.PSN]bool{}  // responses the requester has received so far
	var retries, resumed int
	askedTo := map[int]int{} // per READ: the response after the last one asked for so far
	lastEnd := -1            // the PSN offset after the last request's responses
	for _, ev := range log.events {
		if !ev.request {
			got[ev.psn] = true
			continue
		}
		k := int(uint32(ev.psn.Diff(first))) // PSNs since the first READ
		i, skip := k/16, k%16
		if skip > askedTo[i] {
			t.Fatalf("READ %d request at PSN +%d skips responses %d to %d, never asked for", i, skip, askedTo[i], skip-1)
		}
		retry := skip < askedTo[i] // asks again for what an earlier request of this READ covered
		askedTo[i] = max(askedTo[i], skip+int(ev.n)/mtu)
		sweep := k == lastEnd // goes on where the request before ended (Go-back-N resends what followed)
		lastEnd = k + int(ev.n)/mtu
		if !retry {
			continue // the READ's next request
		}
		retries++
		if sweep {
			continue // a later request the retry before it sends again
		}
		if skip > 0 {
			resumed++
		}
		// A READ may go out as several requests (qp/readsplit.go), each
		// ending at a response boundary: a request asks from where its
		// PSN says, for whole responses, never past the READ's end.
		wantVA := b.addr(i*size + skip*mtu)
		if end := skip*mtu + int(ev.n); ev.va != wantVA || ev.n == 0 || end > size || end%mtu != 0 {
			t.Fatalf("READ %d request at PSN +%d asks for %d bytes at %#x, want at most %d at %#x, ending at a response boundary",
				i, skip, ev.n, ev.va, size-skip*mtu, wantVA)
		}
		// Every response before the one it starts from had arrived (the
		// retry skips nothing the requester lacks).
		for j := range skip {
			if !got[first.Add(16*i+j)] {
				t.Fatalf("READ %d retried from response %d before response %d had arrived", i, skip, j)
			}
		}
	}
	t.Logf("%d READs of %d bytes, 5%% of responses lost: %d retried requests, %d of them resuming mid-message; a: %s; b: %s",
		n, size, retries, resumed, a.stats(), b.stats())
	if resumed == 0 {
		t.Fatal("no READ was retried from the middle")
	}
}

// TestOtherFaults runs every RC operation under the shim's other faults:
// bursts of loss, a fixed delay of 200 us each way (jitter at these packet
// rates would mostly reorder, which reorder5 covers), CE marking (DCQCN
// must react, and nothing may be lost), and corruption of 5% of the
// packets each side receives (caught by the ICRC check, recovered as loss).
func TestOtherFaults(t *testing.T) {
	n := 1000
	switch {
	case testing.Short():
		n = 200
	case raceEnabled:
		n = 500
	}
	other := []fault{
		// Good to bad with 1%, bad to good with 30%: bursts of 3.3 packets
		// on average, about 3% of packets lost.
		{"burst", impair.Config{BurstEnter: 0.01, BurstExit: 0.3}},
		{"delay", impair.Config{Delay: 200 * time.Microsecond}},
		{"ce10", impair.Config{CE: 0.10}},
		{"corrupt5", impair.Config{Corrupt: 0.05}},
	}
	for fi, f := range other {
		for oi, o := range rcOps {
			t.Run(f.name+"/"+o.name, func(t *testing.T) {
				r := opRun{op: o.op, n: n, size: 600, inFlight: 32, timeout: 60 * time.Second}
				a, b := impairedPair(t, f.cfg, uint64(1000+100*fi+oi), r)
				took := runOp(t, a, b, r)
				t.Logf("%d %v in %v; a: %s; b: %s", n, o.name, took.Round(time.Millisecond), a.stats(), b.stats())
				switch f.name {
				case "ce10":
					marked := a.dev.Stats().ECNMarkedPktsReceived + b.dev.Stats().ECNMarkedPktsReceived
					cnps := a.dev.Stats().CNPsReceived + b.dev.Stats().CNPsReceived
					if marked == 0 || cnps == 0 {
						t.Fatalf("%d CE-marked packets seen, %d CNPs received: DCQCN did not react", marked, cnps)
					}
				case "corrupt5":
					// Corrupted packets still queued in the shim are checked
					// when the receive loop takes them: wait for that.
					for _, e := range []*end{a, b} {
						corrupted := func() uint64 { return e.imp.ImpairStats().Recv.Corrupted }
						caught := func() uint64 { return e.dev.Transport().Stats().Drops[transport.DropBadICRC] }
						for deadline := time.Now().Add(5 * time.Second); caught() != corrupted() && time.Now().Before(deadline); {
							time.Sleep(time.Millisecond)
						}
						if corrupted() == 0 || caught() != corrupted() {
							t.Fatalf("%d packets corrupted on receipt, %d dropped for a bad ICRC", corrupted(), caught())
						}
					}
				}
			})
		}
	}
}
