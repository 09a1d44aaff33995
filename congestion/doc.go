// Package congestion implements DCQCN for RoCEv2 queue pairs: the reaction
// point (the sender's rate controller, behind the small Controller
// interface so that other algorithms can be added), the notification point
// (the receiver's CNP rate limiter) and a per-QP rate pacer.
//
// # Time, units and threading
//
// Everything here is a passive, deterministic, single-goroutine state
// machine: no goroutines, no timers, no clock reads, no allocation on the
// hot paths. Time is a time.Duration since an epoch chosen by the engine
// (its monotonic clock, or virtual time in tests); a call with a time
// earlier than one already seen is treated as the latest time seen. Rates
// are uint64 bits per second (see Mbps, Gbps), sizes are bytes.
//
// # How the engine drives it
//
// Per QP the engine keeps a Controller (NewDCQCN(params), or NewNone when
// DCQCN is off), a Pacer (NewPacer(lineRate, DefaultBurst)) and an NP
// (NewNP(np.MinTimeBetweenCNPs)); Pacer and NP are values to embed.
//
//   - A CNP (BTH opcode 0x81) arrives for the QP: ctrl.OnCNP(now), then
//     pacer.SetRate(now, ctrl.Rate()).
//   - Before sending: ctrl.Advance(now); pacer.SetRate(now, ctrl.Rate())
//     (free when unchanged); then per packet ok, wait :=
//     pacer.Admit(now, wireBytes). If ok, send it and call
//     ctrl.OnSent(now, wireBytes); if not, stop and wake the QP after wait.
//   - Timers: ctrl.NextEvent() tells when the rate next changes by itself
//     (a rate-increase timer or a deferred cut). The engine puts it in its
//     timer heap/wheel and calls Advance then. Advance also catches up on
//     everything missed, in order, so an engine may skip the timers of
//     QPs with nothing to send and just call Advance before it sends.
//     At line rate NextEvent reports nothing: idle QPs cost nothing.
//   - A data packet arrives with ECN CE: if np.OnCE(now), send a CNP to
//     the requester with DSCP NPParams.CNPDSCP.
//
// # Reaction point (DCQCN, Zhu et al., SIGCOMM 2015, as NICs implement it)
//
// State: current rate RC, target rate RT, alpha, the counts T (timer
// events) and BC (byte-counter events) since the last cut. A new QP has
// RC = RT = line rate and no timers.
//
// Cut. The first CNP sets alpha = InitialAlpha (or, if RateOnFirstCNP is
// set, sets RC = RT = RateOnFirstCNP instead of cutting). A CNP cuts at
// once if RateReduceMonitorPeriod has passed since the last cut; otherwise
// it is coalesced into one cut at the end of that period. A cut does:
//
//	RT = RC                      (always with ClampTargetRate; otherwise only
//	                              if the rate was raised since the last cut,
//	                              see the clamp fields of Params)
//	RC = RC * (1 - alpha / 2^(GD-10))   (GD = 11: RC * (1 - alpha/2))
//	RC = max(RC, RC_old * MinDecreaseFactor/100, MinRate)
//	T = BC = 0, byte counter = 0, timer restarts: next event TimeReset later
//
// Alpha, NVIDIA rule (default): at the end of every AlphaPeriod after the
// first CNP, alpha = (1-g)*alpha + g if a CNP arrived in that period, else
// alpha = (1-g)*alpha. Paper rule (AlphaOnCNP): each cut is followed by
// alpha = (1-g)*alpha + g, and every AlphaPeriod without a cut decays
// alpha = (1-g)*alpha. Alpha only matters at a cut, so it is computed
// lazily at cuts and in Stats; it never needs a timer.
//
// Increase. Every TimeReset the timer fires (T++); every ByteReset bytes
// sent the byte counter fires (BC++). Each event, with F = Threshold:
//
//	max(T, BC) <= F:  fast recovery    RC = (RT + RC) / 2
//	min(T, BC) >  F:  hyper increase   RT += i * HAIRate, i = min(T, BC) - F;
//	                                   RC = (RT + RC) / 2
//	otherwise:        additive         RT += AIRate; RC = (RT + RC) / 2
//
// RT is capped at the line rate and the average rounds up, so RC reaches
// RT exactly. So F events of fast recovery come first; additive increase
// runs while one counter is past F; hyper increase needs both. A disabled
// counter (0) stays at 0, so with one counter disabled there is no hyper
// increase. Bytes sent at line rate do not count. When RC reaches the line
// rate the timer stops. One call runs at most 65536 increase events; a QP
// that has more due (after about 20 s of silence with NVIDIA's defaults)
// is put back at line rate.
//
// # Notification point
//
// On a CE-marked packet the NP asks for a CNP at once unless it sent one
// for this QP less than MinTimeBetweenCNPs ago. Marks inside the gap are
// counted and dropped, not deferred: under lasting congestion the next mark
// after the gap triggers the next CNP.
//
// # Pacer
//
// A token bucket in GCRA form: the pacer keeps the virtual time at which
// everything admitted so far would have left at the rate, in 1/2^32 ns
// precision (exact long-run rate, any packet size), and admits a packet
// while that time is at most one burst ahead of now. An idle QP regains at
// most one burst. A rate change re-times the bytes not yet drained. At line
// rate the pacer is off and Admit is one comparison.
//
// # Parameters
//
// NVIDIAParams and NVIDIANPParams are the defaults; field [NVIDIA name]
// default, source:
//
//	LineRate                [port speed, rpg_max_rate=0]    caller
//	MinRate                 [rpg_min_rate]            1 Mb/s     (1)(2)
//	AIRate                  [rpg_ai_rate]             5 Mb/s     (2)
//	HAIRate                 [rpg_hai_rate]            50 Mb/s    (2)
//	TimeReset               [rpg_time_reset]          300 us     (2)
//	ByteReset               [rpg_byte_reset]          32767 B    (2)
//	Threshold               [rpg_threshold]           1          (2)
//	G                       [dce_tcp_g]               5/1024     (1)(2)
//	AlphaPeriod             [dce_tcp_rtt]             1 us       (1)(2)
//	InitialAlpha            [initial_alpha_value]     1023/1024  (1)(2)
//	RateReduceMonitorPeriod [rate_reduce_monitor_period]  4 us   (1)(2)
//	GD                      [rpg_gd]                  11         (1)(2)
//	MinDecreaseFactor       [rpg_min_dec_fac]         50 %       (1)(2)
//	RateOnFirstCNP          [rate_to_set_on_first_cnp] 0 (off)   (1)(2)
//	ClampTargetRate         [clamp_tgt_rate]          false      (2)
//	ClampTargetRateAfterTimeInc [clamp_tgt_rate_after_time_inc] true (2)
//	MinTimeBetweenCNPs      [min_time_between_cnps]   4 us       (2)
//	CNPDSCP                 [cnp_dscp]                48         (2)
//	CNPPriority             [cnp_802p_prio]           6          (2)
//
// How the NVIDIA values map:
//   - dce_tcp_g is 1024*(1-g): NVIDIA documents the update as
//     alpha = (dce_tcp_g/1024)*alpha + (1 - dce_tcp_g/1024) with a CNP in
//     the period and alpha = (dce_tcp_g/1024)*alpha without, so 1019 means
//     g = 5/1024, about 1/205. It is not the paper's g = 1/256.
//   - dce_tcp_rtt is the alpha update period in microseconds (1 us), not
//     the paper's K = 55 us.
//   - initial_alpha_value and alpha are fixed point with 10 fraction bits:
//     1023 means 1023/1024. The cut is RC -= RC*alpha_fixed >> rpg_gd, so
//     rpg_gd = 11 is RC*(1 - alpha/2), the paper's formula.
//   - rpg_min_dec_fac = 50 bounds a cut to at least 50 % of the old rate;
//     with rpg_gd = 11 that never binds (alpha <= 1).
//   - rpg_threshold is F: the number of fast-recovery events.
//   - clamp_tgt_rate = 0 and clamp_tgt_rate_after_time_inc = 1: RT is set
//     to RC at a cut only if the rate was raised since the last cut (by the
//     byte counter, or by the timer, which is what the second flag adds).
//     This reading follows the DCQCN authors' ns-3 model of the NIC.
//
// PaperParams and PaperNPParams are the paper's values as used in its
// authors' simulator and in htsim's DCQCN: g = 1/256, alpha timer K =
// 55 us, rate-increase timer 55 us (sources give 50 to 60 us), byte counter
// 10 MB, F = 5, R_AI = 40 Mb/s, R_HAI = 200 Mb/s, a CNP at most every
// N = 50 us, initial alpha 1, RT always clamped, no monitor period.
//
// Sources: (1) NVIDIA DOCA documentation, "DCQCN CC Parameters"
// (networking-docs.nvidia.com/doca/archive/3-4-0/dcqcn-cc-parameters) and
// the earlier Mellanox community page "DCQCN Parameters" (DOC-2790);
// (2) the firmware defaults as reported by mlxconfig on a ConnectX-4 Lx
// (RPG_TIME_RESET 300, RPG_BYTE_RESET 32767, RPG_THRESHOLD 1,
// RPG_AI_RATE 5, RPG_HAI_RATE 50, RPG_GD 11, RPG_MIN_DEC_FAC 50,
// RPG_MIN_RATE 1, RATE_TO_SET_ON_FIRST_CNP 0, DCE_TCP_G 1019,
// DCE_TCP_RTT 1, RATE_REDUCE_MONITOR_PERIOD 4, INITIAL_ALPHA_VALUE 1023,
// MIN_TIME_BETWEEN_CNPS 4, CNP_DSCP 48, CNP_802P_PRIO 6, CLAMP_TGT_RATE 0,
// CLAMP_TGT_RATE_AFTER_TIME_INC 1); the kernel's mlx5 cong.c exposes the
// same names as rp_*/np_* debugfs files.
//
// # Where this differs from a NIC
//
// The firmware is closed; these choices are ours and are documented so
// they can be revisited. The first CNP cuts at once (HPCC's model of the
// NIC waits one monitor period). A CNP outside the monitor period cuts at
// once instead of at the next period tick. In hyper increase the QCN
// standard also halves the timer and byte-counter periods; that is not
// done. QCN's "divide RT by 8 when
// RT > 10*RC on the first increase" is not done. The NP does not defer a
// CNP to the end of its gap as the paper's NP does.
//
// The sub-package sim simulates several senders on one bottleneck in
// virtual time and returns rate/alpha time series.
package congestion
