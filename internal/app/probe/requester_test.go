package probe

import (
	"strings"
	"testing"
	"time"
)

// TestJudgeAckTimeout: ack-timeout judges the peer's first resend. A resend
// of the held PSN just after its first copy deviates, unless it is part of
// the go-back-N of an older PSN whose timer ran out first (the probe's ACK
// for it came late), which is then judged by its own first copy. A resend
// before the held PSN's first copy is no reaction to the withheld ACK.
func TestJudgeAckTimeout(t *testing.T) {
	s := builtinRequester(t, "ack-timeout")
	r := &reqRun{timeoutT: qpTimeout(14), slack: DefaultTimerSlack}
	t0 := time.Now()
	ms := func(f float64) time.Time { return t0.Add(time.Duration(f * float64(time.Millisecond))) }
	type ev = judgeEvent
	for _, c := range []struct {
		name   string
		events []ev
		want   Verdict
	}{
		{"timer of +5", []ev{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 0.1}, {6, 0.2}, {5, 70}}, Conforms},
		{"+5 resent at once", []ev{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 0.1}, {6, 0.2}, {5, 0.6}}, Deviates},
		{"+5 resent after 4T", []ev{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 0.1}, {5, 300}}, Deviates},
		// +5 first went out just before +0's timer ran out: the go-back-N
		// from +0 carries it along 0.5 ms later.
		{"go-back-N from +0's timeout", []ev{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 66.9}, {0, 67.2}, {1, 67.3}, {2, 67.3}, {3, 67.4}, {4, 67.4}, {5, 67.4}}, Conforms},
		{"+0 resent too early", []ev{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 10}, {0, 10.5}, {1, 10.5}, {2, 10.5}, {3, 10.6}, {4, 10.6}, {5, 10.6}}, Deviates},
		// The lab's capture of a stalled rxe 6.12 guest: +1 and its
		// timer's copy left together 147 ms after +0, before +5 was
		// first sent; +5's own timer resent it 225 ms later.
		{"an older PSN resent before +5 was sent", []ev{{0, 0}, {1, 147.26}, {1, 147.27}, {2, 147.27}, {3, 147.28}, {4, 147.28},
			{5, 147.29}, {6, 147.3}, {5, 372.5}, {6, 372.6}}, Conforms},
		{"a newer PSN resent first", []ev{{0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 0.1}, {6, 0.2}, {6, 70}, {5, 71}}, Deviates},
	} {
		if v, detail, obs := r.judge(judgeQP(s, c.events, ms)); v != c.want {
			t.Errorf("%s: %s (%s; %q), want %s", c.name, v, detail, obs, c.want)
		}
	}
}

// TestJudgeDuplicateAck: duplicate-ack deviates when the peer resends a
// PSN the ACK does not cover at once after the duplicate; not for a
// timer's resend half a timeout later, nor for a go-back-N from a PSN the
// ACKs covered (the peer had not taken them when its timer ran out: the
// lab's capture of a starved rxe 6.1 guest, whose 20 SENDs reached the
// wire 6 ms before the probe's ACKs and were all resent 11 ms after them).
func TestJudgeDuplicateAck(t *testing.T) {
	s := builtinRequester(t, "duplicate-ack")
	r := &reqRun{timeoutT: qpTimeout(14), slack: DefaultTimerSlack}
	t0 := time.Now()
	ms := func(f float64) time.Time { return t0.Add(time.Duration(f * float64(time.Millisecond))) }
	burst := func(at float64) []judgeEvent {
		var out []judgeEvent
		for rel := range 20 {
			out = append(out, judgeEvent{rel, at})
		}
		return out
	}
	for _, c := range []struct {
		name   string
		events []judgeEvent
		dupAt  float64
		want   Verdict
	}{
		{"nothing resent", burst(0), 1, Conforms},
		{"+6 resent at once", append(burst(0), judgeEvent{6, 1.5}), 1, Deviates},
		{"+6 resent by the timer", append(burst(0), judgeEvent{6, 68}), 1, Conforms},
		{"go-back-N from +0 before the ACKs were taken", append(burst(0), burst(10.8)...), 6.3, Conforms},
		{"go-back-N from +0, then +6 again", append(append(burst(0), burst(10.8)...), judgeEvent{6, 11}), 6.3, Deviates},
	} {
		q := judgeQP(s, c.events, ms)
		q.dupAt = ms(c.dupAt)
		if v, detail, obs := r.judge(q); v != c.want {
			t.Errorf("%s: %s (%s; %q), want %s", c.name, v, detail, obs, c.want)
		}
	}
}

// judgeEvent is a packet of the peer's in a judge test: its PSN
// relative to the start, and when it came, in ms.
type judgeEvent struct {
	rel int
	at  float64
}

// builtinRequester returns the built-in requester scenario name.
func builtinRequester(t *testing.T, name string) *Scenario {
	t.Helper()
	for _, sc := range BuiltinRequester() {
		if sc.Name == name {
			return sc
		}
	}
	t.Fatalf("no built-in %s scenario", name)
	return nil
}

// judgeQP is a reqQP of scenario s that saw events (times from ms).
func judgeQP(s *Scenario, events []judgeEvent, ms func(float64) time.Time) *reqQP {
	q := &reqQP{s: s, seen: map[int]int{}}
	for j := range s.Steps {
		if s.Steps[j].Kind == StepImpair {
			q.impair = &s.Steps[j]
		}
	}
	for _, e := range events {
		q.seen[e.rel]++
		q.events = append(q.events, reqEvent{at: ms(e.at), rel: e.rel, copy: q.seen[e.rel]})
	}
	return q
}

// TestJudgeCNPRate: cnp-rate compares the peer's packet rate in the window
// before the first CNP with the window up to the last, from forged traces:
// a peer that keeps its pace has no reaction point (not applicable, with
// both rates), one that falls to a fifth conforms, and a trace that
// cannot show it (the train cut short, the stream ended or began inside
// a window, too few packets, a resend) is inconclusive.
func TestJudgeCNPRate(t *testing.T) {
	s := builtinRequester(t, "cnp-rate")
	r := &reqRun{timeoutT: qpTimeout(14), slack: DefaultTimerSlack}
	t0 := time.Now()
	ms := func(f float64) time.Time { return t0.Add(time.Duration(f * float64(time.Millisecond))) }
	const first = 120.0 // ms: the first CNP; 1000 of them 50 us apart
	train := func(n int) []time.Time {
		var out []time.Time
		for i := range n {
			out = append(out, ms(first+float64(i)*0.05))
		}
		return out
	}
	last := first + 999*0.05
	// stream is a packet every 1/perMs ms from start to end, perMs2 from
	// slowAt on.
	stream := func(start, end float64, perMs, slowAt, perMs2 float64) []judgeEvent {
		var out []judgeEvent
		rel := 0
		for at := start; at < end; rel++ {
			out = append(out, judgeEvent{rel, at})
			if at >= slowAt {
				at += 1 / perMs2
			} else {
				at += 1 / perMs
			}
		}
		return out
	}
	never := 1e9
	for _, c := range []struct {
		name   string
		events []judgeEvent
		sent   []time.Time
		want   Verdict
		says   string
	}{
		{"no reaction", stream(0, last+5, 100, never, 0), train(1000), NotApplicable, "100.0 packets/ms"},
		{"a fifth the rate", stream(0, last+5, 100, first+2, 20), train(1000), Conforms, "20.0 packets/ms"},
		{"just above half", stream(0, last+5, 100, first+2, 55), train(1000), NotApplicable, "55.0 packets/ms"},
		{"the train cut short", stream(0, last+5, 100, first+2, 20), train(600), Inconclusive, "600 of the 1000"},
		{"no train", stream(0, 50, 100, never, 0), nil, Inconclusive, "ended before the CNPs were due"},
		{"the stream ended in the window", stream(0, last-5, 100, never, 0), train(1000), Inconclusive, "nothing after the last CNP"},
		{"the stream began in the window", stream(first-10, last+5, 100, never, 0), train(1000), Inconclusive, "began less than"},
		{"too few packets", stream(0, last+5, 0.5, never, 0), train(1000), Inconclusive, "too few packets"},
		// 4.8 packets/ms against 20 CNPs/ms: rxe in ci28, which fell to
		// 1.4 with no reaction point.
		{"slower than the CNPs", stream(0, last+5, 4.8, first+2, 1.4), train(1000), Inconclusive, TooSlowToJudge},
		// 11.2 packets/ms against about 10 CNPs/ms: rxe 6.12 in ci31,
		// which stopped under the train with no reaction point.
		{"just faster than the CNPs", stream(0, last+5, 21, first+2, 0.5), train(1000), Inconclusive, TooSlowToJudge},
		{"under four times the CNPs", stream(0, last+5, 79, first+2, 4), train(1000), Inconclusive, "fewer than 4 times"},
		{"four times the CNPs", stream(0, last+5, 85, first+2, 4), train(1000), Conforms, "4.0 packets/ms"},
		{"a resend", append(stream(0, last+5, 100, first+2, 20), judgeEvent{7000, last + 1}), train(1000), Inconclusive, "resent 1 packets"},
	} {
		q := judgeQP(s, c.events, ms)
		if c.name == "a resend" {
			q.events[len(q.events)-1].copy = 2 // PSN +7000 came twice
		}
		if c.sent != nil {
			q.train = &cnpTrain{want: *q.impair.Count, done: make(chan struct{}), sent: c.sent}
		}
		v, detail, obs := r.judge(q)
		if v != c.want || !strings.Contains(detail+strings.Join(obs, "; "), c.says) {
			t.Errorf("%s: %s (%s; %q), want %s saying %q", c.name, v, detail, obs, c.want, c.says)
		}
	}
}
