package bench

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// scaleQPs is the QP count of the scale test and benchmark.
const scaleQPs = 10000

// scaleCaps are each QP's queue sizes: room for a few messages in flight
// each way, as an application spreading traffic over many QPs gives them.
var scaleCaps = rxego.Caps{MaxSendWR: 16, MaxRecvWR: 16}

// liveHeap returns the live heap after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// scalePair is two devices with n connected RC QPs between them.
type scalePair struct {
	devs  [2]*rxego.Device
	qps   [2][]*rxego.QP
	mrs   [2]*rxego.MR
	cqs   [2]*rxego.CQ
	perQP float64 // heap bytes per idle connected QP, both sides' average
}

func newScalePair(tb testing.TB, n, size int) *scalePair {
	tb.Helper()
	s := &scalePair{}
	pds := [2]*rxego.PD{}
	for i := range s.devs {
		s.devs[i] = testaddr.Open(tb, nil)
		pds[i], _ = s.devs[i].AllocPD()
		s.cqs[i], _ = s.devs[i].CreateCQ(4096)
		s.mrs[i], _ = pds[i].RegMR(make([]byte, size), rxego.AccessLocalWrite|rxego.AccessRemoteWrite)
		s.qps[i] = make([]*rxego.QP, 0, n)
	}
	before := liveHeap()
	for range n {
		for i := range s.devs {
			q, err := pds[i].CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: s.cqs[i], RecvCQ: s.cqs[i], Caps: scaleCaps})
			if err != nil {
				tb.Fatal(err)
			}
			s.qps[i] = append(s.qps[i], q)
		}
	}
	for k := range n {
		for i := range 2 {
			o := 1 - i
			err := s.qps[i][k].Connect(rxego.RemoteQP{Addr: s.devs[o].Addr(), QPN: s.qps[o][k].Num()},
				&rxego.ConnectOptions{MTU: rxego.MTU4096, Timeout: 16})

			if err != nil {
				tb.Fatal(err)
			}
		}
	}
	s.perQP = float64(liveHeap()-before) / float64(2*n)
	return s
}

// TestQPMemory checks that 10,000 idle connected RC QPs (queues of 16 WRs
// each way) take under 40 MiB of heap in one device, and reports the
// figure per QP.
func TestQPMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 QPs")
	}
	s := newScalePair(t, scaleQPs, 4096)
	total := s.perQP * scaleQPs
	t.Logf("%.0f bytes per idle connected RC QP; %.1f MiB for %d", s.perQP, total/(1<<20), scaleQPs)
	if total > 40<<20 {
		t.Errorf("%d idle QPs take %.1f MiB, want under 40 MiB", scaleQPs, total/(1<<20))
	}
}

// BenchmarkScale has all 10,000 QPs carry 4 KiB WRITEs, one in flight per
// QP at most and 512 over all, round robin, each round of posts inside
// Engine.Batch; it reports bytes per idle QP.
func BenchmarkScale(b *testing.B) {
	const size, inflightMax = 4096, 512
	s := newScalePair(b, scaleQPs, size)
	b.ReportMetric(s.perQP, "B/QP")
	wr := rxego.SendWR{Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
		SGL:        []rxego.SGE{{Addr: s.mrs[0].IOVA(), Length: size, LKey: s.mrs[0].LKey()}},
		RemoteAddr: s.mrs[1].IOVA(), RKey: s.mrs[1].RKey()}
	busy := make([]bool, scaleQPs)
	wcs := make([]rxego.WC, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b.SetBytes(size)
	b.ResetTimer()
	cpu := startCPU()
	defer cpu.report(b, size)
	next, inflight := 0, 0
	var postErr error
	post := func(done int) {
		for inflight < inflightMax && done+inflight < b.N && postErr == nil {
			for busy[next] {
				next = (next + 1) % scaleQPs
			}
			wr.ID = uint64(next)
			postErr = s.qps[0][next].PostSend(wr)
			busy[next] = true
			next = (next + 1) % scaleQPs
			inflight++
		}
	}
	for done := 0; done < b.N; {
		s.devs[0].Batch(func() { post(done) })
		if postErr != nil {
			b.Fatal(postErr)
		}
		n, err := s.cqs[0].PollWait(ctx, wcs)
		if err != nil {
			b.Fatal(err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != rxego.WCSuccess {
				b.Fatalf("completion %v", wc.Status)
			}
			busy[wc.ID] = false
		}
		inflight -= n
		done += n
	}
}
