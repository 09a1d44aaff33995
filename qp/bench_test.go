package qp

import "testing"

// Engine-only benchmarks: two engines joined by an in-memory wire that
// copies each packet once (a stand-in for the kernel's copy), no sockets
// and no ICRC. Each op posts one work request on a, carries its packets
// to b and the answers back, and polls the completion: the engines' own
// cost per message, both sides together.

func benchEngine(b *testing.B, mtu MTU, wr func(p *allocPair) SendWR, size int) {
	t := &testing.T{}
	p := newAllocPair(t, mtu)
	w := wr(p)
	wcs := make([]WC, 4)
	p.round(t, w, wcs)
	if size > 0 {
		b.SetBytes(int64(size))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		p.round(t, w, wcs)
	}
}

func BenchmarkEngineWrite64KiB(b *testing.B) {
	benchEngine(b, MTU4096, func(p *allocPair) SendWR {
		return SendWR{Opcode: WRWrite, Flags: SendSignaled, SGL: sge(p.amr, 0, 64<<10), RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()}
	}, 64<<10)
}

func BenchmarkEngineWrite64KiBMTU1024(b *testing.B) {
	benchEngine(b, MTU1024, func(p *allocPair) SendWR {
		return SendWR{Opcode: WRWrite, Flags: SendSignaled, SGL: sge(p.amr, 0, 64<<10), RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()}
	}, 64<<10)
}

func BenchmarkEngineWrite64B(b *testing.B) {
	benchEngine(b, MTU1024, func(p *allocPair) SendWR {
		return SendWR{Opcode: WRWrite, Flags: SendSignaled | SendInline, Inline: make([]byte, 64), RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()}
	}, 64)
}

func BenchmarkEngineRead64KiB(b *testing.B) {
	benchEngine(b, MTU4096, func(p *allocPair) SendWR {
		return SendWR{Opcode: WRRead, Flags: SendSignaled, SGL: sge(p.amr, 0, 64<<10), RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()}
	}, 64<<10)
}

func BenchmarkEngineFetchAdd(b *testing.B) {
	benchEngine(b, MTU1024, func(p *allocPair) SendWR {
		return SendWR{Opcode: WRFetchAdd, Flags: SendSignaled, SGL: sge(p.amr, aligned8(p.amr, 0), 8),
			RemoteAddr: p.bmr.IOVA() + uint64(aligned8(p.bmr, 0)), RKey: p.bmr.RKey(), CompareAdd: 1}
	}, 0)
}

// BenchmarkEngineWrite64BList is the message-rate case's shape: a post
// list of 32 inline 64-byte WRITEs, the last signaled, carried across and
// acknowledged; reported per message.
func BenchmarkEngineWrite64BList(b *testing.B) {
	t := &testing.T{}
	p := newAllocPair(t, MTU1024)
	list := make([]SendWR, 32)
	for i := range list {
		list[i] = SendWR{Opcode: WRWrite, Flags: SendInline, Inline: make([]byte, 64), RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()}
	}
	list[len(list)-1].Flags |= SendSignaled
	wcs := make([]WC, 4)
	round := func() {
		if err := p.a.qp.PostSend(list...); err != nil {
			b.Fatal(err)
		}
		p.exchange(t)
		if n := p.a.scq.Poll(wcs); n != 1 || wcs[0].Status != WCSuccess {
			b.Fatalf("completions %d %v", n, wcs[:n])
		}
	}
	round()
	b.SetBytes(64 * int64(len(list)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		round()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(list)), "ns/msg")
}
