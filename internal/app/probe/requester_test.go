package probe

import (
	"testing"
	"time"
)

// TestJudgeAckTimeout: ack-timeout judges the peer's first resend. A resend
// of the held PSN just after its first copy deviates, unless it is part of
// the go-back-N of an older PSN whose timer ran out first (the probe's ACK
// for it came late), which is then judged by its own first copy. A resend
// before the held PSN's first copy is no reaction to the withheld ACK.
func TestJudgeAckTimeout(t *testing.T) {
	var s *Scenario
	for _, sc := range BuiltinRequester() {
		if sc.Name == "ack-timeout" {
			s = sc
		}
	}
	if s == nil {
		t.Fatal("no built-in ack-timeout scenario")
	}
	r := &reqRun{timeoutT: qpTimeout(14), slack: DefaultTimerSlack}
	t0 := time.Now()
	ms := func(f float64) time.Time { return t0.Add(time.Duration(f * float64(time.Millisecond))) }
	type ev struct {
		rel int
		at  float64
	}
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
		q := &reqQP{s: s, seen: map[int]int{}}
		for j := range s.Steps {
			if s.Steps[j].Kind == StepImpair {
				q.impair = &s.Steps[j]
			}
		}
		for _, e := range c.events {
			q.seen[e.rel]++
			q.events = append(q.events, reqEvent{at: ms(e.at), rel: e.rel, copy: q.seen[e.rel]})
		}
		if v, detail, obs := r.judge(q); v != c.want {
			t.Errorf("%s: %s (%s; %q), want %s", c.name, v, detail, obs, c.want)
		}
	}
}
