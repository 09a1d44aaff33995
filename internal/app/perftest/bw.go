package perftest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/rxego/rxego"
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

// cqMod is the signalling interval: at most the tx depth, so that a
// signalled work request is always outstanding while the queue is full.
func (s *session) cqMod() int { return min(s.cfg.cqMod, s.txDepth()) }

// local returns the address (in rxego's MR) of QP i's k-th BW work
// request of size.
func (s *session) local(i, k, size int) uint64 {
	return s.mr.IOVA() + uint64(s.lay.buf(i)+s.slotOf(k, size))
}

// bwWR builds QP i's k-th work request of a write, read or atomic BW test.
func (s *session) bwWR(i, k, size int) rxego.SendWR {
	c := &s.cfg
	wr := rxego.SendWR{ID: wrID(i, k), Flags: rxego.SendSignaled,
		SGL:        []rxego.SGE{{Addr: s.local(i, k, size), Length: uint32(size), LKey: s.mr.LKey()}},
		RemoteAddr: s.rem[i].VAddr + uint64(s.slotOf(k, size)), RKey: s.rem[i].RKey}
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

// bwTimes is what one bwLoop measured.
type bwTimes struct {
	// posted and completed hold each work request's post and completion
	// time (in post and completion order) when the peak is measured;
	// unsignalled work requests complete with the next signalled one.
	posted, completed []time.Duration
	// n work requests completed in span: the whole run, or a timed run's
	// sample window.
	n    int
	span time.Duration
}

// bwLoop posts iters work requests of size on every QP (or, timed, for
// cfg.Duration), keeping at most txDepth outstanding per QP, handing them
// over postList at a time and signalling every cqMod-th and the last
// (run_iter_bw). done, when set, sees every completed work request (i, k)
// of QP i in order, signalled or not.
func (s *session) bwLoop(wr func(i, k int) rxego.SendWR, done func(i, k int) error) (bwTimes, error) {
	c := &s.cfg
	n := c.NumQPs
	timed := c.Duration > 0 && !c.RunInfinitely
	endless := timed || c.RunInfinitely
	limit, tot := c.Iters, c.Iters*n
	if endless {
		limit, tot = int(^uint(0)>>1), 0
	}
	var t bwTimes
	if !c.noPeak {
		t.posted, t.completed = make([]time.Duration, 0, tot), make([]time.Duration, 0, tot)
	}
	scnt, ccnt := make([]int, n), make([]int, n)
	wcs := make([]rxego.WC, 16)
	wrs := make([]rxego.SendWR, 0, c.postList)
	tx, pl, cqMod := s.txDepth(), c.postList, s.cqMod()
	start := time.Now()
	// A timed run samples from Margin to Duration-Margin and stops posting
	// at Duration; the work requests still outstanding then are left to
	// complete behind the final exchange.
	sampleFrom, sampleTo, end := c.Margin, c.Duration-c.Margin, c.Duration
	var sampled, atSample int
	var sampling bool
	completedAll := 0
	var tick time.Duration // --run_infinitely: the last report
	for endless || completedAll < tot {
		now := time.Since(start)
		if c.RunInfinitely && now-tick >= c.Duration {
			s.out.printBW(avgReport(c.Size, completedAll-atSample, now-tick))
			tick, atSample = now, completedAll
		}
		if timed {
			if !sampling && now >= sampleFrom && now < sampleTo {
				sampling, atSample = true, completedAll
			}
			if sampling && now >= sampleTo {
				sampled, t.span = completedAll-atSample, now-sampleFrom
				sampling = false
				sampleFrom = end + 1 // once
			}
			if now >= end {
				break
			}
		}
		for i, q := range s.qps {
			for scnt[i] < limit && scnt[i]-ccnt[i]+pl <= tx {
				wrs = wrs[:0]
				for j := 0; j < pl && scnt[i]+j < limit; j++ {
					k := scnt[i] + j
					w := wr(i, k)
					w.Flags &^= rxego.SendSignaled
					if (k+1)%cqMod == 0 || k == limit-1 {
						w.Flags |= rxego.SendSignaled
					}
					wrs = append(wrs, w)
				}
				if !c.noPeak {
					at := time.Since(start)
					for range wrs {
						t.posted = append(t.posted, at)
					}
				}
				if err := q.PostSend(wrs...); err != nil {
					return t, fmt.Errorf("perftest: couldn't post send: qp %d scnt=%d: %w", i, scnt[i], err)
				}
				scnt[i] += len(wrs)
			}
		}
		k, err := s.poll(s.scq, wcs)
		if err != nil && c.RunInfinitely && s.ctx.Err() != nil {
			return t, nil // the end of an endless run
		}
		if err != nil {
			return t, fmt.Errorf("%w (posted %d, completed %d of %d)", err, sum(scnt), completedAll, tot)
		}
		at := time.Since(start)
		for _, wc := range wcs[:k] {
			i, last := unpackID(wc.ID)
			if i >= n || last < ccnt[i] || last >= scnt[i] {
				return t, fmt.Errorf("perftest: completion with unknown wr_id %#x", wc.ID)
			}
			for ; ccnt[i] <= last; ccnt[i]++ {
				if done != nil {
					if err := done(i, ccnt[i]); err != nil {
						return t, err
					}
				}
				if !c.noPeak {
					t.completed = append(t.completed, at)
				}
				completedAll++
			}
		}
	}
	if timed {
		t.n = sampled
		if t.span == 0 { // the sample window never closed
			t.n, t.span = completedAll, time.Since(start)
		}
		return t, nil
	}
	t.n, t.span = completedAll, time.Since(start)
	if len(t.posted) > 0 && len(t.completed) > 0 {
		t.span = t.completed[len(t.completed)-1] - t.posted[0]
	}
	return t, nil
}

func sum(v []int) (n int) {
	for _, x := range v {
		n += x
	}
	return n
}

// rdmaBW runs ib_write_bw, ib_read_bw or ib_atomic_bw. The client posts
// and measures; the server only waits for the client's final handshake
// and report, as perftest's server does. With -b both sides post.
func (s *session) rdmaBW() error {
	c := &s.cfg
	s.out.s(resultLine)
	s.out.bwHeader()
	if c.RunInfinitely {
		return s.rdmaBWInfinitely()
	}
	if c.Bidirectional {
		return s.rdmaBWDuplex()
	}
	if !s.client {
		return s.rdmaBWServer()
	}
	var rep Report
	seen := atomicSeen{last: map[int]uint64{}}
	for _, size := range c.sizes() {
		var done func(i, k int) error
		if c.Test.verb() == atomic {
			done = func(i, k int) error {
				off := s.lay.buf(i) + s.slotOf(k, size)
				seen.observe(s, i<<32|s.slotOf(k, size), binary.LittleEndian.Uint64(s.buf[off:]))
				return nil
			}
		}
		t, err := s.bwLoop(func(i, k int) rxego.SendWR { return s.bwWR(i, k, size) }, done)
		if err != nil {
			return err
		}
		rep = s.bwReport(size, t)
		s.out.printBW(rep)
		s.res.BW = append(s.res.BW, rep)
	}
	s.out.s(resultLine)
	if c.Test.verb() == atomic {
		s.res.What = fmt.Sprintf("each %s returned the value the previous one on the same word left", c.Atomic)
	}
	last := c.sizes()[len(c.sizes())-1]
	var checks func() []PeerCheck
	if c.Duration == 0 { // a timed run leaves work requests in flight
		checks = func() []PeerCheck { return s.rdmaClientChecks(last, seen) }
	}
	if _, err := s.ex.HandShakeHold(s.my[0], s.holdFunc(checks)); err != nil {
		return err
	}
	if _, err := s.ex.Reports(rep); err != nil {
		return err
	}
	return s.ex.Close(s.my[0], nil)
}

// rdmaBWInfinitely is --run_infinitely: the client posts and prints a
// line every Duration until ctx ends (perftest's ends with a signal); the
// server waits for the client to go away, as perftest's waits forever.
func (s *session) rdmaBWInfinitely() error {
	if !s.client {
		_, err := s.ex.HandShake(s.my[0])
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
			fmt.Fprintln(s.cfg.Out, "rxego: the client ended its endless run")
			return nil
		}
		return err
	}
	_, err := s.bwLoop(func(i, k int) rxego.SendWR { return s.bwWR(i, k, s.cfg.Size) }, nil)
	return err
}

// bwReport is the report of one bwLoop of size.
func (s *session) bwReport(size int, t bwTimes) Report {
	if !s.cfg.noPeak {
		return bwReport(size, t.posted, t.completed, s.cqMod())
	}
	return avgReport(size, t.n, t.span)
}

// rdmaBWDuplex is -b for write_bw and read_bw: per size both sides
// synchronise, post, synchronise again, and swap reports; each prints the
// sum of both (write_bw.c's duplex path). Neither side can tell its own
// memory from the peer's work requests apart, so no data checks run.
func (s *session) rdmaBWDuplex() error {
	c := &s.cfg
	for _, size := range c.sizes() {
		if _, err := s.ex.HandShake(s.my[0]); err != nil {
			return err
		}
		t, err := s.bwLoop(func(i, k int) rxego.SendWR { return s.bwWR(i, k, size) }, nil)
		if err != nil {
			return err
		}
		if c.All {
			if _, err := s.ex.HandShake(s.my[0]); err != nil {
				return err
			}
		}
		mine := s.bwReport(size, t)
		theirs, err := s.ex.Reports(mine)
		if err != nil {
			return err
		}
		both := mine
		both.BWPeak += theirs.BWPeak
		both.BWAvg += theirs.BWAvg
		both.MsgRate += theirs.MsgRate
		s.out.printBW(both)
		s.res.BW = append(s.res.BW, both)
	}
	s.out.s(resultLine)
	return s.ex.Close(s.my[0], nil)
}

// period is how many work requests of size walk through the slots before
// the walk starts again: the slots of a page, or with a post list its
// length, as perftest posts the same list of work requests (slots 0 to
// post_list-1) over and over.
func (s *session) period(size int) int {
	if s.cfg.postList > 1 {
		return s.cfg.postList
	}
	return s.lay.slots(size)
}

// slotOf is the offset of BW work request k's slot.
func (s *session) slotOf(k, size int) int { return s.lay.slot(k%s.period(size), size) }

// written is how many slots a QP's iters work requests of size touched.
func (s *session) written(size, iters int) int { return min(iters, s.period(size)) }

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
	checks := func() []PeerCheck { return s.rdmaServerChecks(last) }
	if c.Duration > 0 {
		checks = nil
	}
	if _, err := s.ex.HandShakeHold(s.my[0], s.holdFunc(checks)); err != nil {
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
	if c.Duration > 0 {
		return nil // the client's report counts a sample window, not what reached rxego's memory
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
				hits := (iters - k + s.period(size) - 1) / s.period(size)
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
	s.out.bwHeader()
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
	t, err := s.bwLoop(func(i, k int) rxego.SendWR {
		return rxego.SendWR{ID: wrID(i, k), Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
			SGL: []rxego.SGE{{Addr: s.local(i, k, size), Length: uint32(size), LKey: s.mr.LKey()}}}
	}, nil)
	if err != nil {
		return Report{}, err
	}
	return s.bwReport(size, t), nil
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
			if wc.Opcode != rxego.WCRecv || int(wc.ByteLen) != size {
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
			src := s.lay.buf(i) + s.slotOf(k, size)
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
			out = append(out, PeerCheck{Addr: s.peerBuf(i) + uint64(s.slotOf(k, size)),
				Data: bytes.Clone(s.buf[off:][:size]), What: fmt.Sprintf("QP %d: the client's source of message %d", i, k)})
		}
	}
	return out
}
