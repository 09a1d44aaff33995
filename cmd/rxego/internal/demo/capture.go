package demo

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/rxego/rxego/internal/app/devstats"
	"github.com/rxego/rxego/internal/app/ladder"
	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/transport"
	"github.com/rxego/rxego/transport/pcaptap"
)

// note is an annotation for the current scenario's ladder.
type note struct {
	at   time.Time
	text string
}

// annotate adds a note at the current time to the scenario's ladder.
func (t *Tour) annotate(format string, args ...any) {
	t.notes = append(t.notes, note{time.Now(), fmt.Sprintf(format, args...)})
}

// Quiet time and its bound before a scenario's capture is closed: the
// last ACK may still be on its way.
const (
	settleQuiet = 20 * time.Millisecond
	settleMax   = time.Second
)

// runCaptured runs scenario s, recording Alice's packets into
// PcapDir/NAME.pcapng when a PcapDir is set, then draws the capture's
// ladder.
func (t *Tour) runCaptured(s Scenario) error {
	t.notes, t.tap, t.header, t.capturedOn = nil, t.opts.Tap, "", nil
	if t.opts.PcapDir == "" {
		return s.run(t)
	}
	path := filepath.Join(t.opts.PcapDir, s.Name+".pcapng")
	w, err := pcaptap.Create(path)
	if err != nil {
		return err
	}
	t.capturedOn = &localAddrs{}
	t.tap = tee{w, t.opts.Tap, t.capturedOn}
	t.a.dev.SetTap(t.tap)
	runErr := s.run(t)
	devstats.Settle(t.a.dev, settleQuiet, settleMax)
	t.a.dev.SetTap(t.opts.Tap)
	if err := w.Close(); runErr == nil && err != nil {
		runErr = fmt.Errorf("writing %s: %w", path, err)
	}
	if runErr != nil {
		return runErr
	}
	return t.drawLadder(path)
}

// drawLadder prints the ladder of a scenario's capture.
func (t *Tour) drawLadder(path string) error {
	b := ladder.NewBuilder()
	if err := trace.ReadFile(path, b.Add); err != nil {
		return fmt.Errorf("reading back %s: %w", path, err)
	}
	tr := b.Finish()
	alice := t.a.endpoint()
	for _, n := range t.notes {
		tr.Annotate(n.at, &alice, n.text)
	}
	o := t.opts.Ladder
	if t.capturedOn != nil {
		o.CapturedOn = t.capturedOn.list()
	}
	switch {
	case o.MaxRows == 0:
		o.MaxRows = DefaultLadderRows
	case o.MaxRows < 0:
		o.MaxRows = 0
	}
	if t.header != "" {
		fmt.Fprintf(t.out, "\nWhat went over the wire, as %s:\n", t.header)
	} else {
		fmt.Fprintf(t.out, "\nWhat went over the wire, as %s's device saw it (A is %s at %v, B is %s at %v):\n",
			t.a.name, t.a.name, t.a.dev.Addr().Addr(), t.b.name, t.b.dev.Addr().Addr())
	}
	if err := ladder.WriteText(t.out, tr, o); err != nil {
		return err
	}
	fmt.Fprintf(t.out, "\nCapture: %s (Wireshark opens it; so does: rxego trace --ladder %s)\n", path, path)
	return nil
}

// DefaultLadderRows is how many rows of a scenario's ladder are drawn
// before it is folded (Options.Ladder.MaxRows 0).
const DefaultLadderRows = 60

// endpoint is the ladder endpoint of e's QP.
func (e *end) endpoint() ladder.Endpoint {
	return ladder.Endpoint{Addr: e.dev.Addr().Addr(), QPN: e.qp.Num(), QPNKnown: true}
}

// tee shows packets to several Taps; nil entries are skipped.
type tee []transport.Tap

// Packet implements transport.Tap.
func (ts tee) Packet(dir transport.Dir, at time.Time, local, remote netip.AddrPort, tos uint8, ipID uint16, pkt []byte) {
	for _, t := range ts {
		if t != nil {
			t.Packet(dir, at, local, remote, tos, ipID, pkt)
		}
	}
}

// Drop implements transport.Tap.
func (ts tee) Drop(reason transport.DropReason, at time.Time, local, remote netip.AddrPort, tos uint8, pkt []byte) {
	for _, t := range ts {
		if t != nil {
			t.Drop(reason, at, local, remote, tos, pkt)
		}
	}
}

// localAddrs is a Tap that notes the local addresses of the packets it
// sees: the devices a capture was taken on, for the ladder's RTT column.
type localAddrs struct {
	mu    sync.Mutex
	addrs []netip.Addr
}

func (l *localAddrs) add(a netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !slices.Contains(l.addrs, a) {
		l.addrs = append(l.addrs, a)
	}
}

// list returns the addresses seen.
func (l *localAddrs) list() []netip.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.addrs)
}

// Packet implements transport.Tap.
func (l *localAddrs) Packet(_ transport.Dir, _ time.Time, local, _ netip.AddrPort, _ uint8, _ uint16, _ []byte) {
	l.add(local.Addr().Unmap())
}

// Drop implements transport.Tap.
func (l *localAddrs) Drop(_ transport.DropReason, _ time.Time, local, _ netip.AddrPort, _ uint8, _ []byte) {
	l.add(local.Addr().Unmap())
}
