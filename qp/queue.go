package qp

import (
	"errors"
	"sync"

	"github.com/rxego/rxego/bth"
)

// sendWQE is a send queue entry: the posted request plus the requester's
// and completer's progress on it.
type sendWQE struct {
	wr  SendWR
	sgl []SGE // owned copy of wr.SGL (wr.SGL aliases it): sge1's or sgls's
	// sge1 holds a single SGE. With thousands of QPs a post finds its WQE
	// cold in the CPU's caches, and a post of one SGE (nearly all of
	// them) then only writes the WQE: reading a buffer's slice header out
	// of it first cost a cache miss per post (5% of the client's CPU with
	// 10,000 QPs).
	sge1     [1]SGE
	sgls     []SGE  // the buffer for several SGEs, kept for the next post
	inline   []byte // owned copy of an inline payload (SendInline)
	length   uint32 // total message length
	signaled bool
	wqeProgress
}

// wqeProgress is a send WQE's requester and completer progress: what
// posting resets, in one assignment (a WQE is 344 bytes; rebuilding it
// whole cost a 64-byte WRITE's post a fifth of the engine's time).
type wqeProgress struct {
	// requester progress
	started  bool
	firstPSN bth.PSN // PSN of the first packet (READ: of the first response)
	lastPSN  bth.PSN // PSN of the last packet (READ: of the last response)
	npkts    int
	// READ splitting (readsplit.go): response PSNs per request, chunks
	// asked for so far, and the max_rd_atomic slots and READ budget bytes
	// the WQE holds (atomics, FLUSH and ATOMIC WRITE hold one slot).
	chunkPkts  int
	reqSent    int
	rdHeld     int
	budgetHeld int
	// completer progress
	acked     bool   // every packet acknowledged (or every response received)
	readBytes uint32 // READ: response bytes placed so far
	status    WCStatus
	done      bool
}

func (w *sendWQE) isReadOrAtomic() bool {
	switch w.wr.Opcode {
	case WRRead, WRCompareSwap, WRFetchAdd:
		return true
	}
	return false
}

// needsResponseData reports whether the WQE completes only on a response
// that carries data or a result (not on a plain ACK).
func (w *sendWQE) needsResponse() bool {
	switch w.wr.Opcode {
	case WRRead, WRCompareSwap, WRFetchAdd, WRFlush, WRAtomicWrite:
		return true
	}
	return false
}

// recvWQE is a receive queue entry. Its scatter list is one[:1] for a
// single SGE and more otherwise; use sgl.
type recvWQE struct {
	id     uint64
	one    [1]SGE
	more   []SGE
	nsge   int
	length uint32
}

// sgl returns the WQE's scatter list, a view into w for a single SGE.
func (w *recvWQE) sgl() []SGE {
	if w.more != nil {
		return w.more
	}
	return w.one[:w.nsge]
}

// ErrQueueFull is returned when a post would exceed the queue's depth.
var ErrQueueFull = errors.New("qp: work queue full")

// SRQ is a shared receive queue: receive WQEs that any QP attached to it
// consumes.
type SRQ struct {
	mu      sync.Mutex
	pd      any
	ring    []recvWQE
	head    int
	n       int
	maxSGE  int
	eng     *Engine
	srqLife // srq.go: users, Destroy and the limit event
}

func (s *SRQ) take() (recvWQE, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		return recvWQE{}, false
	}
	w := s.ring[s.head]
	s.ring[s.head] = recvWQE{}
	s.head = (s.head + 1) % len(s.ring)
	s.n--
	s.checkLimit()
	return w, true
}

// Len returns how many receive WQEs are posted.
func (s *SRQ) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// recvQueue is a QP's own receive queue; posts come from application
// goroutines and takes from the engine, so it has its own lock.
type recvQueue struct {
	mu   sync.Mutex
	ring []recvWQE // grows on use up to max
	max  int
	head int
	n    int
}

// putAll queues all of wrs, or none when they do not all fit.
func (q *recvQueue) putAll(wrs []RecvWR) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n+len(wrs) > q.max {
		return false
	}
	q.grow(q.n + len(wrs))
	for i := range wrs {
		q.ring[(q.head+q.n)%len(q.ring)] = makeRecvWQE(&wrs[i])
		q.n++
	}
	return true
}

// grow makes the ring hold at least n WQEs (n <= max), doubling it.
func (q *recvQueue) grow(n int) {
	if n <= len(q.ring) {
		return
	}
	size := min(max(n, 2*len(q.ring), 4), q.max)
	ring := make([]recvWQE, size)
	for i := range q.n {
		ring[i] = q.ring[(q.head+i)%len(q.ring)]
	}
	q.ring, q.head = ring, 0
}

func (q *recvQueue) take() (recvWQE, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		return recvWQE{}, false
	}
	w := q.ring[q.head]
	q.ring[q.head] = recvWQE{}
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	return w, true
}

func (q *recvQueue) drain() []recvWQE {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]recvWQE, 0, q.n)
	for q.n > 0 {
		out = append(out, q.ring[q.head])
		q.ring[q.head] = recvWQE{}
		q.head = (q.head + 1) % len(q.ring)
		q.n--
	}
	return out
}

func (q *recvQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}
