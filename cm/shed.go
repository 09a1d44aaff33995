package cm

// shedSet remembers the requests dropped for a full backlog (REQs, SIDR
// REQs), so that a retransmission is recognised as coming from a live
// initiator: a ring of the last shedRing keys, so memory stays bounded
// under a flood. It is guarded by Manager.mu.
type shedSet[K comparable] struct {
	m    map[K]struct{}
	ring []K // allocated on the first shed
	next int
}

// shedRing is how many shed requests a Manager remembers of each kind:
// enough for a live initiator's retransmission (rdma_cm: 4.3 s later) to
// be recognised while thousands of forged requests a second pass.
const shedRing = 1 << 16

// add remembers k, forgetting the oldest key when the ring is full.
func (s *shedSet[K]) add(k K) {
	if _, ok := s.m[k]; ok {
		return
	}
	if s.ring == nil {
		s.m, s.ring = make(map[K]struct{}), make([]K, 0, shedRing)
	}
	if len(s.ring) < shedRing {
		s.ring = append(s.ring, k)
	} else {
		delete(s.m, s.ring[s.next])
		s.ring[s.next] = k
		s.next = (s.next + 1) % shedRing
	}
	s.m[k] = struct{}{}
}

// take reports whether k was shed before, and forgets it.
func (s *shedSet[K]) take(k K) bool {
	if _, ok := s.m[k]; !ok {
		return false
	}
	delete(s.m, k)
	return true
}

// len returns how many shed requests are remembered.
func (s *shedSet[K]) len() int { return len(s.m) }
