package dcqcn

import (
	"bufio"
	"fmt"
	"io"
	"sync"
	"time"
)

// FlowSample is one flow's state at a sample instant.
type FlowSample struct {
	Rcvd   uint64  // bytes completed at the receiver since the flow started
	Rate   uint64  // reaction point current rate RC, bits/s
	Target uint64  // reaction point target rate RT, bits/s
	Alpha  float64 // reaction point alpha
	CNPs   uint64  // CNPs the sender QP handled
}

// Sample is every flow's state at one instant; flows not started yet are
// missing from the end of Flows.
type Sample struct {
	At    time.Duration // since the recorder started
	Flows []FlowSample
}

// Recorder samples the testbed's flows periodically.
type Recorder struct {
	tb    *Testbed
	start time.Time
	stop  chan struct{}
	done  chan struct{}

	mu      sync.Mutex
	samples []Sample
}

// maxSamples bounds a recording (10 minutes at 5 ms).
const maxSamples = 120_000

// Record starts sampling every period until Stop.
func (tb *Testbed) Record(period time.Duration) *Recorder {
	r := &Recorder{tb: tb, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		t := time.NewTicker(period)
		defer t.Stop()
		r.sample()
		for {
			select {
			case <-r.stop:
				r.sample()
				return
			case <-t.C:
				r.sample()
			}
		}
	}()
	return r
}

func (r *Recorder) sample() {
	s := Sample{At: time.Since(r.start)}
	for _, f := range r.tb.Flows() {
		fs := FlowSample{Rcvd: f.Received()}
		if st, ok := f.Send.CongestionStats(); ok {
			fs.Rate, fs.Target, fs.Alpha, fs.CNPs = st.Rate, st.Target, st.Alpha, st.CNPsRcvd
		}
		s.Flows = append(s.Flows, fs)
	}
	r.mu.Lock()
	if len(r.samples) < maxSamples {
		r.samples = append(r.samples, s)
	}
	r.mu.Unlock()
}

// Now returns the time since the recorder started, on the samples' clock.
func (r *Recorder) Now() time.Duration { return time.Since(r.start) }

// Stop ends the recording and returns the samples.
func (r *Recorder) Stop() []Sample {
	close(r.stop)
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.samples
}

// Throughput returns each flow's delivered rate in bits/s between the
// first sample at or after from and the last one at or before to; flows
// absent at from count from 0 bytes. It returns nil without two such
// samples.
func Throughput(samples []Sample, from, to time.Duration) []float64 {
	i, j := -1, -1
	for k, s := range samples {
		if i < 0 && s.At >= from {
			i = k
		}
		if s.At <= to {
			j = k
		}
	}
	if i < 0 || j <= i {
		return nil
	}
	a, b := samples[i], samples[j]
	secs := (b.At - a.At).Seconds()
	out := make([]float64, len(b.Flows))
	for f := range out {
		var before uint64
		if f < len(a.Flows) {
			before = a.Flows[f].Rcvd
		}
		out[f] = float64(b.Flows[f].Rcvd-before) * 8 / secs
	}
	return out
}

// WriteCSV writes the samples in long form, one row per flow and sample:
// t_ms, flow, rx_mbps (delivered rate over the window ending at the
// sample), rate_mbps, target_mbps, alpha, cnps. The header names the
// run. The rx_mbps window is the shortest span of samples at least window
// long, so the delivered rate is not quantised by message completions.
func WriteCSV(w io.Writer, samples []Sample, window time.Duration) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintln(bw, "t_ms,flow,rx_mbps,rate_mbps,target_mbps,alpha,cnps")
	lo := 0
	for i, s := range samples {
		for lo < i && s.At-samples[lo+1].At >= window {
			lo++
		}
		for f, fs := range s.Flows {
			rx := 0.0
			if lo < i && s.At > samples[lo].At {
				var before uint64
				if f < len(samples[lo].Flows) {
					before = samples[lo].Flows[f].Rcvd
				}
				rx = float64(fs.Rcvd-before) * 8 / (s.At - samples[lo].At).Seconds() / 1e6
			}
			fmt.Fprintf(bw, "%.3f,%d,%.2f,%.2f,%.2f,%.5f,%d\n", float64(s.At)/1e6, f, rx,
				float64(fs.Rate)/1e6, float64(fs.Target)/1e6, fs.Alpha, fs.CNPs)
		}
	}
	return bw.Flush()
}
