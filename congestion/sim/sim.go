// Package sim runs DCQCN senders that share one bottleneck link, on virtual
// time, and records how their rates, alphas and throughputs evolve. It is a
// test bed for the algorithm (no network, no clock, deterministic for a
// seed) and the source of the data behind the DCQCN plots in the docs.
//
// The model: each flow is a backlogged sender with its own
// congestion.DCQCN controller and congestion.Pacer, sending fixed-size
// packets no faster than its line rate. All packets enter one FIFO queue
// drained at Capacity; the queue marks CE with RED (no mark up to Kmin
// bytes, probability rising linearly to Pmax at Kmax, every packet beyond
// Kmax) and never drops. A packet reaches its receiver Delay after leaving
// the queue; the receiver's congestion.NP turns marks into CNPs, which
// reach the sender Delay later.
package sim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/rxego/rxego/congestion"
)

// Flow is one sender.
type Flow struct {
	// Start is when the flow starts sending; it then stays backlogged
	// until the end of the run.
	Start time.Duration
}

// Config describes a run.
type Config struct {
	Capacity   uint64              // bottleneck rate, bits/s
	RP         congestion.Params   // every sender's reaction point
	NP         congestion.NPParams // every receiver's notification point
	Flows      []Flow              // 1 to MaxFlows senders
	PacketSize int                 // bytes per packet
	Burst      int                 // pacer burst, bytes
	Kmin, Kmax int                 // RED thresholds, bytes
	Pmax       float64             // RED marking probability at Kmax
	// MarkAtDequeue decides marks on the queue a packet sees when it
	// leaves rather than when it arrives, which shortens the feedback
	// loop by the queueing delay.
	MarkAtDequeue bool
	Delay         time.Duration // one-way propagation delay
	Duration      time.Duration // virtual time simulated
	SampleEvery   time.Duration // time between samples
	Seed          uint64        // seed of the RED marking decisions
}

// Limits on a run, so that a bad config fails instead of running forever.
const (
	MaxFlows   = 64
	MaxSamples = 1 << 20
	maxEvents  = 1 << 28
)

// Sample is the state of every flow at one instant. Flows that have not
// started yet report zero rates.
type Sample struct {
	At        time.Duration
	Queue     int       // bytes in the bottleneck queue
	Rate      []uint64  // controller current rate RC per flow, bits/s
	Target    []uint64  // controller target rate RT per flow, bits/s
	Alpha     []float64 // controller alpha per flow
	Delivered []uint64  // bytes delivered per flow since the start
}

// Result is the outcome of a run.
type Result struct {
	Samples []Sample // at 0, SampleEvery, 2*SampleEvery, ... <= Duration
	CNPs    []uint64 // CNPs sent per flow
	Stats   []congestion.Stats
}

// Throughput returns each flow's delivery rate in bits/s between the first
// sample at or after from and the last sample at or before to, or nil if
// there are not two such samples.
func (r *Result) Throughput(from, to time.Duration) []float64 {
	i, j := -1, -1
	for k, s := range r.Samples {
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
	a, b := r.Samples[i], r.Samples[j]
	secs := (b.At - a.At).Seconds()
	out := make([]float64, len(a.Delivered))
	for f := range out {
		out[f] = float64(b.Delivered[f]-a.Delivered[f]) * 8 / secs
	}
	return out
}

func (c *Config) validate() error {
	switch {
	case c.Capacity == 0:
		return errors.New("sim: Capacity must be > 0")
	case len(c.Flows) == 0 || len(c.Flows) > MaxFlows:
		return fmt.Errorf("sim: %d flows, want 1..%d", len(c.Flows), MaxFlows)
	case c.PacketSize <= 0:
		return errors.New("sim: PacketSize must be > 0")
	case c.Kmin < 0 || c.Kmax < c.Kmin:
		return fmt.Errorf("sim: RED thresholds Kmin %d Kmax %d, want 0 <= Kmin <= Kmax", c.Kmin, c.Kmax)
	case !(c.Pmax >= 0 && c.Pmax <= 1):
		return fmt.Errorf("sim: Pmax %v must be in [0, 1]", c.Pmax)
	case c.Delay < 0:
		return errors.New("sim: Delay must be >= 0")
	case c.Duration <= 0 || c.SampleEvery <= 0:
		return errors.New("sim: Duration and SampleEvery must be > 0")
	case c.Duration/c.SampleEvery >= MaxSamples:
		return fmt.Errorf("sim: more than %d samples", MaxSamples)
	}
	for i, f := range c.Flows {
		if f.Start < 0 || f.Start >= c.Duration {
			return fmt.Errorf("sim: flow %d starts at %v, outside [0, %v)", i, f.Start, c.Duration)
		}
	}
	if err := c.RP.Validate(); err != nil {
		return err
	}
	return c.NP.Validate()
}

type sender struct {
	ctrl      *congestion.DCQCN
	pacer     congestion.Pacer
	np        congestion.NP
	started   bool
	delivered uint64
	cnps      uint64
}

// run is the state of one simulation.
type run struct {
	cfg     Config
	rng     *rand.Rand
	events  eventHeap
	flows   []sender
	queue   float64 // bytes
	queueAt time.Duration
	serial  time.Duration // one packet at the senders' line rate
	res     Result
}

// Run simulates cfg and returns its samples.
func Run(cfg Config) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &run{
		cfg:    cfg,
		rng:    rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		flows:  make([]sender, len(cfg.Flows)),
		serial: max(time.Duration(uint64(cfg.PacketSize)*8*uint64(time.Second)/cfg.RP.LineRate), 1),
	}
	for i, f := range cfg.Flows {
		ctrl, err := congestion.NewDCQCN(cfg.RP)
		if err != nil {
			return nil, err
		}
		r.flows[i] = sender{
			ctrl:  ctrl,
			pacer: congestion.NewPacer(cfg.RP.LineRate, cfg.Burst),
			np:    congestion.NewNP(cfg.NP.MinTimeBetweenCNPs),
		}
		r.events.push(event{at: f.Start, kind: evSend, flow: i})
	}
	r.events.push(event{at: 0, kind: evSample})
	for n := 0; r.events.len() > 0; n++ {
		if n == maxEvents {
			return nil, fmt.Errorf("sim: more than %d events", maxEvents)
		}
		ev := r.events.pop()
		if ev.at > cfg.Duration {
			break
		}
		r.handle(ev)
	}
	r.res.CNPs = make([]uint64, len(r.flows))
	r.res.Stats = make([]congestion.Stats, len(r.flows))
	for i := range r.flows {
		r.res.CNPs[i] = r.flows[i].cnps
		r.res.Stats[i] = r.flows[i].ctrl.Stats()
	}
	return &r.res, nil
}

func (r *run) handle(ev event) {
	s := &r.flows[ev.flow]
	switch ev.kind {
	case evSend:
		s.started = true
		r.send(s, ev)
	case evDequeue, evDequeueCE:
		kind := evDeliver
		if ev.kind == evDequeueCE || (r.cfg.MarkAtDequeue && r.mark(r.queueLen(ev.at))) {
			kind = evDeliverCE
		}
		r.events.push(event{at: ev.at + r.cfg.Delay, kind: kind, flow: ev.flow})
	case evDeliver, evDeliverCE:
		s.delivered += uint64(r.cfg.PacketSize)
		if ev.kind == evDeliverCE && s.np.OnCE(ev.at) {
			s.cnps++
			r.events.push(event{at: ev.at + r.cfg.Delay, kind: evCNP, flow: ev.flow})
		}
	case evCNP:
		s.ctrl.OnCNP(ev.at)
		s.pacer.SetRate(ev.at, s.ctrl.Rate())
	case evSample:
		r.sample(ev.at)
		r.events.push(event{at: ev.at + r.cfg.SampleEvery, kind: evSample})
	}
}

// send is one attempt of a backlogged sender: the controller's due timers
// run, the pacer decides, and the next attempt is scheduled.
func (r *run) send(s *sender, ev event) {
	now := ev.at
	s.ctrl.Advance(now)
	s.pacer.SetRate(now, s.ctrl.Rate())
	next := now + r.serial
	if ok, wait := s.pacer.Admit(now, r.cfg.PacketSize); ok {
		s.ctrl.OnSent(now, r.cfg.PacketSize)
		s.pacer.SetRate(now, s.ctrl.Rate())
		r.enqueue(now, ev.flow)
	} else {
		next = now + wait
	}
	// Wake up early if a controller timer may raise the rate.
	if at, ok := s.ctrl.NextEvent(); ok && at > now && at < next {
		next = at
	}
	r.events.push(event{at: next, kind: evSend, flow: ev.flow})
}

// enqueue puts a packet into the bottleneck queue, marks it per RED and
// schedules its delivery.
func (r *run) enqueue(now time.Duration, flow int) {
	r.queue, r.queueAt = r.queueLen(now), now
	kind := evDequeue
	if !r.cfg.MarkAtDequeue && r.mark(r.queue) {
		kind = evDequeueCE
	}
	r.queue += float64(r.cfg.PacketSize)
	leave := now + time.Duration(r.queue*8/float64(r.cfg.Capacity)*float64(time.Second))
	r.events.push(event{at: leave, kind: kind, flow: flow})
}

// queueLen returns the bottleneck queue at now (>= r.queueAt), in bytes.
func (r *run) queueLen(now time.Duration) float64 {
	return max(0, r.queue-float64(r.cfg.Capacity)/8*(now-r.queueAt).Seconds())
}

func (r *run) mark(q float64) bool {
	kmin, kmax := float64(r.cfg.Kmin), float64(r.cfg.Kmax)
	switch {
	case q <= kmin:
		return false
	case q >= kmax:
		return true
	}
	return r.rng.Float64() < r.cfg.Pmax*(q-kmin)/(kmax-kmin)
}

func (r *run) sample(now time.Duration) {
	n := len(r.flows)
	s := Sample{
		At: now, Queue: int(r.queueLen(now)),
		Rate: make([]uint64, n), Target: make([]uint64, n),
		Alpha: make([]float64, n), Delivered: make([]uint64, n),
	}
	for i := range r.flows {
		f := &r.flows[i]
		s.Delivered[i] = f.delivered
		if !f.started {
			continue
		}
		f.ctrl.Advance(now)
		st := f.ctrl.Stats()
		s.Rate[i], s.Target[i], s.Alpha[i] = st.Rate, st.Target, st.Alpha
	}
	r.res.Samples = append(r.res.Samples, s)
}

// WriteCSV writes the samples as CSV, one row per sample: t_us, queue_bytes
// and, for each flow i, rate_bps_i, target_bps_i, alpha_i, delivered_bytes_i.
func (r *Result) WriteCSV(w io.Writer) error {
	bw := bufio.NewWriter(w)
	bw.WriteString("t_us,queue_bytes")
	if len(r.Samples) > 0 {
		for i := range r.Samples[0].Rate {
			fmt.Fprintf(bw, ",rate_bps_%d,target_bps_%d,alpha_%d,delivered_bytes_%d", i, i, i, i)
		}
	}
	bw.WriteByte('\n')
	for _, s := range r.Samples {
		fmt.Fprintf(bw, "%s,%d", strconv.FormatFloat(float64(s.At)/float64(time.Microsecond), 'f', -1, 64), s.Queue)
		for i := range s.Rate {
			fmt.Fprintf(bw, ",%d,%d,%s,%d", s.Rate[i], s.Target[i], strconv.FormatFloat(s.Alpha[i], 'g', 6, 64), s.Delivered[i])
		}
		bw.WriteByte('\n')
	}
	return bw.Flush()
}
