// Package impair is the seeded impairment shim: Wrap puts loss, bursts,
// duplication, reordering, delay, corruption and CE marking between an
// engine and any transport.Conn, each decision drawn from one PCG stream
// per direction seeded by Config.Seed, so the same packets in the same
// order meet the same fate. Tests, the reliability suite and the demo use
// it; it lives beside the production transport, not in it.
package impair

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/transport"
)

// Dir selects the directions an impaired Conn impairs.
type Dir uint8

// Impairment directions.
const (
	Recv Dir = 1 << iota // received packets, after the inner Conn verified them
	Send                 // sent packets, before the inner Conn sends them
	Both = Recv | Send
)

// Defaults of Config.
const (
	DefaultReorderTimeout = 10 * time.Millisecond
	DefaultQueue          = 4096
)

// Config describes what an impaired Conn does to packets. Every
// probability is per packet, in [0, 1]; every decision comes from one
// PCG stream per direction seeded with Seed, so the same packets in the
// same order meet the same fate.
type Config struct {
	Seed uint64
	Dir  Dir // 0 means Recv

	Loss float64 // independent random loss
	// BurstEnter and BurstExit make a Gilbert-Elliott channel: before each
	// packet it moves from good to bad with probability BurstEnter and from
	// bad to good with BurstExit; every packet in the bad state is lost
	// (mean burst length 1/BurstExit). BurstEnter 0 turns it off.
	BurstEnter, BurstExit float64
	Duplicate             float64 // the packet is delivered twice
	// Reorder holds a packet back until the next one has passed (a swap),
	// or for ReorderTimeout (0 means DefaultReorderTimeout) if none comes.
	Reorder        float64
	ReorderTimeout time.Duration
	// Every packet waits Delay plus a uniform random part of Jitter;
	// jitter alone can reorder.
	Delay, Jitter time.Duration
	// Corrupt flips the bits of one random byte between the BTH and the
	// ICRC (in the BTH of a packet with nothing else, never byte 4, which
	// the ICRC does not cover), leaving the ICRC alone: the receiver must
	// catch it. Received packets are checked again after corruption, as
	// the Conn would have. Sent ones are corrupted after their ICRC is
	// computed; that needs a Conn of this package (Listen, PipeNetwork):
	// for another Conn, corrupted sends are dropped instead.
	Corrupt float64
	// CE sets the ECN field of ECN-capable packets (ECT(0) or ECT(1)) to
	// CE (3), as a congested switch would. Packets that are not
	// ECN-capable, or sent with TOS 0 (the Conn default), are left alone.
	CE float64
	// QueueLen bounds the packets held for delay or reordering; 0 means
	// DefaultQueue. Packets beyond it are dropped and counted.
	QueueLen int
}

// Counts count what an impaired Conn did in one direction.
type Counts struct {
	Seen       uint64 // packets that entered
	Lost       uint64 // dropped by Loss
	BurstLost  uint64 // dropped in a burst
	Duplicated uint64
	Reordered  uint64
	Delayed    uint64
	Corrupted  uint64
	CEMarked   uint64
	QueueDrops uint64 // dropped because the queue was full
	Passed     uint64 // left the queue (duplicates and corrupted ones included)
}

// Stats are an impaired Conn's counters by direction.
type Stats struct {
	Send, Recv Counts
}

// Conn wraps a transport.Conn with loss, bursts, duplication, reordering, delay,
// corruption and CE marking, for tests. Send-side delays are served by a
// timer goroutine and receive-side ones by a goroutine reading the inner
// Conn; both stop on Close.
type Conn struct {
	inner  transport.Conn
	ep     *transport.ICRCs
	filled transport.FilledSender // nil when the inner Conn is not ours
	send   *stage
	recv   *stage
	tap    transport.TapSlot
	drops  [transport.NumDropReasons]atomic.Uint64 // receive-side corruption caught
	done   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup

	smu    sync.Mutex // serialises inner sends
	sbatch []transport.Message
	sitems []*item

	rmu   sync.Mutex
	cur   []*item // delivered by the last Recv, recycled by the next
	timer *time.Timer
}

// Wrap wraps c. The returned Conn owns c: closing it closes c.
func Wrap(c transport.Conn, cfg Config) *Conn {
	if cfg.Dir == 0 {
		cfg.Dir = Recv
	}
	if cfg.ReorderTimeout <= 0 {
		cfg.ReorderTimeout = DefaultReorderTimeout
	}
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = DefaultQueue
	}
	im := &Conn{inner: c, ep: transport.NewICRCs(c.LocalAddr()), done: make(chan struct{})}
	im.filled, _ = c.(transport.FilledSender)
	if cfg.Dir&Send != 0 {
		im.send = newStage(cfg, 2)
		im.wg.Add(1)
		go im.sendLoop()
	}
	if cfg.Dir&Recv != 0 {
		im.recv = newStage(cfg, 1)
		im.timer = time.NewTimer(time.Hour)
		im.timer.Stop()
		im.wg.Add(1)
		go im.pump()
	}
	return im
}

// LocalAddr implements Conn.
func (c *Conn) LocalAddr() netip.AddrPort { return c.inner.LocalAddr() }

// SetTap implements Conn: the inner Conn shows packets as it sends and
// receives them; the impaired Conn shows the corrupted ones it drops.
func (c *Conn) SetTap(t transport.Tap) {
	c.tap.Set(t)
	c.inner.SetTap(t)
}

// Stats implements Conn: the inner Conn's counters plus the received
// packets this Conn corrupted and then dropped.
func (c *Conn) Stats() transport.Stats {
	s := c.inner.Stats()
	for i := range c.drops {
		s.Drops[i] += c.drops[i].Load()
	}
	return s
}

// ImpairStats returns what the impairments did so far.
func (c *Conn) ImpairStats() Stats {
	var s Stats
	if c.send != nil {
		s.Send = c.send.counts()
	}
	if c.recv != nil {
		s.Recv = c.recv.counts()
	}
	return s
}

// Close implements Conn: it closes the inner Conn, discards held packets
// and waits for the goroutines to stop.
func (c *Conn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		close(c.done)
		err = c.inner.Close()
	})
	c.wg.Wait()
	return err
}

func (c *Conn) isClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Send implements Conn. With send impairments the packets are copied
// (their ICRCs computed first, so corruption comes after) and sent as
// separate datagrams, now or when their delay is up; errors of delayed
// sends are not reported.
func (c *Conn) Send(msgs []transport.Message) (int, error) {
	if c.send == nil {
		return c.inner.Send(msgs)
	}
	if c.isClosed() {
		return 0, net.ErrClosed
	}
	s := c.send
	var err error
	n := len(msgs)
	s.mu.Lock()
	now := time.Now()
	for i := range msgs {
		m := &msgs[i]
		peer, ok := c.ep.Peer(m.Peer)
		if !ok {
			n, err = i, fmt.Errorf("%w: %v", transport.ErrPeer, m.Peer)
			break
		}
		if m.Payload != nil {
			n, err = i, transport.ErrScattered // not a Scatterer
			break
		}
		k, e := c.ep.RunSegments(len(m.Buf), m.Seg)
		if e != nil {
			n, err = i, e
			break
		}
		seg := m.Seg
		if k == 1 {
			seg = len(m.Buf)
		}
		for off := 0; off < len(m.Buf); off += seg {
			p := m.Buf[off:min(off+seg, len(m.Buf))]
			c.ep.Fill(p, peer, 0) // sent alone, it will carry ID 0
			s.admit(p, nil, peer, m.TOS, 0, now)
		}
	}
	s.mu.Unlock()
	c.flushSend()
	return n, err
}

// flushSend sends the packets whose time has come.
func (c *Conn) flushSend() {
	s := c.send
	c.smu.Lock()
	defer c.smu.Unlock()
	s.mu.Lock()
	s.popDue(time.Now(), -1, func(it *item) {
		c.sitems = append(c.sitems, it)
		if it.corrupt && c.filled == nil {
			return // the inner Conn would recompute the ICRC: drop instead
		}
		c.sbatch = append(c.sbatch, transport.Message{Buf: it.buf, Peer: it.peer, TOS: it.tos})
	})
	s.mu.Unlock()
	if len(c.sbatch) > 0 {
		if c.filled != nil {
			c.filled.SendFilled(c.sbatch)
		} else {
			c.inner.Send(c.sbatch)
		}
	}
	s.mu.Lock()
	for _, it := range c.sitems {
		s.recycle(it)
	}
	s.mu.Unlock()
	clear(c.sbatch)
	c.sbatch, c.sitems = c.sbatch[:0], c.sitems[:0]
	s.signal() // the timer goroutine re-arms for what is left
}

// sendLoop sends delayed and held-back packets when they are due.
func (c *Conn) sendLoop() {
	defer c.wg.Done()
	s := c.send
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		s.mu.Lock()
		next := s.nextDue()
		s.mu.Unlock()
		t.Stop()
		if !next.IsZero() {
			t.Reset(time.Until(next))
		}
		select {
		case <-c.done:
			return
		case <-s.wake:
		case <-t.C:
			c.flushSend()
		}
	}
}

// pump reads the inner Conn and feeds the receive stage until it closes.
func (c *Conn) pump() {
	defer c.wg.Done()
	s := c.recv
	buf := make([]transport.Message, 64)
	for {
		n, err := c.inner.Recv(buf)
		s.mu.Lock()
		now := time.Now()
		for i := range buf[:n] {
			m := &buf[i]
			s.admit(m.Buf, m.Pkt.Info, m.Peer, m.TOS, m.IPID, now)
		}
		if err != nil {
			s.err = err
		}
		s.mu.Unlock()
		s.signal()
		if err != nil {
			return
		}
	}
}

// Recv implements Conn.
func (c *Conn) Recv(msgs []transport.Message) (int, error) {
	if c.recv == nil {
		return c.inner.Recv(msgs)
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	s := c.recv
	c.rmu.Lock()
	defer c.rmu.Unlock()
	s.mu.Lock()
	for _, it := range c.cur {
		s.recycle(it)
	}
	s.mu.Unlock()
	clear(c.cur)
	c.cur = c.cur[:0]
	var drops []*item
	for {
		if c.isClosed() {
			return 0, net.ErrClosed
		}
		n := 0
		drops = drops[:0]
		s.mu.Lock()
		s.popDue(time.Now(), len(msgs), func(it *item) {
			pk := bth.Packet{Raw: it.buf, Info: it.info}
			if it.corrupt {
				var reason transport.DropReason
				var ok bool
				if pk, reason, ok = c.ep.Check(it.buf, it.peer, it.id); !ok {
					c.drops[reason].Add(1)
					drops = append(drops, it)
					return
				}
			}
			msgs[n] = transport.Message{Buf: it.buf, Pkt: pk, Peer: it.peer, TOS: it.tos, IPID: it.id}
			c.cur = append(c.cur, it)
			n++
		})
		err, next := s.err, s.nextDue()
		s.mu.Unlock()
		if tap, at := c.tap.Get(); tap != nil {
			for _, it := range drops {
				tap.Drop(transport.DropBadICRC, at, c.ep.Local(), it.peer, it.tos, it.buf)
			}
		}
		if len(drops) > 0 {
			s.mu.Lock()
			for _, it := range drops {
				s.recycle(it)
			}
			s.mu.Unlock()
		}
		if n > 0 {
			return n, nil
		}
		if err != nil && next.IsZero() {
			return 0, err
		}
		c.timer.Stop()
		if !next.IsZero() {
			c.timer.Reset(time.Until(next))
		}
		select {
		case <-c.done:
			return 0, net.ErrClosed
		case <-s.wake:
		case <-c.timer.C:
		}
	}
}

// item is a packet held by a stage, in a buffer of its own.
type item struct {
	buf     []byte
	info    *bth.Info // the opcode's row, from the inner Conn's parse (receive side)
	peer    netip.AddrPort
	tos     uint8
	id      uint16
	due     time.Time
	seq     uint64
	corrupt bool
}

// stage applies the impairments of one direction and holds packets until
// they are due. Its fields are guarded by mu.
type stage struct {
	cfg  Config
	rng  *rand.Rand
	wake chan struct{}

	mu   sync.Mutex
	bad  bool // Gilbert-Elliott state
	q    []*item
	held *item
	seq  uint64
	free []*item
	ctr  Counts
	err  error // receive side: the inner Conn's last error
}

func newStage(cfg Config, stream uint64) *stage {
	return &stage{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, stream)), wake: make(chan struct{}, 1)}
}

func (s *stage) counts() Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctr
}

// signal wakes whoever waits on the stage, without blocking.
func (s *stage) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *stage) chance(p float64) bool { return p > 0 && s.rng.Float64() < p }

// admit decides the fate of one packet and queues what survives.
func (s *stage) admit(pkt []byte, info *bth.Info, peer netip.AddrPort, tos uint8, id uint16, now time.Time) {
	s.ctr.Seen++
	if s.cfg.BurstEnter > 0 {
		if s.bad {
			s.bad = !s.chance(s.cfg.BurstExit)
		} else {
			s.bad = s.chance(s.cfg.BurstEnter)
		}
		if s.bad {
			s.ctr.BurstLost++
			return
		}
	}
	if s.chance(s.cfg.Loss) {
		s.ctr.Lost++
		return
	}
	copies := 1
	if s.chance(s.cfg.Duplicate) {
		copies = 2
		s.ctr.Duplicated++
	}
	for range copies {
		if len(s.q) >= s.cfg.QueueLen {
			s.ctr.QueueDrops++
			continue
		}
		it := s.get(len(pkt))
		copy(it.buf, pkt)
		it.peer, it.tos, it.id, it.info = peer, tos, id, info
		if s.chance(s.cfg.Corrupt) {
			s.corrupt(it.buf)
			it.corrupt = true
			s.ctr.Corrupted++
		}
		if s.chance(s.cfg.CE) && (tos&3 == 1 || tos&3 == 2) {
			it.tos |= 3
			s.ctr.CEMarked++
		}
		it.due = now.Add(s.cfg.Delay)
		if s.cfg.Jitter > 0 {
			it.due = it.due.Add(time.Duration(s.rng.Int64N(int64(s.cfg.Jitter))))
		}
		if s.cfg.Delay > 0 || s.cfg.Jitter > 0 {
			s.ctr.Delayed++
		}
		if s.held == nil && s.chance(s.cfg.Reorder) {
			it.due = it.due.Add(s.cfg.ReorderTimeout)
			s.held = it
			s.ctr.Reordered++
			continue
		}
		s.push(it)
		if h := s.held; h != nil {
			// The held packet goes right after this one.
			s.held = nil
			h.due = it.due
			s.push(h)
		}
	}
}

// corrupt flips one byte after the BTH (or in it, but for byte 4, when
// the packet has nothing else) and before the ICRC.
func (s *stage) corrupt(b []byte) {
	lo, n := 12, len(b)-4-12
	if n <= 0 {
		lo, n = 0, 11
	}
	i := lo + s.rng.IntN(n)
	if lo == 0 && i >= 4 {
		i++ // skip byte 4: FECN, BECN, reserved, masked by the ICRC
	}
	b[i] ^= byte(1 + s.rng.IntN(255))
}

// push inserts an item in (due, seq) order.
func (s *stage) push(it *item) {
	s.seq++
	it.seq = s.seq
	i := sort.Search(len(s.q), func(i int) bool { return s.q[i].due.After(it.due) })
	s.q = append(s.q, nil)
	copy(s.q[i+1:], s.q[i:])
	s.q[i] = it
}

// popDue hands out, in order, up to limit (-1: all) items due at now. A
// held-back packet whose timeout passed is released first.
func (s *stage) popDue(now time.Time, limit int, out func(*item)) {
	if h := s.held; h != nil && !h.due.After(now) {
		s.held = nil
		s.push(h)
	}
	n := 0
	for n < len(s.q) && (limit < 0 || n < limit) && !s.q[n].due.After(now) {
		s.ctr.Passed++
		out(s.q[n])
		n++
	}
	rest := copy(s.q, s.q[n:])
	clear(s.q[rest:])
	s.q = s.q[:rest]
}

// nextDue is when the next item is due, or zero if none is held.
func (s *stage) nextDue() time.Time {
	var t time.Time
	if len(s.q) > 0 {
		t = s.q[0].due
	}
	if s.held != nil && (t.IsZero() || s.held.due.Before(t)) {
		t = s.held.due
	}
	return t
}

func (s *stage) get(n int) *item {
	if k := len(s.free); k > 0 {
		it := s.free[k-1]
		s.free = s.free[:k-1]
		if cap(it.buf) >= n {
			it.buf = it.buf[:n]
			return it
		}
	}
	return &item{buf: make([]byte, n)}
}

func (s *stage) recycle(it *item) {
	it.corrupt = false
	if len(s.free) < s.cfg.QueueLen {
		s.free = append(s.free, it)
	}
}
