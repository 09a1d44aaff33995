package mr

import (
	"sync"
	"testing"
)

// benchTable registers n MRs and returns one in the middle.
func benchTable(b *testing.B, n int) (*Table, *PD, *MR) {
	tab := NewTable()
	pd := tab.AllocPD()
	var mid *MR
	for i := range n {
		m := mustRegister(b, pd, make([]byte, 4096), rwAll)
		if i == n/2 {
			mid = m
		}
	}
	return tab, pd, mid
}

func BenchmarkRemote(b *testing.B) {
	tab, pd, m := benchTable(b, 10000)
	key, va := m.RKey(), m.IOVA()+128
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tab.Remote(key, pd, va, 1024, RemoteWrite); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLocal(b *testing.B) {
	tab, pd, m := benchTable(b, 10000)
	key, va := m.LKey(), m.IOVA()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tab.Local(key, pd, va, 4096, LocalWrite); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRemoteRefused(b *testing.B) {
	tab, pd, m := benchTable(b, 10000)
	key, va := m.RKey()^1, m.IOVA()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tab.Remote(key, pd, va, 8, RemoteRead); err != ErrInvalidKey {
			b.Fatal(err)
		}
	}
}

// BenchmarkRemoteParallel runs lookups on every P, as 1-4 engine
// goroutines would, with and without registration churn on the side.
func BenchmarkRemoteParallel(b *testing.B) {
	for _, churn := range []bool{false, true} {
		name := "quiet"
		if churn {
			name = "churn"
		}
		b.Run(name, func(b *testing.B) {
			tab, pd, m := benchTable(b, 10000)
			key, va := m.RKey(), m.IOVA()+128
			stop := make(chan struct{})
			var wg sync.WaitGroup
			if churn {
				wg.Go(func() { churnUntil(stop, pd) })
			}
			b.ReportAllocs()
			b.RunParallel(func(p *testing.PB) {
				for p.Next() {
					if _, err := tab.Remote(key, pd, va, 1024, RemoteWrite); err != nil {
						b.Error(err)
						return
					}
				}
			})
			close(stop)
			wg.Wait()
		})
	}
}

// churnUntil registers and deregisters MRs until stop is closed.
func churnUntil(stop <-chan struct{}, pd *PD) {
	buf := make([]byte, 64)
	for {
		select {
		case <-stop:
			return
		default:
		}
		m, err := pd.Register(buf, RemoteRead)
		if err != nil {
			return
		}
		_ = m.Deregister()
	}
}

func BenchmarkAtomicFetchAdd(b *testing.B) {
	tab, pd, m := benchTable(b, 100)
	key, va := m.RKey(), m.IOVA()+64
	b.ReportAllocs()
	for b.Loop() {
		w, err := tab.Atomic64(key, pd, va, RemoteAtomic)
		if err != nil {
			b.Fatal(err)
		}
		w.FetchAdd(1)
	}
}

func BenchmarkRegisterDeregister(b *testing.B) {
	_, pd, _ := benchTable(b, 10000)
	buf := make([]byte, 4096)
	b.ReportAllocs()
	for b.Loop() {
		m, err := pd.Register(buf, rwAll)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Deregister(); err != nil {
			b.Fatal(err)
		}
	}
}
