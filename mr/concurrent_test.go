package mr

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

// record is what a registering goroutine tells the lookups about an MR.
type record struct {
	key  uint32
	mr   *MR
	buf  []byte
	dead atomic.Bool // set once Deregister has returned
}

// within reports whether b starts inside buf.
func within(b, buf []byte) bool {
	p := uintptr(unsafe.Pointer(&b[0]))
	start := uintptr(unsafe.Pointer(&buf[0]))
	return p >= start && p < start+uintptr(len(buf))
}

// Lookups run while other goroutines register, deregister, invalidate and
// revalidate. A lookup that starts after Deregister returned must never
// hand out that MR's buffer, and the race detector must stay quiet.
func TestConcurrentLookupsAndRegistration(t *testing.T) {
	const (
		writers, cycles = 2, 1500
		readers, looks  = 4, 20000
		slots           = 16
	)
	tab := NewTable()
	pd := tab.AllocPD()
	// board holds live MRs, graves recently deregistered ones.
	var board, graves [slots]atomic.Pointer[record]

	// One invalidatable MR flips between invalid and valid throughout.
	flipBuf := make([]byte, 64)
	flip := mustRegister(t, pd, flipBuf, rwAll, WithInvalidate())
	var flipKey atomic.Uint32
	flipKey.Store(flip.RKey())
	// The board starts full, so lookups find live MRs even when a loaded
	// machine runs every reader before any writer gets going.
	for i := range board {
		r := &record{buf: make([]byte, 64)}
		m := mustRegister(t, pd, r.buf, LocalWrite|RemoteRead)
		r.key, r.mr = m.RKey(), m
		board[i].Store(r)
	}

	var hits, flipHits atomic.Int64 // successful lookups, to show both paths ran
	var wg sync.WaitGroup
	fail := make(chan string, writers+readers+1)
	for w := range writers {
		wg.Go(func() {
			for i := range cycles {
				r := &record{buf: make([]byte, 64)}
				m, err := pd.Register(r.buf, LocalWrite|RemoteRead)
				if err != nil {
					fail <- "Register: " + err.Error()
					return
				}
				r.key, r.mr = m.RKey(), m
				// Replace an older MR, which then dies while lookups
				// may still be using its record.
				if old := board[(w*cycles+i)%slots].Swap(r); old != nil {
					if err := old.mr.Deregister(); err != nil {
						fail <- "Deregister: " + err.Error()
						return
					}
					old.dead.Store(true)
					graves[i%slots].Store(old)
				}
			}
		})
	}
	wg.Go(func() {
		for range cycles {
			if err := tab.Invalidate(flipKey.Load(), pd); err != nil {
				fail <- "Invalidate: " + err.Error()
				return
			}
			key, err := flip.Revalidate(uint8(flipKey.Load()) + 1)
			if err != nil {
				fail <- "Revalidate: " + err.Error()
				return
			}
			flipKey.Store(key)
		}
	})
	for g := range readers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range looks {
				if rng.IntN(4) == 0 {
					b, err := tab.Remote(flipKey.Load(), pd, flip.IOVA(), 8, RemoteRead)
					if err != nil && err != ErrInvalidated && err != ErrInvalidKey || err == nil && &b[0] != &flipBuf[0] {
						fail <- "flipping MR: unexpected result"
						return
					}
					if err == nil {
						flipHits.Add(1)
					}
					continue
				}
				r := board[rng.IntN(slots)].Load()
				if rng.IntN(2) == 0 {
					r = graves[rng.IntN(slots)].Load()
				}
				if r == nil {
					continue
				}
				dead := r.dead.Load()
				b, err := tab.Remote(r.key, pd, addr(r.buf), 8, RemoteRead)
				switch {
				// A stale key can name the MR now at its index once that
				// index has cycled through all 256 key bytes (8 bits of
				// key, as on an RNIC): then the bounds check refuses it.
				case err != nil && err != ErrInvalidKey && err != ErrOutOfBounds:
					fail <- "unexpected error: " + err.Error()
					return
				case err == nil && dead && within(b, r.buf):
					fail <- "lookup returned a buffer deregistered before it started"
					return
				case err == nil:
					hits.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(fail)
	for msg := range fail {
		t.Fatal(msg)
	}
	if hits.Load() == 0 || flipHits.Load() == 0 {
		t.Errorf("no successful lookups (%d, %d): the test exercised nothing", hits.Load(), flipHits.Load())
	}
	live := 1 // flip
	for i := range board {
		if board[i].Load() != nil {
			live++
		}
	}
	if s := tab.Stats(); s.MRs != live {
		t.Errorf("Stats.MRs = %d after all cycles, want %d", s.MRs, live)
	}
}
