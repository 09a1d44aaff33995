package dcqcn

import (
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/congestion"
)

// LineRate is the reaction point's line rate in these runs: above what
// rxego reaches over veth on a small machine (one to a few Gbit/s), so an
// uncongested flow is never held back by its pacer, and a round port
// speed.
const LineRate = 10 * congestion.Gbps

// MarkerParams returns the DCQCN configuration the end-to-end runs use, for
// a port of lineRate bits/s: the paper's algorithm (alpha rises at each cut
// and decays every K without one; every cut sets RT = RC) with its time
// constants stretched from a NIC's loop to a software one, and its
// increase steps scaled to a 200 Mbit/s bottleneck. See docs/dcqcn.md.
//
// The paper's three clocks are about equal: a CNP at most every N = 50 us,
// alpha decaying every K = 55 us, the rate rising every T = 55 us. So each
// CNP reflects the last cut, alpha falls by one step per quiet interval,
// and five fast-recovery steps (F = 5) outlast a few CNP intervals, so a
// lasting congestion cuts again before the rate is back. The same
// proportions at the pace of a software loop, where a CNP is one receive
// batch and an engine wake-up away and CNPs come milliseconds apart:
//
//   - N = K = T = 2 ms. With NVIDIA's 1 us alpha period (and N = 4 us) alpha
//     decays to nothing between two CNPs and the cuts vanish: the flow
//     stays at line rate with most of its packets marked (the
//     TestNVIDIADefaultsWithTokenBucket run).
//   - g = 1/16: alpha settles near 0.2 to 0.4 under marking (cuts of 10 to
//     20 %) and decays within tens of milliseconds once marks stop.
//   - R_AI = 2 Mb/s per 2 ms, 1 % of the bottleneck per step: a token
//     bucket marks every packet above its rate, so it punishes overshoot at
//     once, and the overshoot in one loop delay is R_AI per T times the
//     delay.
//   - The byte counter counts 1 MB (40 ms at 200 Mb/s): under marking the
//     cuts, milliseconds apart, reset it before it fires, so there is no
//     hyper increase; once marking stops the counter and the timer pass F
//     and hyper increase (R_HAI = 50 Mb/s) brings the flow back to line
//     rate within a second instead of the many seconds additive steps alone
//     would take.
func MarkerParams(lineRate uint64) rxego.CongestionConfig {
	p := congestion.PaperParams(lineRate)
	p.AlphaPeriod = 2 * time.Millisecond
	p.TimeReset = 2 * time.Millisecond
	p.ByteReset = 1_000_000
	p.G = 1.0 / 16
	p.AIRate = 2 * congestion.Mbps
	p.HAIRate = 50 * congestion.Mbps
	p.Threshold = 5
	np := congestion.PaperNPParams()
	np.MinTimeBetweenCNPs = 2 * time.Millisecond
	return rxego.CongestionConfig{RP: p, NP: np}
}
