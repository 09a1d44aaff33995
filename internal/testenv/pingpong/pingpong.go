// Package pingpong drives busy-polled round-trip benchmarks: one side
// sends and spins until the answer is in, the other spins and answers,
// each on a locked OS thread, and the medians are reported. The layers'
// round-trip benchmarks (transport's BenchmarkRoundTrip, bench's) share
// it so that their figures compare.
package pingpong

import (
	"runtime"
	"slices"
	"testing"
	"time"
)

// Run makes b.N round trips: send, then recv until it reports that the
// answer is in, while echo (one poll, and the answer to what it took in)
// spins on another locked OS thread until the round trips end. Besides
// ns/op, which a slow outlier inflates, it reports the median round trip
// (p50-ns) and the median send call (send-p50-ns). A round trip that
// gets no answer within a minute, or an echo that fails, fails the
// benchmark.
func Run(b *testing.B, send func() error, recv func() (bool, error), echo func() error) {
	if runtime.GOMAXPROCS(0) < 2 {
		b.Skip("needs two CPUs: both sides spin")
	}
	stop, echoed := make(chan struct{}), make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for {
			select {
			case <-stop:
				echoed <- nil
				return
			default:
			}
			for range 64 {
				if err := echo(); err != nil {
					echoed <- err
					return
				}
			}
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rts, sends := make([]time.Duration, b.N), make([]time.Duration, b.N)
	deadline := time.Now().Add(time.Minute)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := send(); err != nil {
			close(stop)
			b.Fatal(err)
		}
		sends[i] = time.Since(start)
		for polls := 1; ; polls++ {
			got, err := recv()
			if err != nil {
				close(stop)
				b.Fatal(err)
			}
			if got {
				break
			}
			if polls%1024 != 0 {
				continue
			}
			select {
			case err := <-echoed: // the echo side stopped: no answer will come
				b.Fatalf("round trip %d: the answering side stopped: %v", i, err)
			default:
			}
			if time.Now().After(deadline) {
				close(stop)
				b.Fatalf("round trip %d: no answer within a minute", i)
			}
		}
		rts[i] = time.Since(start)
	}
	b.StopTimer()
	close(stop)
	if err := <-echoed; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(median(rts).Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(median(sends).Nanoseconds()), "send-p50-ns")
}

func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}
