package bench

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/testaddr"
)

// pair is two connected devices on loopback for in-process benchmarks.
type pair struct {
	devs [2]*rxego.Device
	qps  [2]*rxego.QP
	mrs  [2]*rxego.MR
	cqs  [2]*rxego.CQ
}

func newPair(tb testing.TB, mtu rxego.MTU, size int, depth int) *pair {
	return newPairOpts(tb, mtu, size, depth, nil)
}

// newPairOpts is newPair with device options.
func newPairOpts(tb testing.TB, mtu rxego.MTU, size int, depth int, opts *rxego.Options) *pair {
	tb.Helper()
	p := &pair{}
	for i := range p.devs {
		d := testaddr.Open(tb, opts)
		pd, _ := d.AllocPD()
		var err error
		p.cqs[i], _ = d.CreateCQ(4 * depth)
		p.qps[i], err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: p.cqs[i], RecvCQ: p.cqs[i],
			Caps: rxego.Caps{MaxSendWR: depth, MaxRecvWR: depth, MaxInlineData: 64}})
		if err != nil {
			tb.Fatal(err)
		}
		p.mrs[i], _ = pd.RegMR(make([]byte, size), rxego.AccessLocalWrite|rxego.AccessRemoteWrite|rxego.AccessRemoteRead)
		p.devs[i] = d
	}
	for i := range 2 {
		o := 1 - i
		err := p.qps[i].Connect(rxego.RemoteQP{Addr: p.devs[o].Addr(), QPN: p.qps[o].Num()},
			&rxego.ConnectOptions{MTU: mtu, MaxRdAtomic: 16, Timeout: 16})

		if err != nil {
			tb.Fatal(err)
		}
	}
	return p
}

// stream keeps depth messages of size bytes in flight for b.N messages.
func (p *pair) stream(b *testing.B, op rxego.WROpcode, size, depth int) {
	wr := rxego.SendWR{Opcode: op, SGL: []rxego.SGE{{Addr: p.mrs[0].IOVA(), Length: uint32(size), LKey: p.mrs[0].LKey()}},
		RemoteAddr: p.mrs[1].IOVA(), RKey: p.mrs[1].RKey(), Flags: rxego.SendSignaled}
	wcs := make([]rxego.WC, 64)
	inflight, done := 0, 0
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b.SetBytes(int64(size))
	b.ResetTimer()
	cpu := startCPU()
	defer cpu.report(b, int64(size))
	for done < b.N {
		for inflight < depth && done+inflight < b.N {
			if err := p.qps[0].PostSend(wr); err != nil {
				b.Fatal(err)
			}
			inflight++
		}
		n, err := p.cqs[0].PollWait(ctx, wcs)
		if err != nil {
			b.Fatal(err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != 0 {
				b.Fatalf("completion %v", wc.Status)
			}
		}
		inflight -= n
		done += n
	}
}

func BenchmarkRCWrite(b *testing.B) {
	for _, mtu := range []rxego.MTU{rxego.MTU1024, rxego.MTU4096} {
		for _, size := range []int{4 << 10, 64 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("mtu%d/%dKiB", mtu.Bytes(), size>>10), func(b *testing.B) {
				depth := max(2, min(64, (4<<20)/size))
				p := newPair(b, mtu, size, depth)
				p.stream(b, rxego.WRWrite, size, depth)
			})
		}
	}
}

func BenchmarkRCRead(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("mtu4096/%dKiB", size>>10), func(b *testing.B) {
			depth := 16
			p := newPair(b, rxego.MTU4096, size, depth)
			p.stream(b, rxego.WRRead, size, depth)
		})
	}
}

// cpuMeter measures the process's CPU time (user and system, both devices
// together) over a benchmark: steadier than wall time on a shared machine.
type cpuMeter struct{ start time.Duration }

func cpuNow() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU() cpuMeter { return cpuMeter{cpuNow()} }

// report adds cpu-ns/op and, for byte counts, Gbit/s per CPU second.
func (m cpuMeter) report(b *testing.B, bytesPerOp int64) {
	used := cpuNow() - m.start
	b.ReportMetric(float64(used.Nanoseconds())/float64(b.N), "cpu-ns/op")
	if bytesPerOp > 0 && used > 0 {
		b.ReportMetric(float64(bytesPerOp*int64(b.N))*8/used.Seconds()/1e9, "Gbit/cpu-s")
	}
}

// BenchmarkWriteRate posts 64-byte inline WRITEs, 32 per PostSend with the
// last signaled, keeping 128 in flight: the message-rate case.
func BenchmarkWriteRate(b *testing.B) {
	const batch, depth = 32, 128
	p := newPair(b, rxego.MTU1024, 4096, depth)
	wrs := make([]rxego.SendWR, batch)
	for i := range wrs {
		wrs[i] = rxego.SendWR{Opcode: rxego.WRWrite, Flags: rxego.SendInline, Inline: make([]byte, 64),
			RemoteAddr: p.mrs[1].IOVA(), RKey: p.mrs[1].RKey()}
	}
	wrs[batch-1].Flags |= rxego.SendSignaled
	wcs := make([]rxego.WC, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b.ResetTimer()
	cpu := startCPU()
	defer cpu.report(b, 0)
	inflight := 0
	for done := 0; done < b.N; {
		for inflight+batch <= depth {
			if err := p.qps[0].PostSend(wrs...); err != nil {
				b.Fatal(err)
			}
			inflight += batch
		}
		n, err := p.cqs[0].PollWait(ctx, wcs)
		if err != nil {
			b.Fatal(err)
		}
		inflight -= n * batch
		done += n * batch
	}
}
