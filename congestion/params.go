package congestion

import (
	"errors"
	"fmt"
	"time"
)

// Rate units, in bits per second.
const (
	Kbps uint64 = 1000
	Mbps uint64 = 1000 * Kbps
	Gbps uint64 = 1000 * Mbps
)

// Params configures the DCQCN reaction point of one QP. Rates are in bits
// per second, byte counts in bytes, times in time.Duration. The NVIDIA name
// of each field is given in brackets; see the package documentation for how
// each NVIDIA value maps onto a field.
type Params struct {
	// LineRate is the rate of an uncongested QP and the cap of every
	// increase [port speed; rpg_max_rate 0 means "line rate"].
	LineRate uint64
	// MinRate is the floor below which a cut never goes [rpg_min_rate].
	MinRate uint64
	// AIRate is R_AI, added to the target rate per additive-increase
	// event [rpg_ai_rate].
	AIRate uint64
	// HAIRate is R_HAI, added i times to the target rate per
	// hyper-increase event [rpg_hai_rate].
	HAIRate uint64
	// TimeReset is the rate-increase timer period; 0 disables the timer
	// [rpg_time_reset].
	TimeReset time.Duration
	// ByteReset is the number of bytes sent per byte-counter event; 0
	// disables the byte counter [rpg_byte_reset].
	ByteReset uint64
	// Threshold is F, the number of fast-recovery events before additive
	// increase starts [rpg_threshold].
	Threshold uint32
	// G is the alpha gain g in (0, 1] [dce_tcp_g: G = (1024-dce_tcp_g)/1024].
	G float64
	// AlphaPeriod is the alpha update period [dce_tcp_rtt]; K in the paper.
	AlphaPeriod time.Duration
	// InitialAlpha is the alpha set by the first CNP of the QP, in [0, 1]
	// [initial_alpha_value / 1024].
	InitialAlpha float64
	// AlphaOnCNP selects the paper's alpha rule (alpha rises at each cut and
	// decays after each AlphaPeriod without one) instead of NVIDIA's
	// (alpha is updated once per AlphaPeriod, rising if a CNP arrived in
	// that period).
	AlphaOnCNP bool
	// RateReduceMonitorPeriod is the minimum time between two cuts; CNPs
	// inside it are coalesced into one cut at its end
	// [rate_reduce_monitor_period].
	RateReduceMonitorPeriod time.Duration
	// GD sets the cut to RC*(1 - alpha/2^(GD-10)); 11 gives the paper's
	// alpha/2. Valid range 10..31 [rpg_gd].
	GD uint8
	// MinDecreaseFactor bounds one cut: the new rate is at least this
	// percentage of the old one; 0 disables the bound [rpg_min_dec_fac].
	MinDecreaseFactor uint8
	// RateOnFirstCNP, if not 0, replaces the first cut: current and target
	// rate are set to it [rate_to_set_on_first_cnp].
	RateOnFirstCNP uint64
	// ClampTargetRate makes every cut set the target rate to the current
	// rate first, as in the paper [clamp_tgt_rate]. Without it a cut sets
	// the target rate only if the byte counter raised the rate since the
	// previous cut.
	ClampTargetRate bool
	// ClampTargetRateAfterTimeInc, when ClampTargetRate is off, also sets
	// the target rate at a cut if the timer raised the rate since the
	// previous cut [clamp_tgt_rate_after_time_inc].
	ClampTargetRateAfterTimeInc bool
}

// NVIDIAParams returns the ConnectX defaults (firmware NV_CONFIG defaults,
// see the package documentation for sources) for a port of lineRate bits/s.
func NVIDIAParams(lineRate uint64) Params {
	return Params{
		LineRate:                    lineRate,
		MinRate:                     1 * Mbps,
		AIRate:                      5 * Mbps,
		HAIRate:                     50 * Mbps,
		TimeReset:                   300 * time.Microsecond,
		ByteReset:                   32767,
		Threshold:                   1,
		G:                           float64(1024-1019) / 1024,
		AlphaPeriod:                 1 * time.Microsecond,
		InitialAlpha:                1023.0 / 1024,
		RateReduceMonitorPeriod:     4 * time.Microsecond,
		GD:                          11,
		MinDecreaseFactor:           50,
		ClampTargetRateAfterTimeInc: true,
	}
}

// PaperParams returns the parameters of the DCQCN paper (Zhu et al.,
// "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015) as
// used by its authors' simulator, for a port of lineRate bits/s. MinRate is
// not from the paper (it has none); it is NVIDIA's 1 Mb/s.
func PaperParams(lineRate uint64) Params {
	return Params{
		LineRate:        lineRate,
		MinRate:         1 * Mbps,
		AIRate:          40 * Mbps,
		HAIRate:         200 * Mbps,
		TimeReset:       55 * time.Microsecond,
		ByteReset:       10_000_000,
		Threshold:       5,
		G:               1.0 / 256,
		AlphaPeriod:     55 * time.Microsecond,
		InitialAlpha:    1,
		AlphaOnCNP:      true,
		GD:              11,
		ClampTargetRate: true,
	}
}

// Validate reports the first field that is out of range.
func (p Params) Validate() error {
	switch {
	case p.LineRate == 0:
		return errors.New("congestion: LineRate must be > 0")
	case p.MinRate == 0 || p.MinRate > p.LineRate:
		return fmt.Errorf("congestion: MinRate %d must be in [1, LineRate %d]", p.MinRate, p.LineRate)
	case p.TimeReset < 0:
		return fmt.Errorf("congestion: TimeReset %v must be >= 0", p.TimeReset)
	case p.TimeReset == 0 && p.ByteReset == 0:
		return errors.New("congestion: TimeReset and ByteReset cannot both be 0 (the rate could never increase)")
	case !(p.G > 0 && p.G <= 1):
		return fmt.Errorf("congestion: G %v must be in (0, 1]", p.G)
	case p.AlphaPeriod <= 0:
		return fmt.Errorf("congestion: AlphaPeriod %v must be > 0", p.AlphaPeriod)
	case !(p.InitialAlpha >= 0 && p.InitialAlpha <= 1):
		return fmt.Errorf("congestion: InitialAlpha %v must be in [0, 1]", p.InitialAlpha)
	case p.RateReduceMonitorPeriod < 0:
		return fmt.Errorf("congestion: RateReduceMonitorPeriod %v must be >= 0", p.RateReduceMonitorPeriod)
	case p.GD < 10 || p.GD > 31:
		return fmt.Errorf("congestion: GD %d must be in [10, 31]", p.GD)
	case p.MinDecreaseFactor > 100:
		return fmt.Errorf("congestion: MinDecreaseFactor %d must be <= 100", p.MinDecreaseFactor)
	case p.RateOnFirstCNP > p.LineRate:
		return fmt.Errorf("congestion: RateOnFirstCNP %d must be <= LineRate %d", p.RateOnFirstCNP, p.LineRate)
	case p.AIRate > p.LineRate || p.HAIRate > p.LineRate:
		return fmt.Errorf("congestion: AIRate %d and HAIRate %d must be <= LineRate %d", p.AIRate, p.HAIRate, p.LineRate)
	}
	return nil
}

// NPParams configures the notification point (the receiver side).
type NPParams struct {
	// MinTimeBetweenCNPs is the minimum gap between two CNPs sent for one
	// QP [min_time_between_cnps]; N in the paper.
	MinTimeBetweenCNPs time.Duration
	// CNPDSCP is the DSCP the engine puts on CNPs [cnp_dscp].
	CNPDSCP uint8
	// CNPPriority is the 802.1p priority of CNPs on VLAN ports
	// [cnp_802p_prio]; kept for completeness, UDP sockets cannot set it.
	CNPPriority uint8
}

// NVIDIANPParams returns the ConnectX notification-point defaults.
func NVIDIANPParams() NPParams {
	return NPParams{MinTimeBetweenCNPs: 4 * time.Microsecond, CNPDSCP: 48, CNPPriority: 6}
}

// PaperNPParams returns the paper's notification point: one CNP per 50 us
// per flow. The paper does not fix a DSCP; NVIDIA's is used.
func PaperNPParams() NPParams {
	return NPParams{MinTimeBetweenCNPs: 50 * time.Microsecond, CNPDSCP: 48, CNPPriority: 6}
}

// Validate reports the first field that is out of range.
func (p NPParams) Validate() error {
	switch {
	case p.MinTimeBetweenCNPs < 0:
		return fmt.Errorf("congestion: MinTimeBetweenCNPs %v must be >= 0", p.MinTimeBetweenCNPs)
	case p.CNPDSCP > 63:
		return fmt.Errorf("congestion: CNPDSCP %d must be < 64", p.CNPDSCP)
	case p.CNPPriority > 7:
		return fmt.Errorf("congestion: CNPPriority %d must be < 8", p.CNPPriority)
	}
	return nil
}
