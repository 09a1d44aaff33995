package reliability_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// fault is one impairment the loss matrix applies to every packet each end
// receives (so requests, responses and ACKs all suffer it).
type fault struct {
	name string
	cfg  transport.ImpairConfig
}

var faults = []fault{
	{"loss1", transport.ImpairConfig{Loss: 0.01}},
	{"loss5", transport.ImpairConfig{Loss: 0.05}},
	{"loss10", transport.ImpairConfig{Loss: 0.10}},
	{"dup5", transport.ImpairConfig{Duplicate: 0.05}},
	{"reorder5", transport.ImpairConfig{Reorder: 0.05, ReorderTimeout: time.Millisecond}},
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
func impairedPair(t testing.TB, cfg transport.ImpairConfig, seed uint64, r opRun) (*end, *end) {
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
	connect(t, a, b, rxego.ConnectOptions{MTU: qp.MTU256, Timeout: 8, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16})
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
	a, b := impairedPair(t, transport.ImpairConfig{Loss: 0.05}, 7, r)
	took := runOp(t, a, b, r)
	t.Logf("%d FETCH_ADDs in %v; a: %s; b: %s", n, took.Round(time.Millisecond), a.stats(), b.stats())
}
