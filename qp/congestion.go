package qp

import (
	"net/netip"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/congestion"
)

// CongestionConfig configures DCQCN: the reaction point (rate control on
// the sender, driven by CNPs), the notification point (CNPs sent back when
// packets arrive marked Congestion Experienced), and per-QP pacing.
type CongestionConfig struct {
	// Off disables rate control and CNP generation; CNPs and CE marks are
	// still counted.
	Off bool
	// RP are the reaction point parameters; zero means
	// congestion.NVIDIAParams(DefaultLineRate).
	RP congestion.Params
	// NP are the notification point parameters; zero means
	// congestion.NVIDIANPParams().
	NP congestion.NPParams
	// Burst is the pacer's burst allowance in bytes (congestion.DefaultBurst).
	Burst int
}

// DefaultLineRate is the rate a QP starts at and returns to: the fastest
// rxego goes, so pacing costs nothing until congestion is signalled.
const DefaultLineRate = 100 * congestion.Gbps

// ECT0 is the ECN codepoint data packets carry when DCQCN is on.
const ECT0 = 0x02

// qpCC is one QP's congestion state.
type qpCC struct {
	ctrl  congestion.Controller
	pacer congestion.Pacer
	np    congestion.NP
	rate  uint64 // the rate last handed to the pacer
	sent  uint64 // CNPs this QP sent
	rcvd  uint64 // CNPs this QP handled
	ce    uint64 // CE-marked packets this QP received

	// lapsed: the controller's timer was left to lapse because the QP had
	// nothing to send; ccAdmit catches the controller up first.
	lapsed bool
}

// CCStats are a QP's congestion-control figures.
type CCStats struct {
	Rate      uint64 // current rate, bits/s
	Target    uint64 // target rate, bits/s
	Alpha     float64
	CNPsSent  uint64
	CNPsRcvd  uint64
	CEMarked  uint64
	RateCuts  uint64
	Increases uint64
}

func (c *CongestionConfig) withDefaults() (CongestionConfig, error) {
	var o CongestionConfig
	if c != nil {
		o = *c
	}
	if o.RP.LineRate == 0 {
		o.RP = congestion.NVIDIAParams(DefaultLineRate)
	}
	if o.NP.MinTimeBetweenCNPs == 0 && o.NP.CNPDSCP == 0 {
		o.NP = congestion.NVIDIANPParams()
	}
	if o.Burst == 0 {
		o.Burst = congestion.DefaultBurst
	}
	if err := o.RP.Validate(); err != nil {
		return o, err
	}
	return o, o.NP.Validate()
}

func (e *Engine) newCC() *qpCC {
	if e.cc.Off {
		return nil
	}
	ctrl, err := congestion.NewDCQCN(e.cc.RP)
	if err != nil {
		return nil // parameters were validated at NewEngine
	}
	return &qpCC{ctrl: ctrl, pacer: congestion.NewPacer(e.cc.RP.LineRate, e.cc.Burst), np: congestion.NewNP(e.cc.NP.MinTimeBetweenCNPs), rate: e.cc.RP.LineRate}
}

// ccAdmit asks q's pacer whether a packet of n bytes may leave now. A
// paced QP is woken by its pace timer once half a burst may leave, and
// sends nothing in between (an ACK arriving meanwhile does not release a
// packet), so its packets go out several to a system call instead of one
// per wake-up. The rate is the pacer's either way; only the grain of the
// releases changes.
func (e *Engine) ccAdmit(q *QP, now time.Duration, n int) bool {
	c := q.cc
	if c == nil || q.ccQuiet {
		return true
	}
	if c.lapsed {
		c.lapsed = false
		c.ctrl.Advance(now)
		e.ccRate(q, now)
	}
	if q.timer[timerPace].deadline > now {
		return false
	}
	ok, _ := c.pacer.Admit(now, n)
	if !ok {
		e.schedule(q, timerPace, e.paceAt(c, now))
	}
	return ok
}

// paceAt returns when a paced QP should next be woken: when half a burst
// may leave.
func (e *Engine) paceAt(c *qpCC, now time.Duration) time.Duration {
	at := now + c.pacer.Delay(now)
	if r := c.pacer.Rate(); r > 0 {
		at += time.Duration(uint64(max(e.cc.Burst, 0)/2) * 8e9 / r)
	}
	return at
}

// ccSent feeds the byte counter of q's reaction point.
func (e *Engine) ccSent(q *QP, now time.Duration, n int) {
	if c := q.cc; c != nil && !q.ccQuiet {
		c.ctrl.OnSent(now, n)
		e.ccRate(q, now)
	}
}

// ccRate hands a changed rate to the pacer and re-arms the controller's
// timer.
func (e *Engine) ccRate(q *QP, now time.Duration) {
	c := q.cc
	if r := c.ctrl.Rate(); r != c.rate {
		c.rate = r
		c.pacer.SetRate(now, r)
		// A raised rate may let the next batch leave sooner; a wake-up is
		// never put off, or rate changes every timer period would keep
		// restarting the wait for a batch.
		if d := q.timer[timerPace].deadline; d != 0 {
			if at := e.paceAt(c, now); at < d {
				e.schedule(q, timerPace, at)
			}
		}
	}
	at, pending := c.ctrl.NextEvent()
	if pending {
		if at <= now {
			at = now + 1
		}
		if q.timer[timerCC].deadline == 0 || at < q.timer[timerCC].deadline {
			e.schedule(q, timerCC, at)
		}
	}
	q.ccQuiet = !pending && c.rate >= e.cc.RP.LineRate && !c.lapsed && q.timer[timerPace].deadline == 0
}

// ccTimer runs the controller's due events. A QP with nothing to send
// lets the timer lapse instead of waking every rate-increase period while
// idle (thousands of wake-ups a second per QP); Advance runs every missed
// event in order, so catching up in ccAdmit before the next packet, or in
// CongestionStats, gives the same rates.
func (e *Engine) ccTimer(q *QP, now time.Duration) {
	if c := q.cc; c != nil {
		c.ctrl.Advance(now)
		if q.sqSend == q.sqTail {
			c.lapsed = true
			q.ccQuiet = false // ccAdmit catches the controller up
			return
		}
		e.ccRate(q, now)
		e.kick(q)
	}
}

// ccCNP handles a CNP addressed to q that arrived at about at (arrival),
// taken in at now.
func (e *Engine) ccCNP(q *QP, at, now time.Duration) {
	e.Stats.CNPsReceived.Add(1)
	if c := q.cc; c != nil {
		c.rcvd++
		c.ctrl.OnCNP(at)
		e.ccRate(q, now)
	}
}

// ccLoss tells q's reaction point that a retransmission timer expired:
// repeated timeouts mean congestion just as CNPs do (a slow responder
// marks nothing, it drops), so the rate is cut as for a CNP. It is not
// counted as a CNP.
func (e *Engine) ccLoss(q *QP, now time.Duration) {
	if c := q.cc; c != nil {
		c.ctrl.OnCNP(now)
		e.ccRate(q, now)
	}
}

// ccMarked runs the notification point for a CE-marked packet arriving at
// q from src QPN srcQPN, sending a CNP when one is due.
func (e *Engine) ccMarked(q *QP, in *InPacket, srcQPN uint32, now time.Duration) {
	e.Stats.ECNMarkedPktsReceived.Add(1)
	c := q.cc
	if c == nil {
		return
	}
	c.ce++
	if !c.np.OnCE(now) {
		return
	}
	buf, p := e.header(q, bth.CNPOpcode, 0, 0, false, false, srcQPN)
	bth.BTH(buf).SetBECN(true)
	p.CNP().Clear()
	// To the RoCE port, not the packet's source port: rxe and NICs send
	// from a per-flow port (0xC000 | hash) that nothing listens on.
	dst := q.attr.Dest
	if q.typ == UD || !dst.IsValid() {
		dst = netip.AddrPortFrom(in.Src.Addr(), e.cfg.Port)
	}
	e.emit(q, buf, dst, e.cc.NP.CNPDSCP<<2)
	c.sent++
	e.Stats.CNPsSent.Add(1)
}

// CongestionStats returns q's DCQCN figures; ok is false when congestion
// control is off.
func (q *QP) CongestionStats() (s CCStats, ok bool) {
	q.e.mu.Lock()
	defer q.e.mu.Unlock()
	c := q.cc
	if c == nil {
		return CCStats{}, false
	}
	c.ctrl.Advance(q.e.cfg.Clock.Now()) // an idle QP's timer may have lapsed
	st := c.ctrl.Stats()
	return CCStats{Rate: st.Rate, Target: st.Target, Alpha: st.Alpha, CNPsSent: c.sent, CNPsRcvd: c.rcvd,
		CEMarked: c.ce, RateCuts: st.Cuts, Increases: st.FastRecovery + st.AdditiveIncrease + st.HyperIncrease}, true
}
