package transport_test

import (
	"errors"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/rxego/rxego/transport"
	"github.com/rxego/rxego/transport/impair"
)

// impairedPair returns a pipe transport.Conn a and an Impaired transport.Conn around b.
func impairedPair(t testing.TB, cfg impair.Config) (transport.Conn, *impair.Conn) {
	t.Helper()
	n := transport.NewPipeNetwork()
	n.QueueLen = 1 << 14
	a, b := transport.PipePair(t, n, "10.0.0.1:4791", "10.0.0.2:4791")
	im := impair.Wrap(b, cfg)
	t.Cleanup(func() { im.Close() })
	return a, im
}

// sendSeq sends count packets with PSNs 0..count-1 from a to peer, a
// batch at a time.
func sendSeq(t testing.TB, a transport.Conn, peer netip.AddrPort, count int, tos uint8) {
	t.Helper()
	for base := 0; base < count; base += 50 {
		var msgs []transport.Message
		for i := base; i < min(base+50, count); i++ {
			msgs = append(msgs, transport.Message{Buf: transport.RocePacket(64, uint32(i)), Peer: peer, TOS: tos})
		}
		if k, err := a.Send(msgs); k != len(msgs) {
			t.Fatal(k, err)
		}
	}
}

// psns receives exactly want packets and returns their PSNs in order.
func psns(t testing.TB, c transport.Conn, want int) []uint32 {
	t.Helper()
	var out []uint32
	for _, m := range transport.RecvN(t, c, want, 5*time.Second) {
		out = append(out, transport.PsnOf(m.Buf))
	}
	return out
}

// TestImpairLossDeterministic checks random loss drops what the counters
// say and the same seed drops the same packets.
func TestImpairLossDeterministic(t *testing.T) {
	run := func(seed uint64) ([]uint32, impair.Counts) {
		a, im := impairedPair(t, impair.Config{Seed: seed, Loss: 0.1})
		sendSeq(t, a, im.LocalAddr(), 1000, 0)
		s := im.ImpairStats().Recv
		for s.Seen < 1000 { // the pump may still be reading
			time.Sleep(time.Millisecond)
			s = im.ImpairStats().Recv
		}
		got := psns(t, im, int(1000-s.Lost))
		return got, im.ImpairStats().Recv
	}
	g1, s1 := run(7)
	g2, _ := run(7)
	g3, _ := run(8)
	if s1.Lost < 50 || s1.Lost > 150 || s1.Passed != 1000-s1.Lost {
		t.Errorf("counts %+v", s1)
	}
	if !slices.Equal(g1, g2) {
		t.Error("same seed, different losses")
	}
	if slices.Equal(g1, g3) {
		t.Error("different seeds, same losses")
	}
	if !slices.IsSorted(g1) {
		t.Error("loss alone reordered packets")
	}
}

// TestImpairBurst checks Gilbert-Elliott loss comes in runs.
func TestImpairBurst(t *testing.T) {
	a, im := impairedPair(t, impair.Config{Seed: 1, BurstEnter: 0.02, BurstExit: 0.25})
	sendSeq(t, a, im.LocalAddr(), 2000, 0)
	for im.ImpairStats().Recv.Seen < 2000 {
		time.Sleep(time.Millisecond)
	}
	s := im.ImpairStats().Recv
	got := psns(t, im, int(2000-s.BurstLost))
	gaps, lost := 0, 0
	prev := -1
	for _, p := range got {
		if int(p) != prev+1 {
			gaps++
			lost += int(p) - prev - 1
		}
		prev = int(p)
	}
	lost += 1999 - prev
	if uint64(lost) != s.BurstLost || s.BurstLost == 0 {
		t.Fatalf("lost %d, counted %+v", lost, s)
	}
	if mean := float64(lost) / float64(gaps); mean < 2 {
		t.Errorf("%d losses in %d gaps: mean burst %.1f, want about 4", lost, gaps, mean)
	}
}

// TestImpairDuplicateReorder checks duplicates arrive twice and swaps
// show as adjacent inversions, nothing lost.
func TestImpairDuplicateReorder(t *testing.T) {
	a, im := impairedPair(t, impair.Config{Seed: 3, Duplicate: 0.1, Reorder: 0.1})
	sendSeq(t, a, im.LocalAddr(), 500, 0)
	for im.ImpairStats().Recv.Seen < 500 {
		time.Sleep(time.Millisecond)
	}
	s := im.ImpairStats().Recv
	got := psns(t, im, 500+int(s.Duplicated))
	seen := map[uint32]int{}
	inversions := 0
	for i, p := range got {
		seen[p]++
		if i > 0 && p < got[i-1] {
			inversions++
		}
	}
	dups := 0
	for p := range uint32(500) {
		switch seen[p] {
		case 1:
		case 2:
			dups++
		default:
			t.Errorf("PSN %d arrived %d times", p, seen[p])
		}
	}
	if uint64(dups) != s.Duplicated || s.Duplicated == 0 {
		t.Errorf("%d duplicates, counted %+v", dups, s)
	}
	if inversions == 0 || uint64(inversions) > s.Reordered {
		t.Errorf("%d inversions, %d reordered", inversions, s.Reordered)
	}
}

// TestImpairDelay checks packets are held for the delay and the timer
// releases a held-back packet when no other follows.
func TestImpairDelay(t *testing.T) {
	a, im := impairedPair(t, impair.Config{Seed: 1, Delay: 30 * time.Millisecond, Jitter: 5 * time.Millisecond})
	start := time.Now()
	sendSeq(t, a, im.LocalAddr(), 20, 0)
	got := psns(t, im, 20)
	if el := time.Since(start); el < 30*time.Millisecond {
		t.Errorf("delivered after %v, before the delay", el)
	}
	if len(got) != 20 || im.ImpairStats().Recv.Delayed != 20 {
		t.Errorf("got %v, %+v", got, im.ImpairStats().Recv)
	}
	a2, im2 := impairedPair(t, impair.Config{Reorder: 1, ReorderTimeout: 20 * time.Millisecond})
	sendSeq(t, a2, im2.LocalAddr(), 1, 0)
	if got := psns(t, im2, 1); got[0] != 0 || im2.ImpairStats().Recv.Reordered != 1 {
		t.Errorf("held packet: %v", got)
	}
}

// TestImpairCorruptCE checks receive-side corruption is caught and
// counted as a bad ICRC, and CE marks only ECN-capable packets.
func TestImpairCorruptCE(t *testing.T) {
	a, im := impairedPair(t, impair.Config{Seed: 5, Corrupt: 0.5, CE: 1})
	tap := &transport.TapRec{}
	im.SetTap(tap)
	sendSeq(t, a, im.LocalAddr(), 100, 0x02)
	sendSeq(t, a, im.LocalAddr(), 10, 0x00)
	for im.ImpairStats().Recv.Seen < 110 {
		time.Sleep(time.Millisecond)
	}
	s := im.ImpairStats().Recv
	got := transport.RecvN(t, im, 110-int(s.Corrupted), 5*time.Second)
	for _, m := range got {
		if m.TOS != 0x03 && m.TOS != 0x00 {
			t.Errorf("TOS %#x", m.TOS)
		}
	}
	if st := im.Stats(); st.Drops[transport.DropBadICRC]+st.Drops[transport.DropNotRoCE] != s.Corrupted || s.Corrupted < 30 || s.CEMarked != 100 {
		t.Errorf("stats %+v, impair %+v", st, s)
	}
	if _, dr := transport.TapSnapshot(tap); uint64(len(dr)) != s.Corrupted {
		t.Errorf("tap saw %d drops", len(dr))
	}
}

// TestImpairSendCorruptUDP corrupts on the send side over real sockets:
// the receiving Conn's ICRC check catches every one.
func TestImpairSendCorruptUDP(t *testing.T) {
	a := transport.ListenAny(t, "127.0.0.1", transport.Options{})
	b := transport.ListenAny(t, "127.0.0.2", transport.Options{})
	im := impair.Wrap(a, impair.Config{Seed: 2, Dir: impair.Send, Corrupt: 0.3, Delay: time.Millisecond})
	defer im.Close()
	sendSeq(t, im, b.LocalAddr(), 200, 0)
	s := im.ImpairStats().Send
	got := transport.RecvN(t, b, 200-int(s.Corrupted), 5*time.Second)
	if s.Corrupted == 0 || len(got) != 200-int(s.Corrupted) {
		t.Fatalf("corrupted %d", s.Corrupted)
	}
	// A marker packet sent after the rest proves the drops were counted.
	if k, _ := a.Send([]transport.Message{{Buf: transport.RocePacket(32, 9999), Peer: b.LocalAddr()}}); k != 1 {
		t.Fatal("marker")
	}
	for _, m := range transport.RecvN(t, b, 1, 5*time.Second) {
		if transport.PsnOf(m.Buf) != 9999 {
			t.Fatalf("PSN %d", transport.PsnOf(m.Buf))
		}
	}
	if st := b.Stats(); st.Drops[transport.DropBadICRC]+st.Drops[transport.DropNotRoCE] != s.Corrupted {
		t.Errorf("receiver dropped %+v, %d corrupted", st.Drops, s.Corrupted)
	}
}

// TestImpairClose checks Close stops the goroutines and unblocks Recv.
func TestImpairClose(t *testing.T) {
	before := runtime.NumGoroutine()
	n := transport.NewPipeNetwork()
	c, err := n.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), transport.Options{})
	if err != nil {
		t.Fatal(err)
	}
	im := impair.Wrap(c, impair.Config{Dir: impair.Both, Delay: time.Hour})
	sendSeq(t, im, c.LocalAddr(), 5, 0) // to itself, held for an hour
	done := make(chan error)
	go func() {
		_, err := im.Recv(make([]transport.Message, 4))
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	if err := im.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Recv: %v", err)
	}
	if err := im.Close(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
	for i := 0; i < 100 && runtime.NumGoroutine() > before; i++ {
		time.Sleep(time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > before {
		t.Errorf("%d goroutines left, %d before", g, before)
	}
}
