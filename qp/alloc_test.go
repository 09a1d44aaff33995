package qp

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/mr"
)

// wire is an Output that copies each emitted packet into preallocated
// buffers and parses it, ready to hand to the peer engine: a network that
// itself never allocates, so allocation counts are the engine's.
type wire struct {
	src  netip.AddrPort
	bufs [][]byte
	in   []InPacket
	seen int // packets emitted in all
	runs int // packets that were adjacent to the one before (Output contract)
	last []byte
	// scatter makes the wire a ScatterOutput; scattered counts the
	// packets that came with their payload left in registered memory, and
	// payloadRuns those whose payload was adjacent to the one before.
	scatter     bool
	scattered   int
	payloadRuns int
	lastPayload []byte
	// onEmit, if set, is called at each Emit.
	onEmit func()
}

func newWire(src netip.AddrPort) *wire {
	w := &wire{src: src, in: make([]InPacket, 0, 512)}
	for range cap(w.in) {
		w.bufs = append(w.bufs, make([]byte, MaxPacket))
	}
	return w
}

// Scatters implements ScatterOutput.
func (w *wire) Scatters() bool { return w.scatter }

func (w *wire) Emit(pkts []OutPacket) {
	if w.onEmit != nil {
		w.onEmit()
	}
	for _, p := range pkts {
		if w.last != nil && cap(w.last) > len(w.last) && &w.last[:len(w.last)+1][len(w.last)] == &p.Buf[0] {
			w.runs++
		}
		w.last = p.Buf
		b := w.bufs[len(w.in)][:len(p.Buf)+len(p.Payload)]
		if p.Payload == nil {
			copy(b, p.Buf)
		} else {
			w.scattered++
			if adjacentBytes(w.lastPayload, p.Payload) {
				w.payloadRuns++
			}
			h := bth.BTH(p.Buf).Opcode().Info().HdrLen
			copy(b, p.Buf[:h])
			copy(b[h:], p.Payload)
			copy(b[h+len(p.Payload):], p.Buf[h:])
		}
		w.lastPayload = p.Payload
		pkt, err := bth.Parse(b)
		if err != nil {
			panic(err)
		}
		w.in = append(w.in, InPacket{Pkt: pkt, Src: w.src, Dest: p.Dest.Addr()})
		w.seen++
	}
	w.last, w.lastPayload = nil, nil
}

// adjacentBytes reports whether b starts where a ends, inside a's capacity.
func adjacentBytes(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && cap(a) > len(a) && &a[:len(a)+1][len(a)] == &b[0]
}

// deliver hands what w holds to e in one batch, as a receive loop does.
func (w *wire) deliver(e *Engine) int {
	n := len(w.in)
	if n > 0 {
		e.Input(w.in)
		clear(w.in)
		w.in = w.in[:0]
	}
	return n
}

// allocPair is two engines joined by wires, with one RC QP each.
type allocPair struct {
	wa, wb *wire
	a, b   *endpoint
	amr    *mr.MR
	bmr    *mr.MR
}

func newAllocPair(t *testing.T, mtu MTU) *allocPair { return newAllocPairOut(t, mtu, false) }

// newAllocPairOut is newAllocPair with wires that are ScatterOutputs when
// scatter is set.
func newAllocPairOut(t *testing.T, mtu MTU, scatter bool) *allocPair {
	t.Helper()
	clock := &vclock{}
	p := &allocPair{}
	mk := func(addr string) (*node, *wire) {
		a := netip.MustParseAddr(addr)
		n := &node{addr: netip.AddrPortFrom(a, 4791), mrs: mr.NewTable()}
		w := newWire(n.addr)
		w.scatter = scatter
		e, err := NewEngine(Config{Local: a, Clock: clock, Out: w, MRs: n.mrs})
		if err != nil {
			t.Fatal(err)
		}
		n.e, n.pd = e, n.mrs.AllocPD()
		return n, w
	}
	na, wa := mk("10.0.0.1")
	nb, wb := mk("10.0.0.2")
	p.wa, p.wb = wa, wb
	p.a, p.b = na.newQP(t, RC, 64), nb.newQP(t, RC, 64)
	o := defaultConn()
	o.mtu = mtu
	connect(t, p.a, p.b, o)
	p.amr, _ = na.reg(t, 1<<20, allAccess)
	p.bmr, _ = nb.reg(t, 1<<20, allAccess)
	return p
}

// exchange delivers packets both ways until the wires are quiet.
func (p *allocPair) exchange(t *testing.T) {
	for range 100 {
		if p.wa.deliver(p.b.n.e)+p.wb.deliver(p.a.n.e) == 0 {
			return
		}
	}
	t.Fatal("the engines never went quiet")
}

// round posts wr on a, runs the exchange and checks one completion.
func (p *allocPair) round(t *testing.T, wr SendWR, wcs []WC) {
	if err := p.a.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	p.exchange(t)
	if n := p.a.scq.Poll(wcs); n != 1 || wcs[0].Status != WCSuccess {
		t.Fatalf("completions %d %v", n, wcs[:n])
	}
}

// TestNoAllocs checks the engine's data path allocates nothing in steady
// state: a WRITE, READ and atomic posted, segmented, received, placed,
// acknowledged and completed, on both engines together.
func TestNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, tc := range []struct {
		name string
		mtu  MTU
		wr   func(p *allocPair) SendWR
		pkts int // packets per round, both directions
	}{
		{"write-64KiB-mtu1024", MTU1024, func(p *allocPair) SendWR {
			return SendWR{Opcode: WRWrite, Flags: SendSignaled, SGL: sge(p.amr, 0, 64<<10),
				RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()}
		}, 64 + 1}, // one coalesced ACK
		{"write-64B-inline", MTU4096, func(p *allocPair) SendWR {
			return SendWR{Opcode: WRWrite, Flags: SendSignaled | SendInline, Inline: make([]byte, 64),
				RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()}
		}, 2},
		{"read-64KiB-mtu4096", MTU4096, func(p *allocPair) SendWR {
			return SendWR{Opcode: WRRead, Flags: SendSignaled, SGL: sge(p.amr, 0, 64<<10),
				RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()}
		}, 1 + 16},
		{"fetch-add", MTU1024, func(p *allocPair) SendWR {
			return SendWR{Opcode: WRFetchAdd, Flags: SendSignaled, SGL: sge(p.amr, aligned8(p.amr, 0), 8),
				RemoteAddr: p.bmr.IOVA() + uint64(aligned8(p.bmr, 0)), RKey: p.bmr.RKey(), CompareAdd: 1}
		}, 2},
	} {
		for _, scatter := range []bool{false, true} {
			name := tc.name
			if scatter {
				name += "-scatter"
			}
			t.Run(name, func(t *testing.T) {
				p := newAllocPairOut(t, tc.mtu, scatter)
				wr := tc.wr(p)
				wcs := make([]WC, 4)
				p.round(t, wr, wcs) // first use sizes the queues
				before := p.wa.seen + p.wb.seen
				if n := testing.AllocsPerRun(100, func() { p.round(t, wr, wcs) }); n != 0 {
					t.Errorf("%v allocations per round", n)
				}
				if got := (p.wa.seen + p.wb.seen - before) / 101; got != tc.pkts {
					t.Errorf("%d packets per round, want %d", got, tc.pkts)
				}
				if big := strings.Contains(tc.name, "64KiB"); (p.wa.scattered+p.wb.scattered > 0) != (scatter && big) {
					t.Errorf("%d packets scattered (scatter %v)", p.wa.scattered+p.wb.scattered, scatter)
				}
			})
		}
	}
}

// TestSlabRuns checks the Output contract the device's GSO relies on: the
// packets of one message are adjacent in memory, each Buf's capacity
// reaching over the next.
func TestSlabRuns(t *testing.T) {
	p := newAllocPair(t, MTU1024)
	wcs := make([]WC, 4)
	p.round(t, SendWR{Opcode: WRWrite, Flags: SendSignaled, SGL: sge(p.amr, 0, 64<<10),
		RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()}, wcs)
	// 64 packets in one PostSend: all but the first adjacent to the one before.
	if p.wa.runs != 63 {
		t.Errorf("%d of 64 packets adjacent to their predecessor, want 63", p.wa.runs)
	}
	// Scattered, the headers are still adjacent, and so are the payloads
	// (one SGE), so the transport coalesces them likewise.
	p = newAllocPairOut(t, MTU1024, true)
	p.round(t, SendWR{Opcode: WRWrite, Flags: SendSignaled, SGL: sge(p.amr, 0, 64<<10),
		RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()}, wcs)
	if p.wa.runs != 63 || p.wa.scattered != 64 || p.wa.payloadRuns != 63 {
		t.Errorf("scattered: %d of 64 packets scattered, %d adjacent to their predecessor, %d with adjacent payloads; want 64, 63, 63",
			p.wa.scattered, p.wa.runs, p.wa.payloadRuns)
	}
}
