package perftest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/qp"
)

// wrID packs a QP index and that QP's work request count into a wr_id.
func wrID(qpi, k int) uint64 { return uint64(qpi)<<32 | uint64(uint32(k)) }

// unpackID reverses wrID.
func unpackID(id uint64) (qpi, k int) { return int(id >> 32), int(uint32(id)) }

// txDepth is how many work requests rxego keeps outstanding per QP. For
// atomics it is at most the number of slots, so each fetched value is
// read from its slot before a later work request reuses the slot.
func (s *session) txDepth() int {
	if s.cfg.Test.verb() == atomic && !s.cfg.Test.Lat() {
		return min(s.cfg.TxDepth, s.lay.slots(atomicSize))
	}
	return s.cfg.TxDepth
}

// local returns the address (in rxego's MR) of QP i's k-th BW work
// request of size.
func (s *session) local(i, k, size int) uint64 {
	return s.mr.IOVA() + uint64(s.lay.buf(i)+s.lay.slot(k, size))
}

// bwWR builds QP i's k-th work request of a write, read or atomic BW test.
func (s *session) bwWR(i, k, size int) rxego.SendWR {
	c := &s.cfg
	wr := rxego.SendWR{ID: wrID(i, k), Flags: rxego.SendSignaled,
		SGL:        []rxego.SGE{{Addr: s.local(i, k, size), Length: uint32(size), LKey: s.mr.LKey()}},
		RemoteAddr: s.rem[i].VAddr + uint64(s.lay.slot(k, size)), RKey: s.rem[i].RKey}
	switch c.Test.verb() {
	case write:
		wr.Opcode = rxego.WRWrite
	case read:
		wr.Opcode = rxego.WRRead
	case send:
		wr.Opcode = rxego.WRSend
	case atomic:
		if c.Atomic == FetchAndAdd {
			wr.Opcode, wr.CompareAdd = rxego.WRFetchAdd, atomicAdd
		} else {
			wr.Opcode, wr.CompareAdd, wr.Swap = rxego.WRCompareSwap, atomicCompare, atomicSwap
		}
	}
	return wr
}

// atomicSeen tracks the values successive atomics on one remote word
// returned, to check the arithmetic a fetch-and-add or compare-and-swap
// responder did.
type atomicSeen struct {
	last map[int]uint64 // by remote slot offset
}

// observe checks v, fetched from slot, against the previous fetch from the
// same slot: one more for FETCH_AND_ADD, the same for CMP_AND_SWAP
// (compare 0, swap 0 never changes a word).
func (a *atomicSeen) observe(s *session, slot int, v uint64) {
	prev, ok := a.last[slot]
	a.last[slot] = v
	if !ok {
		return
	}
	want := prev
	if s.cfg.Atomic == FetchAndAdd {
		want = prev + atomicAdd
	}
	s.res.Checked++
	if v != want {
		s.res.Mismatches++
	}
}

// bwLoop posts iters work requests of size on every QP, keeping at most
// txDepth outstanding per QP, and returns the post and completion times
// (run_iter_bw). Every work request is signalled; perftest signals every
// cq_mod-th, which only changes what its host counts, not the wire.
func (s *session) bwLoop(size int, wr func(i, k int) rxego.SendWR, done func(wc rxego.WC) error) (posted, completed []time.Duration, err error) {
	c := &s.cfg
	n := c.NumQPs
	tot := c.Iters * n
	scnt, ccnt := make([]int, n), make([]int, n)
	posted, completed = make([]time.Duration, 0, tot), make([]time.Duration, 0, tot)
	wcs := make([]rxego.WC, 16)
	tx := s.txDepth()
	start := time.Now()
	for len(completed) < tot {
		for i, q := range s.qps {
			for scnt[i] < c.Iters && scnt[i]-ccnt[i] < tx {
				posted = append(posted, time.Since(start))
				if err := q.PostSend(wr(i, scnt[i])); err != nil {
					return nil, nil, fmt.Errorf("perftest: couldn't post send: qp %d scnt=%d: %w", i, scnt[i], err)
				}
				scnt[i]++
			}
		}
		k, err := s.poll(s.scq, wcs)
		if err != nil {
			return nil, nil, fmt.Errorf("%w (posted %d, completed %d of %d)", err, len(posted), len(completed), tot)
		}
		for _, wc := range wcs[:k] {
			i, _ := unpackID(wc.ID)
			if i >= n {
				return nil, nil, fmt.Errorf("perftest: completion with unknown wr_id %#x", wc.ID)
			}
			if done != nil {
				if err := done(wc); err != nil {
					return nil, nil, err
				}
			}
			ccnt[i]++
			completed = append(completed, time.Since(start))
		}
	}
	return posted, completed, nil
}

// rdmaBW runs ib_write_bw, ib_read_bw or ib_atomic_bw. The client posts
// and measures; the server only waits for the client's final handshake
// and report, as perftest's server does.
func (s *session) rdmaBW() error {
	c := &s.cfg
	s.out.s(resultLine)
	s.out.s(resultFmtBW)
	if !s.client {
		return s.rdmaBWServer()
	}
	var rep Report
	seen := atomicSeen{last: map[int]uint64{}}
	for _, size := range c.sizes() {
		var done func(wc rxego.WC) error
		if c.Test.verb() == atomic {
			done = func(wc rxego.WC) error {
				i, k := unpackID(wc.ID)
				off := s.lay.buf(i) + s.lay.slot(k, size)
				seen.observe(s, i<<32|s.lay.slot(k, size), binary.LittleEndian.Uint64(s.buf[off:]))
				return nil
			}
		}
		posted, completed, err := s.bwLoop(size, func(i, k int) rxego.SendWR { return s.bwWR(i, k, size) }, done)
		if err != nil {
			return err
		}
		rep = bwReport(size, c.Iters, posted, completed, c.cqMod)
		s.out.printBW(rep)
		s.res.BW = append(s.res.BW, rep)
	}
	s.out.s(resultLine)
	if c.Test.verb() == atomic {
		s.res.What = fmt.Sprintf("each %s returned the value the previous one on the same word left", c.Atomic)
	}
	last := c.sizes()[len(c.sizes())-1]
	if _, err := s.ex.HandShakeHold(s.my[0], s.holdFunc(func() []PeerCheck { return s.rdmaClientChecks(last, seen) })); err != nil {
		return err
	}
	if _, err := s.ex.Reports(rep); err != nil {
		return err
	}
	return s.ex.Close(s.my[0], nil)
}

// written is how many slots a QP's iters work requests of size touched.
func (s *session) written(size, iters int) int { return min(iters, s.lay.slots(size)) }

// rdmaClientChecks says what the peer's memory holds after a write, read
// or atomic BW run: per QP and slot, what rxego wrote there, what rxego
// read from there, or the word after the last atomic rxego saw.
func (s *session) rdmaClientChecks(size int, seen atomicSeen) []PeerCheck {
	c := &s.cfg
	var out []PeerCheck
	for i := range s.qps {
		for k := 0; k < s.written(size, c.Iters); k++ {
			slot := s.lay.slot(k, size)
			local := s.buf[s.lay.buf(i)+slot:][:size]
			pc := PeerCheck{Addr: s.rem[i].VAddr + uint64(slot), Data: bytes.Clone(local)}
			switch c.Test.verb() {
			case write:
				pc.What = fmt.Sprintf("QP %d slot %d: the bytes rxego wrote", i, k)
			case read:
				pc.What = fmt.Sprintf("QP %d slot %d: the bytes rxego read", i, k)
			case atomic:
				v := seen.last[i<<32|slot]
				if c.Atomic == FetchAndAdd {
					v += atomicAdd
				}
				pc.Data = binary.LittleEndian.AppendUint64(nil, v)
				pc.What = fmt.Sprintf("QP %d word %d: the value after rxego's last %s", i, k, c.Atomic)
			}
			out = append(out, pc)
		}
	}
	return out
}

// peerBuf is the address of the peer's QP i local region (its buf[i]),
// derived from the record it announced: the same layout on both sides.
func (s *session) peerBuf(i int) uint64 {
	return s.rem[i].VAddr - uint64(s.lay.vaddr(i)-s.lay.buf(i))
}

// rdmaBWServer waits for the client to finish, then checks rxego's memory
// against what the client says it did.
func (s *session) rdmaBWServer() error {
	c := &s.cfg
	last := c.sizes()[len(c.sizes())-1]
	if _, err := s.ex.HandShakeHold(s.my[0], s.holdFunc(func() []PeerCheck { return s.rdmaServerChecks(last) })); err != nil {
		return err
	}
	rem, err := s.ex.Reports(Report{Size: uint64(last), Iters: uint64(c.Iters * c.NumQPs)})
	if err != nil {
		return err
	}
	s.out.printBW(rem)
	s.out.s(resultLine)
	s.res.BW = append(s.res.BW, rem)
	if err := s.ex.Close(s.my[0], nil); err != nil {
		return err
	}
	iters := c.Iters
	if rem.Iters > 0 && rem.Iters%uint64(c.NumQPs) == 0 && rem.Iters/uint64(c.NumQPs) < 1<<31 {
		iters = int(rem.Iters / uint64(c.NumQPs))
	}
	s.dev.Sync()
	s.checkServerMemory(last, iters)
	return nil
}

// rdmaServerChecks says what the client's memory holds after a write,
// read or atomic BW run against rxego: per QP and slot, the client's
// source bytes equal what landed in rxego's slot (both walk the slots in
// step), the client's destination equals rxego's slot it read, or holds
// the value rxego's word had before the last atomic.
func (s *session) rdmaServerChecks(size int) []PeerCheck {
	c := &s.cfg
	var out []PeerCheck
	for i := range s.qps {
		for k := 0; k < s.written(size, c.Iters); k++ {
			slot := s.lay.slot(k, size)
			mine := s.buf[s.lay.vaddr(i)+slot:][:size]
			pc := PeerCheck{Addr: s.peerBuf(i) + uint64(slot), Data: bytes.Clone(mine)}
			switch c.Test.verb() {
			case write:
				pc.What = fmt.Sprintf("QP %d slot %d: the client's source of what rxego received", i, k)
			case read:
				pc.What = fmt.Sprintf("QP %d slot %d: what the client read from rxego", i, k)
			case atomic:
				v := binary.LittleEndian.Uint64(mine)
				if c.Atomic == FetchAndAdd {
					v -= atomicAdd
				}
				pc.Data = binary.LittleEndian.AppendUint64(nil, v)
				pc.What = fmt.Sprintf("QP %d word %d: the value the client's last %s fetched", i, k, c.Atomic)
			}
			out = append(out, pc)
		}
	}
	return out
}

// checkServerMemory checks rxego's buffer after the client's iters work
// requests of size per QP: a WRITE changed nothing outside the slots it
// targets; a READ changed nothing; each atomic word moved by exactly one
// per FETCH_AND_ADD that hit it (none for CMP_AND_SWAP) and nothing else
// changed.
func (s *session) checkServerMemory(size, iters int) {
	c := &s.cfg
	target := make([]bool, len(s.buf)) // bytes the client may have changed
	for i := range s.qps {
		if c.Test.verb() == read {
			break
		}
		if c.All { // every size, the last one (8 MiB) covering the others
			for b := s.lay.vaddr(i); b < s.lay.vaddr(i)+maxSize; b++ {
				target[b] = true
			}
			continue
		}
		for k := 0; k < s.written(size, iters); k++ {
			off := s.lay.vaddr(i) + s.lay.slot(k, size)
			for b := off; b < off+size; b++ {
				target[b] = true
			}
		}
	}
	ok := true
	for b := range s.buf {
		if !target[b] && s.buf[b] != s.fill[b] {
			ok = false
			break
		}
	}
	s.res.Checked++
	if !ok {
		s.res.Mismatches++
	}
	switch c.Test.verb() {
	case write:
		s.res.What = "no byte outside the slots the client targets changed"
	case read:
		s.res.What = "the client's READs changed no byte of rxego's memory"
	case atomic:
		s.res.What = fmt.Sprintf("each word changed by exactly what %d %ss per QP make, nothing else changed", iters, c.Atomic)
		for i := range s.qps {
			for k := 0; k < s.written(size, iters); k++ {
				off := s.lay.vaddr(i) + s.lay.slot(k, size)
				hits := (iters - k + s.lay.slots(size) - 1) / s.lay.slots(size)
				want := binary.LittleEndian.Uint64(s.fill[off:])
				if c.Atomic == FetchAndAdd {
					want += uint64(hits) * atomicAdd
				}
				s.res.Checked++
				if binary.LittleEndian.Uint64(s.buf[off:]) != want {
					s.res.Mismatches++
				}
			}
		}
	}
}

// sendBW runs ib_send_bw: per size the server posts its receives, both
// sides synchronise, the client sends and the server counts receives.
func (s *session) sendBW() error {
	c := &s.cfg
	s.out.s(resultLine)
	s.out.s(resultFmtBW)
	var checks func() []PeerCheck
	for _, size := range c.sizes() {
		var rep Report
		var err error
		if s.client {
			rep, err = s.sendBWClient(size)
			checks = func() []PeerCheck { return s.sendClientChecks(size) }
		} else {
			rep, err = s.sendBWServer(size)
			checks = func() []PeerCheck { return s.sendServerChecks(size) }
		}
		if err != nil {
			return err
		}
		s.out.printBW(rep)
		s.res.BW = append(s.res.BW, rep)
		if c.All {
			if _, err := s.ex.HandShake(s.my[0]); err != nil {
				return err
			}
		}
	}
	s.out.s(resultLine)
	return s.closeHold(checks)
}

// sendBWClient sends iters messages of size per QP from walking slots.
func (s *session) sendBWClient(size int) (Report, error) {
	if _, err := s.ex.HandShake(s.my[0]); err != nil {
		return Report{}, err
	}
	posted, completed, err := s.bwLoop(size, func(i, k int) rxego.SendWR {
		return rxego.SendWR{ID: wrID(i, k), Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
			SGL: []rxego.SGE{{Addr: s.local(i, k, size), Length: uint32(size), LKey: s.mr.LKey()}}}
	}, nil)
	if err != nil {
		return Report{}, err
	}
	return bwReport(size, s.cfg.Iters, posted, completed, s.cfg.cqMod), nil
}

// postRecv posts QP i's receive for its message k at offset off.
func (s *session) postRecv(i, k, off, size int) error {
	return s.qps[i].PostRecv(rxego.RecvWR{ID: wrID(i, k),
		SGL: []rxego.SGE{{Addr: s.mr.IOVA() + uint64(off), Length: uint32(size), LKey: s.mr.LKey()}}})
}

// sendBWServer receives iters messages of size per QP into the buffers
// perftest's server would use, reposting as it does, and checks each
// completion's length.
func (s *session) sendBWServer(size int) (Report, error) {
	c := &s.cfg
	offs := make([][]int, c.NumQPs)
	next := make([]int, c.NumQPs)
	for i := range s.qps {
		offs[i] = s.lay.recvOffsets(i, size, c.RxDepth, c.Iters, false)
		for next[i] < min(c.RxDepth, len(offs[i])) {
			if err := s.postRecv(i, next[i], offs[i][next[i]], size); err != nil {
				return Report{}, err
			}
			next[i]++
		}
	}
	if _, err := s.ex.HandShake(s.my[0]); err != nil {
		return Report{}, err
	}
	tot := c.Iters * c.NumQPs
	wcs := make([]rxego.WC, 16)
	var first, end time.Time
	for got := 0; got < tot; {
		k, err := s.poll(s.rcq, wcs)
		if err != nil {
			return Report{}, fmt.Errorf("%w (received %d of %d)", err, got, tot)
		}
		if got == 0 {
			first = time.Now()
		}
		for _, wc := range wcs[:k] {
			i, err := s.qpIndex(wc.QPN)
			if err != nil {
				return Report{}, err
			}
			s.res.Checked++
			if wc.Opcode != qp.WCRecv || int(wc.ByteLen) != size {
				s.res.Mismatches++
			}
			if next[i] < len(offs[i]) {
				if err := s.postRecv(i, next[i], offs[i][next[i]], size); err != nil {
					return Report{}, err
				}
				next[i]++
			}
			got++
		}
	}
	end = time.Now()
	s.res.What = "every receive completed with the message size"
	secs := max(end.Sub(first).Seconds(), 1e-9)
	r := Report{Size: uint64(size), Iters: uint64(tot)}
	r.BWAvg = float64(size) * float64(tot) / secs / mb
	r.BWPeak = r.BWAvg // a receiver has no per-message post times to find a peak in
	r.MsgRate = float64(tot) / secs / 1e6
	return r, nil
}

// lastPerOffset maps each receive offset to the last message that landed
// there.
func lastPerOffset(offs []int) map[int]int {
	m := make(map[int]int, len(offs))
	for k, off := range offs {
		m[off] = k
	}
	return m
}

// sendClientChecks says what the server's receive buffers hold after
// rxego's SENDs: for each buffer, the last message rxego sent into it.
func (s *session) sendClientChecks(size int) []PeerCheck {
	c := &s.cfg
	var out []PeerCheck
	for i := range s.qps {
		peer0 := s.peerBuf(i) - uint64(s.lay.buf(i))
		for off, k := range lastPerOffset(s.lay.recvOffsets(i, size, c.RxDepth, c.Iters, false)) {
			src := s.lay.buf(i) + s.lay.slot(k, size)
			out = append(out, PeerCheck{Addr: peer0 + uint64(off), Data: bytes.Clone(s.buf[src:][:size]),
				What: fmt.Sprintf("QP %d: the server's receive buffer for message %d", i, k)})
		}
	}
	return out
}

// sendServerChecks says what the client's send buffers hold: for each of
// rxego's receive buffers, the client's slot the last message into it
// came from.
func (s *session) sendServerChecks(size int) []PeerCheck {
	c := &s.cfg
	var out []PeerCheck
	for i := range s.qps {
		for off, k := range lastPerOffset(s.lay.recvOffsets(i, size, c.RxDepth, c.Iters, false)) {
			out = append(out, PeerCheck{Addr: s.peerBuf(i) + uint64(s.lay.slot(k, size)),
				Data: bytes.Clone(s.buf[off:][:size]), What: fmt.Sprintf("QP %d: the client's source of message %d", i, k)})
		}
	}
	return out
}
