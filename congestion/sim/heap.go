package sim

import "time"

type eventKind uint8

const (
	evSample    eventKind = iota // record a sample
	evCNP                        // a CNP reaches its sender
	evDequeue                    // a packet leaves the bottleneck queue
	evDequeueCE                  // a packet marked on arrival leaves the queue
	evDeliver                    // a packet reaches its receiver
	evDeliverCE                  // a CE-marked packet reaches its receiver
	evSend                       // a sender tries to send
)

type event struct {
	at   time.Duration
	seq  uint64 // insertion order: ties run first-in first-out
	kind eventKind
	flow int
}

// eventHeap is a binary min-heap on (at, seq), typed to avoid the boxing
// of container/heap.
type eventHeap struct {
	items []event
	seq   uint64
}

func (h *eventHeap) len() int { return len(h.items) }

func (h *eventHeap) less(i, j int) bool {
	a, b := &h.items[i], &h.items[j]
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

func (h *eventHeap) push(e event) {
	e.seq = h.seq
	h.seq++
	h.items = append(h.items, e)
	for i := len(h.items) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	top := h.items[0]
	last := len(h.items) - 1
	h.items[0] = h.items[last]
	h.items = h.items[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < last && h.less(l, m) {
			m = l
		}
		if r < last && h.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		h.items[i], h.items[m] = h.items[m], h.items[i]
		i = m
	}
	return top
}
