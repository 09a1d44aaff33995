package perftest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"runtime"
	"time"

	"github.com/rxego/rxego"
)

// latHeader prints the latency table's header.
func (s *session) latHeader() {
	s.out.s(resultLine)
	s.out.s(resultFmtLat)
}

// addLat records and prints one latency line.
func (s *session) addLat(size int, posted []time.Duration, roundTrip bool) {
	st := latStats(size, posted, roundTrip)
	s.out.printLat(st)
	s.res.Lat = append(s.res.Lat, st)
}

// waitSend waits for one send completion.
func (s *session) waitSend() error {
	wcs := make([]rxego.WC, 1)
	_, err := s.poll(s.scq, wcs)
	return err
}

// sendLat runs ib_send_lat: per size both sides post their receives and
// synchronise, then ping-pong SENDs, the client first (run_iter_lat_send).
// Every message received must equal the first one (perftest sends the same
// buffer each time).
func (s *session) sendLat() error {
	c := &s.cfg
	s.latHeader()
	recvOff := s.lay.recvBase(0)
	var size int
	for _, size = range c.sizes() {
		posted := 0
		for ; posted < min(c.RxDepth, c.Iters); posted++ {
			if err := s.postRecv(0, posted, recvOff, size); err != nil {
				return err
			}
		}
		if _, err := s.ex.HandShake(s.my[0]); err != nil {
			return err
		}
		times := make([]time.Duration, 0, c.Iters)
		var first []byte
		wcs := make([]rxego.WC, 1)
		start := time.Now()
		for scnt, rcnt := 0, 0; scnt < c.Iters || rcnt < c.Iters; {
			if rcnt < c.Iters && !(scnt < 1 && s.client) {
				if _, err := s.poll(s.rcq, wcs); err != nil {
					return fmt.Errorf("%w (sent %d, received %d)", err, scnt, rcnt)
				}
				rcnt++
				got := s.buf[recvOff:][:size]
				s.res.Checked++
				if int(wcs[0].ByteLen) != size || first != nil && !bytes.Equal(got, first) {
					s.res.Mismatches++
				}
				if first == nil {
					first = bytes.Clone(got)
				}
				if rcnt+c.RxDepth <= c.Iters {
					if err := s.postRecv(0, posted, recvOff, size); err != nil {
						return err
					}
					posted++
				}
			}
			if scnt < c.Iters {
				times = append(times, time.Since(start))
				scnt++
				err := s.qps[0].PostSend(rxego.SendWR{ID: wrID(0, scnt), Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
					SGL: []rxego.SGE{{Addr: s.local(0, 0, size), Length: uint32(size), LKey: s.mr.LKey()}}})
				if err != nil {
					return err
				}
				if err := s.waitSend(); err != nil {
					return err
				}
			}
		}
		s.addLat(size, times, true)
	}
	s.out.s(resultLine)
	s.res.What = "every message received was the peer's same send buffer"
	peer0 := s.peerBuf(0)
	return s.closeHold(func() []PeerCheck {
		return []PeerCheck{
			{Addr: peer0 - uint64(s.lay.buf(0)) + uint64(recvOff), Data: bytes.Clone(s.buf[s.lay.buf(0):][:size]),
				What: "the peer's receive buffer: rxego's message"},
			{Addr: peer0, Data: bytes.Clone(s.buf[recvOff:][:size]), What: "the peer's send buffer: what rxego received"},
		}
	})
}

// writeLat runs ib_write_lat: both sides RDMA WRITE size bytes into the
// other's buffer, the last byte carrying the iteration count, and wait
// for the peer's write before the next one; the server starts
// (run_iter_lat_write). perftest's buffers are zero, so every write rxego
// receives must be zeros then the count (see writeLatExpect for -a). perftest ends write_lat without
// a final synchronisation, so there is no hold point.
func (s *session) writeLat() error {
	c := &s.cfg
	s.latHeader()
	base := s.rcvdBase
	if s.cm != nil {
		base += s.cm.ch.received
	}
	var arrived uint64 // payload bytes the peer's writes brought so far
	pollOff := s.lay.vaddr(0)
	for _, size := range c.sizes() {
		post := s.lay.buf(0) + size - 1
		want := s.writeLatExpect(size)
		times := make([]time.Duration, 0, c.Iters)
		start := time.Now()
		for scnt, ccnt, rcnt := 0, 0, 0; scnt < c.Iters || ccnt < c.Iters || rcnt < c.Iters; {
			if rcnt < c.Iters && !(scnt < 1 && !s.client) {
				rcnt++
				arrived += uint64(size)
				if err := s.waitBytes(base + arrived); err != nil {
					return fmt.Errorf("%w (sent %d, received %d)", err, scnt, rcnt-1)
				}
				want[size-1] = byte(rcnt)
				s.res.Checked++
				if !bytes.Equal(s.buf[pollOff:][:size], want) {
					s.res.Mismatches++
				}
			}
			if scnt < c.Iters {
				times = append(times, time.Since(start))
				scnt++
				s.buf[post] = byte(scnt)
				err := s.qps[0].PostSend(rxego.SendWR{ID: wrID(0, scnt), Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
					SGL:        []rxego.SGE{{Addr: s.mr.IOVA() + uint64(s.lay.buf(0)), Length: uint32(size), LKey: s.mr.LKey()}},
					RemoteAddr: s.rem[0].VAddr, RKey: s.rem[0].RKey})
				if err != nil {
					return err
				}
			}
			if ccnt < c.Iters {
				if err := s.waitSend(); err != nil {
					return err
				}
				ccnt++
			}
		}
		s.addLat(size, times, true)
	}
	s.out.s(resultLine)
	s.res.What = "every RDMA WRITE received was zeros ending in the iteration count"
	return nil
}

// waitBytes waits until the engine has accepted total payload bytes, then
// synchronises with it, so the peer's WRITE is complete in memory and
// reading it is ordered after the engine's copy (the peer writes again
// only after rxego's next write). This replaces perftest's volatile poll
// on the last byte, which in Go would race with the engine.
func (s *session) waitBytes(total uint64) error {
	rcvd := func() uint64 { return s.dev.Stats().RcvdBytes }
	start := time.Now()
	for rcvd() < total {
		if err := s.ctx.Err(); err != nil {
			return fmt.Errorf("perftest: waiting for the peer's RDMA WRITE (have %d of %d bytes): %w", rcvd(), total, err)
		}
		// Spin briefly for latency, then sleep so the engine gets the CPU.
		if time.Since(start) < spinFor {
			runtime.Gosched()
		} else {
			time.Sleep(spinSleep)
		}
	}
	s.dev.Sync()
	return nil
}

// How waitBytes waits: spinning for spinFor, then in spinSleep steps.
const (
	spinFor   = 200 * time.Microsecond
	spinSleep = 20 * time.Microsecond
)

// writeLatExpect returns what the peer's write_lat writes of size bytes
// hold, but for the last byte (the count): zeros, except that with -a the
// count bytes of the smaller sizes stay in its send buffer (at size-1 of
// each, holding the iteration count).
func (s *session) writeLatExpect(size int) []byte {
	b := make([]byte, size)
	for _, prev := range s.cfg.sizes() {
		if prev >= size {
			break
		}
		b[prev-1] = byte(s.cfg.Iters)
	}
	return b
}

// readAtomicLat runs ib_read_lat or ib_atomic_lat: the client posts one
// READ or atomic at a time and waits for it (run_iter_lat); the server
// only waits for the client's closing handshake.
func (s *session) readAtomicLat() error {
	c := &s.cfg
	sizes := c.sizes()
	last := sizes[len(sizes)-1]
	if !s.client {
		if err := s.closeHold(func() []PeerCheck { return s.latServerChecks(last) }); err != nil {
			return err
		}
		s.out.s(resultLine)
		s.dev.Sync()
		s.checkLatServerMemory()
		return nil
	}
	s.latHeader()
	local := s.lay.buf(0)
	var first []byte
	var lastVal uint64
	wcs := make([]rxego.WC, 1)
	for _, size := range sizes {
		times := make([]time.Duration, 0, c.Iters)
		first = nil
		start := time.Now()
		for k := 0; k < c.Iters; k++ {
			times = append(times, time.Since(start))
			if err := s.qps[0].PostSend(s.bwWR(0, 0, size)); err != nil {
				return err
			}
			if _, err := s.poll(s.scq, wcs); err != nil {
				return fmt.Errorf("%w (%d of %d done)", err, k, c.Iters)
			}
			got := s.buf[local:][:size]
			if c.Test.verb() == atomic {
				v := binary.LittleEndian.Uint64(got)
				if k > 0 {
					want := lastVal
					if c.Atomic == FetchAndAdd {
						want += atomicAdd
					}
					s.res.Checked++
					if v != want {
						s.res.Mismatches++
					}
				}
				lastVal = v
				continue
			}
			if first != nil {
				s.res.Checked++
				if !bytes.Equal(got, first) {
					s.res.Mismatches++
				}
			} else {
				first = bytes.Clone(got)
			}
		}
		s.addLat(size, times, false)
	}
	s.out.s(resultLine)
	if c.Test.verb() == atomic {
		s.res.What = fmt.Sprintf("each %s returned the value the previous one left", c.Atomic)
	} else {
		s.res.What = "every READ of the same bytes returned the same data"
	}
	return s.closeHold(func() []PeerCheck {
		data := bytes.Clone(s.buf[local:][:last])
		what := "the peer's buffer: what rxego read"
		if c.Test.verb() == atomic {
			if c.Atomic == FetchAndAdd {
				lastVal += atomicAdd
			}
			data = binary.LittleEndian.AppendUint64(nil, lastVal)
			what = "the peer's word after rxego's last " + string(c.Atomic)
		}
		return []PeerCheck{{Addr: s.rem[0].VAddr, Data: data, What: what}}
	})
}

// latServerChecks says what the client's buffer holds after its READs or
// atomics on rxego's: the bytes it read, or the value it last fetched.
func (s *session) latServerChecks(size int) []PeerCheck {
	c := &s.cfg
	mine := s.buf[s.lay.vaddr(0):][:size]
	pc := PeerCheck{Addr: s.peerBuf(0), Data: bytes.Clone(mine), What: "the client's buffer: what it read from rxego"}
	if c.Test.verb() == atomic {
		v := binary.LittleEndian.Uint64(mine)
		if c.Atomic == FetchAndAdd {
			v -= atomicAdd
		}
		pc.Data = binary.LittleEndian.AppendUint64(nil, v)
		pc.What = "the client's word: the value its last " + string(c.Atomic) + " fetched"
	}
	return []PeerCheck{pc}
}

// checkLatServerMemory checks rxego's buffer after the client's READs
// (unchanged) or -n atomics on its first word (moved by -n for
// FETCH_AND_ADD, unchanged for CMP_AND_SWAP; the rest unchanged). The
// server learns the count from its own -n, which must match the client's.
func (s *session) checkLatServerMemory() {
	c := &s.cfg
	word := s.lay.vaddr(0)
	want := bytes.Clone(s.fill)
	if c.Test.verb() == atomic && c.Atomic == FetchAndAdd {
		v := binary.LittleEndian.Uint64(want[word:]) + uint64(c.Iters)*atomicAdd
		binary.LittleEndian.PutUint64(want[word:], v)
	}
	s.res.Checked++
	if !bytes.Equal(s.buf, want) {
		s.res.Mismatches++
	}
	if c.Test.verb() == atomic {
		s.res.What = fmt.Sprintf("rxego's word moved by exactly %d %ss as -n says, nothing else changed", c.Iters, c.Atomic)
	} else {
		s.res.What = "the client's READs changed no byte of rxego's memory"
	}
}
