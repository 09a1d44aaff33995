package transport

import (
	"net/netip"
	"sync/atomic"
	"time"
)

// Stats is a snapshot of a Conn's counters. Bytes count RoCE packets (BTH
// through ICRC), not IP or UDP headers.
type Stats struct {
	SentPackets, SentBytes uint64
	SendCalls              uint64 // sendmmsg system calls (pipe: Send calls)
	GSOSends               uint64 // datagrams sent with UDP GSO
	GSOSegments            uint64 // packets carried by those datagrams
	GSOFallbacks           uint64 // GSO sends the kernel refused (GSO then turned off)
	SendDrops              uint64 // pipe only: packets accepted but not deliverable (no such address)

	RecvPackets, RecvBytes uint64 // packets delivered by Recv
	RecvCalls              uint64 // recvmmsg system calls
	RecvDatagrams          uint64 // datagrams read (a GRO batch is one)
	GROBatches             uint64 // datagrams holding more than one packet
	GROSegments            uint64 // packets in those datagrams
	// ParkedKicks counts readers of other sockets that this Conn's reads
	// woke because those sockets held datagrams the Go runtime had not
	// reported while this Conn's reads kept finding work (kickParked).
	ParkedKicks uint64
	// Quiets counts the times Quiet took the receiving socket out of the
	// Conn's wait instances (a goroutine busy-polled it), and Rejoins the
	// times a wait that had to block put it back (Quieter).
	Quiets, Rejoins uint64
	Drops           [NumDropReasons]uint64

	GSO, GRO bool     // offloads in use
	Mode     RecvMode // receive mode in use
}

// Dropped returns the total of Drops.
func (s Stats) Dropped() uint64 {
	var t uint64
	for _, d := range s.Drops {
		t += d
	}
	return t
}

// Add adds o's counts to s, for a device over several Conns; GSO and GRO
// stay on only where both had them.
func (s *Stats) Add(o Stats) {
	s.SentPackets += o.SentPackets
	s.SentBytes += o.SentBytes
	s.SendCalls += o.SendCalls
	s.GSOSends += o.GSOSends
	s.GSOSegments += o.GSOSegments
	s.GSOFallbacks += o.GSOFallbacks
	s.SendDrops += o.SendDrops
	s.RecvPackets += o.RecvPackets
	s.RecvBytes += o.RecvBytes
	s.RecvCalls += o.RecvCalls
	s.RecvDatagrams += o.RecvDatagrams
	s.GROBatches += o.GROBatches
	s.GROSegments += o.GROSegments
	s.ParkedKicks += o.ParkedKicks
	s.Quiets += o.Quiets
	s.Rejoins += o.Rejoins
	for i, d := range o.Drops {
		s.Drops[i] += d
	}
	s.GSO = s.GSO && o.GSO
	s.GRO = s.GRO && o.GRO
}

// counters are the live, atomically updated Stats. Each data path adds its
// batch totals once per batch, so the atomics cost little.
type counters struct {
	sentPackets, sentBytes, sendCalls      atomic.Uint64
	gsoSends, gsoSegments, gsoFallbacks    atomic.Uint64
	sendDrops                              atomic.Uint64
	recvPackets, recvBytes, recvCalls      atomic.Uint64
	recvDatagrams, groBatches, groSegments atomic.Uint64
	parkedKicks                            atomic.Uint64
	drops                                  [NumDropReasons]atomic.Uint64
}

func (c *counters) snapshot() Stats {
	s := Stats{
		SentPackets:   c.sentPackets.Load(),
		SentBytes:     c.sentBytes.Load(),
		SendCalls:     c.sendCalls.Load(),
		GSOSends:      c.gsoSends.Load(),
		GSOSegments:   c.gsoSegments.Load(),
		GSOFallbacks:  c.gsoFallbacks.Load(),
		SendDrops:     c.sendDrops.Load(),
		RecvPackets:   c.recvPackets.Load(),
		RecvBytes:     c.recvBytes.Load(),
		RecvCalls:     c.recvCalls.Load(),
		RecvDatagrams: c.recvDatagrams.Load(),
		GROBatches:    c.groBatches.Load(),
		GROSegments:   c.groSegments.Load(),
		ParkedKicks:   c.parkedKicks.Load(),
	}
	for i := range c.drops {
		s.Drops[i] = c.drops[i].Load()
	}
	return s
}

// tapHolder lets SetTap swap the Tap atomically; a nil holder is "no tap",
// one pointer load on the data path.
type tapHolder struct{ t Tap }

// TapSlot holds a Conn's Tap, swapped atomically by SetTap and read with
// one pointer load per batch on the data path. A Conn of another package
// (the impairment shim) keeps its Tap in one too.
type TapSlot struct{ p atomic.Pointer[tapHolder] }

// Set installs t (nil removes it).
func (s *TapSlot) Set(t Tap) {
	if t == nil {
		s.p.Store(nil)
		return
	}
	s.p.Store(&tapHolder{t})
}

// Get returns the Tap and a timestamp for the batch, or nil.
func (s *TapSlot) Get() (Tap, time.Time) {
	h := s.p.Load()
	if h == nil {
		return nil, time.Time{}
	}
	return h.t, time.Now()
}

// dropRec is a dropped packet kept until the Tap can be called, after the
// receive lock is released.
type dropRec struct {
	reason DropReason
	peer   netip.AddrPort
	tos    uint8
	pkt    []byte
}

// traffic is how many packets and bytes the Conn has sent and received:
// a wait after little since the last is a round trip's (directWait).
func (c *counters) traffic() (packets, bytes uint64) {
	return c.sentPackets.Load() + c.recvPackets.Load(), c.sentBytes.Load() + c.recvBytes.Load()
}
