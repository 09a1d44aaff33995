package reth_test

import (
	"testing"

	"github.com/rxego/rxego/reth"
)

var sink uint64

// BenchmarkRETHDecode reads every RETH field through the view.
func BenchmarkRETHDecode(b *testing.B) {
	r := reth.RETH(make([]byte, reth.RETHLen))
	r.Set(0x7fe8bf69e000, 0x289, 4096)
	b.ReportAllocs()
	for b.Loop() {
		sink = r.VA() + uint64(r.RKey()) + uint64(r.DMALen())
	}
}

// BenchmarkRETHEncode writes every RETH field through the view.
func BenchmarkRETHEncode(b *testing.B) {
	r := reth.RETH(make([]byte, reth.RETHLen))
	b.ReportAllocs()
	for i := uint64(0); b.Loop(); i++ {
		r.Set(i, uint32(i), 4096)
	}
}

// BenchmarkAETHDecode classifies an AETH syndrome, as a completer does.
func BenchmarkAETHDecode(b *testing.B) {
	a := reth.AETH(make([]byte, reth.AETHLen))
	a.Set(reth.RNRSyndrome(20), 5)
	b.ReportAllocs()
	for b.Loop() {
		s := a.Syndrome()
		sink = uint64(s.Kind()) + uint64(s.Value()) + uint64(a.MSN())
	}
}

// TestZeroAllocs asserts that the views allocate nothing.
func TestZeroAllocs(t *testing.T) {
	buf := make([]byte, reth.AtomicETHLen)
	fns := map[string]func(){
		"RETH": func() {
			r := reth.RETH(buf)
			r.Set(1, 2, 3)
			sink = r.VA() + uint64(r.RKey()+r.DMALen())
		},
		"AETH": func() {
			a := reth.AETH(buf)
			a.Set(reth.NAKSyndrome(reth.NAKRemoteAccess), 9)
			sink = uint64(a.Syndrome().Kind()) + uint64(a.MSN())
		},
		"AtomicETH": func() {
			a := reth.AtomicETH(buf)
			a.Set(1, 2, 3, 4)
			sink = a.VA() + a.SwapAdd() + a.Compare() + uint64(a.RKey())
		},
		"DETH": func() {
			d := reth.DETH(buf)
			d.Set(0x80010000, 1)
			sink = uint64(d.QKey()) + uint64(d.SrcQP())
		},
		"ACK String": func() { sink = uint64(len(reth.ACKSyndrome(31).String())) },
	}
	for name, fn := range fns {
		if a := testing.AllocsPerRun(100, fn); a != 0 {
			t.Errorf("%s: %v allocs per run", name, a)
		}
	}
}
