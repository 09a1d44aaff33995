package rxego_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// TestQPsLeaveNoTrace (issue 24): 50,000 cycles of create, ConnectRC and
// Destroy, as a CM server making a QP per request, leave the heap flat,
// on a device with one GID and on one with two (where each connection
// sets a route from GID 1). Before, each QP stayed reachable until the
// device closed (about 1.5 KB: 75 MB over the run) and each connection
// copied an ever larger route map. The bound, 4 MB (80 bytes a cycle), is
// far below that and far above the noise.
func TestQPsLeaveNoTrace(t *testing.T) {
	const cycles = 50_000
	const bound = 4 << 20
	for _, gids := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d GIDs", gids), func(t *testing.T) {
			var d *rxego.Device
			peer := testaddr.Loopback().String() + ":4791"
			sgid := 0
			if gids == 1 {
				d = openRetry(t, func(*rxego.Options) string { return testaddr.Loopback().String() }, &rxego.Options{})
			} else {
				d = openTwoGIDs(t, rxego.Options{})
				peer, sgid = "[::1]:4791", 1
			}
			defer d.Close()
			pd, err := d.AllocPD()
			if err != nil {
				t.Fatal(err)
			}
			cq, err := d.CreateCQ(16)
			if err != nil {
				t.Fatal(err)
			}
			addr, err := rxego.ParseAddr(peer)
			if err != nil {
				t.Fatal(err)
			}
			cycle := func(i int) {
				q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq, RecvCQ: cq,
					Caps: rxego.Caps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
				if err != nil {
					t.Fatal(err)
				}
				if err := q.Connect(rxego.RemoteQP{Addr: addr, QPN: uint32(100 + i), SGIDIndex: sgid}, nil); err != nil {
					t.Fatal(err)
				}
				if err := q.Destroy(); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 1000 { // warm up: maps and pools at their working size
				cycle(i)
			}
			before := heapInUse()
			for i := range cycles {
				cycle(1000 + i)
			}
			after := heapInUse()
			t.Logf("%d cycles: heap %d -> %d bytes (%+d, %.1f bytes a cycle)", cycles, before, after, after-before, float64(after-before)/float64(cycles))
			if after-before > bound {
				t.Errorf("heap grew by %d bytes over %d QP cycles (bound %d)", after-before, cycles, bound)
			}
		})
	}
}

// heapInUse returns the live heap after a full collection.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
