package congestion

import (
	"math"
	"math/bits"
	"time"
)

// DefaultBurst is the default pacer burst in bytes: enough for a batch of
// 16 4-KiB packets (or 43 standard frames) to leave in one sendmmsg.
const DefaultBurst = 64 << 10

// bitNsFixed is 8e9 (ns per byte at 1 bit/s) in 32.32 fixed point, which
// needs 65 bits; dividing it by a rate gives the pacer's per-byte cost.
var bitNsFixedHi, bitNsFixedLo = bits.Mul64(8e9, 1<<32)

// minPacerRate is the lowest rate a pacer enforces, so the per-byte cost
// always fits its fixed-point representation.
const minPacerRate = 1 * Kbps

// Pacer enforces a rate on one QP without timers: it keeps the virtual time
// at which everything admitted so far would have left at the paced rate
// (a GCRA token bucket) and admits a packet while that time is at most one
// burst ahead of now. It never blocks: a refused packet gets the delay
// after which it will be admitted, and the engine arms its own timer.
//
// At line rate (or with rate 0) the pacer is off and Admit is a single
// comparison. The engine should pass wire bytes, so that the paced rate is
// the rate on the wire. A Pacer is a small value meant to be embedded in
// the engine's QP state.
type Pacer struct {
	lineRate uint64
	burst    uint64
	rate     uint64 // 0: unlimited

	perByte  uint64        // ns per byte in 32.32 fixed point
	burstDur time.Duration // burst bytes at rate
	next     time.Duration // when all admitted bytes have left
	frac     uint32        // sub-ns part of next, in 1/2^32 ns
}

// NewPacer returns an unlimited pacer for a port of lineRate bits/s and the
// given burst in bytes (negative is treated as 0). A burst lets a batch of
// packets leave back to back; a packet is admitted if the bucket is not
// over burst before it, so one packet more than burst may leave at once.
func NewPacer(lineRate uint64, burst int) Pacer {
	return Pacer{lineRate: lineRate, burst: uint64(max(burst, 0))}
}

// Rate returns the enforced rate in bits/s, 0 when unlimited.
func (p *Pacer) Rate() uint64 { return p.rate }

// SetRate changes the rate at now. A rate of 0 or at least the line rate
// turns pacing off; rates below 1 kb/s are raised to it. Bytes admitted
// but not yet drained are re-timed at the new rate, so a cut takes effect
// on the backlog at once.
func (p *Pacer) SetRate(now time.Duration, bps uint64) {
	if bps == 0 || bps >= p.lineRate {
		p.rate = 0
		return
	}
	bps = max(bps, minPacerRate)
	if bps == p.rate {
		return
	}
	old := p.rate
	if old == 0 || p.next <= now {
		p.next, p.frac = now, 0
	} else {
		hi, lo := bits.Mul64(uint64(p.next-now), old)
		if hi >= bps {
			p.next = math.MaxInt64
		} else {
			backlog, _ := bits.Div64(hi, lo, bps)
			p.next = satAdd(now, time.Duration(min(backlog, math.MaxInt64)))
		}
	}
	p.rate = bps
	p.perByte, _ = bits.Div64(bitNsFixedHi, bitNsFixedLo, bps)
	p.burstDur, _ = p.cost(p.burst)
}

// Admit reports whether a packet of the given size may be sent at now and
// charges it if so; otherwise it returns how long to wait. Sizes <= 0 cost
// nothing.
func (p *Pacer) Admit(now time.Duration, bytes int) (ok bool, wait time.Duration) {
	if p.rate == 0 {
		return true, 0
	}
	return p.admit(now, bytes)
}

func (p *Pacer) admit(now time.Duration, bytes int) (bool, time.Duration) {
	if d := p.next - p.burstDur - now; d > 0 {
		return false, d
	}
	if bytes <= 0 {
		return true, 0
	}
	if p.next < now {
		p.next, p.frac = now, 0
	}
	ns, frac := p.cost(uint64(bytes))
	f, carry := bits.Add32(p.frac, frac, 0)
	p.next = satAdd(p.next, ns+time.Duration(carry))
	p.frac = f
	return true, 0
}

// Delay returns how long from now until a packet would be admitted, 0 if
// one would be now.
func (p *Pacer) Delay(now time.Duration) time.Duration {
	if p.rate == 0 {
		return 0
	}
	return max(p.next-p.burstDur-now, 0)
}

// cost returns the time bytes take at the current rate.
func (p *Pacer) cost(bytes uint64) (time.Duration, uint32) {
	hi, lo := bits.Mul64(bytes, p.perByte)
	if hi >= 1<<31 {
		return math.MaxInt64 / 2, 0
	}
	return time.Duration(hi<<32 | lo>>32), uint32(lo)
}

// satAdd returns a+b for b >= 0, saturating instead of wrapping.
func satAdd(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
