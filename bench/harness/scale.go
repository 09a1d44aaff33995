package harness

import (
	"context"
	"runtime"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/transport"
)

// Scale case parameters: each QP's queues, and the WRITEs in flight over
// all QPs together (each QP has at most one).
const (
	scaleSendWR   = 4
	scaleRecvWR   = 4
	scaleInflight = 512
)

// heapInUse returns the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// scaleRegions is how many Size-byte regions of the server's memory the
// QPs write, each QP the one its server QP's block picks (the number's
// block, transport.QPNBlock, mod scaleRegions): QPs on the server's
// different shards (block mod shards) then never write the same bytes at
// once, for any power-of-two shard count up to 64.
const scaleRegions = 64

// rxegoScale connects QPs RC QPs on each side, measures the client's heap
// per idle connected QP, then has every QP carry Size-byte WRITEs, one at a
// time, scaleInflight over all QPs at once, round robin.
func rxegoScale(p *peer) (Result, error) {
	c := p.c
	s, them, err := rxSetup(p, c.QPs, c.Size*scaleRegions, scaleSendWR, scaleRecvWR, scaleInflight*2, true)
	defer s.close()
	if err != nil {
		return Result{}, err
	}
	var res Result
	// QPs, their queues and their connected state; the heap also holds
	// the slices of QP pointers and numbers this function keeps.
	total := heapInUse() - s.heapBefore
	res.MemTotal = total
	res.MemPerQP = float64(total) / float64(c.QPs)
	if p.server {
		r, err := idleServer(p, s)
		res.Counters, res.CPU = r.Counters, r.CPU
		return res, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout(c)+time.Duration(c.QPs)*time.Millisecond)
	defer cancel()
	wr := rxego.SendWR{Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
		SGL:        []rxego.SGE{{Addr: s.mr.IOVA(), Length: uint32(c.Size), LKey: s.mr.LKey()}},
		RemoteAddr: them.VA, RKey: them.RKey}
	busy := make([]bool, len(s.qps))
	done := make([]uint32, len(s.qps))
	next, inflight := 0, 0
	limit := min(scaleInflight, len(s.qps)) // each QP has at most one
	wcs := make([]rxego.WC, 64)
	w := p.newWindow()
	var postErr error
	post := func() {
		for inflight < limit && postErr == nil {
			// The next idle QP in round-robin order.
			for busy[next] {
				next = (next + 1) % len(s.qps)
			}
			wr.ID = uint64(next)
			wr.RemoteAddr = them.VA + uint64((them.QPNs[next]>>transport.QPNBlockShift)%scaleRegions)*uint64(c.Size)
			postErr = s.qps[next].PostSend(wr)
			busy[next] = true
			next = (next + 1) % len(s.qps)
			inflight++
		}
	}
	for {
		// Posts to many QPs leave together (Engine.Batch), not one
		// system call per post.
		s.dev.Batch(post)
		if postErr != nil {
			return res, postErr
		}
		n, err := waitCQ(ctx, s.cq, wcs, c.Busy)
		if err != nil {
			return res, err
		}
		if err := checkWCs(wcs[:n]); err != nil {
			return res, err
		}
		now := time.Now()
		measuring, fin := w.tick(now)
		for _, wc := range wcs[:n] {
			busy[wc.ID] = false
			if measuring {
				done[wc.ID]++
				res.Msgs++
			}
		}
		inflight -= n
		if fin {
			res.Elapsed = w.elapsed(now)
			res.CPU = p.cpu()
			break
		}
	}
	res.Bytes = res.Msgs * uint64(c.Size)
	for inflight > 0 {
		n, err := waitCQ(ctx, s.cq, wcs, c.Busy)
		if err != nil {
			return res, err
		}
		inflight -= n
	}
	res.Counters = counters(s.dev)
	var idle uint64
	for _, d := range done {
		if d == 0 {
			idle++
		}
	}
	res.Counters["qps_without_traffic"] = idle
	return res, p.ctl.send(signal{"done"})
}
