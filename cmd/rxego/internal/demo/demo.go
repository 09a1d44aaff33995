// Package demo is rxego's guided tour: two rxego devices on loopback
// addresses run each RDMA operation while the tour explains what happens
// and shows what each side's CPU sees, then draws the ladder of what
// actually went over the wire, recorded by the sending device's own tap
// into a pcapng file per scenario. Two scenarios break the network on
// purpose: loss drops one packet to show Go-back-N recovering it, and
// congestion marks packets Congestion Experienced to show DCQCN slowing
// the sender down and letting it recover. The last three run the AI
// workloads of package examples (KV-cache hand-off, shared prefix cache,
// ring all-reduce) at a small size on devices of their own.
package demo

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/app/ladder"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// Scenario is one stop of the tour.
type Scenario struct {
	Name    string
	Summary string
	run     func(t *Tour) error
}

// Scenarios lists the tour's stops in the order they run by default.
var Scenarios = []Scenario{
	{"write", "RDMA WRITE: the silent mover", (*Tour).write},
	{"send", "SEND/RECV: the handover, and RNR when no receive is posted", (*Tour).send},
	{"write-imm", "RDMA WRITE with immediate: data plus a note", (*Tour).writeImm},
	{"read", "RDMA READ: fetching remote memory", (*Tour).read},
	{"atomic", "atomics: a shared counter", (*Tour).atomic},
	{"loss", "a lost packet: Go-back-N recovers it", (*Tour).loss},
	{"congestion", "congestion: DCQCN slows down and recovers", (*Tour).congestion},
	{"kvcache", "KV-cache hand-off: prefill WRITEs each layer into decode's memory, the immediate says it is there", (*Tour).kvcache},
	{"prefix", "shared prefix cache: readers READ a region whose owner does nothing", (*Tour).prefix},
	{"allreduce", "ring all-reduce: four ranks sum their buffers by WRITE with immediate", (*Tour).allreduce},
}

// Options configure a Tour. The zero value runs the tour without
// recording anything.
type Options struct {
	// PcapDir, when set, receives one pcapng capture per scenario
	// (NAME.pcapng, recorded by Alice's device), and each scenario prints
	// the ladder of its capture.
	PcapDir string
	// Tap, when set, also sees all of Alice's packets for the whole tour
	// (rxego demo --pcap FILE).
	Tap transport.Tap
	// Ladder controls the ladders: width, colors, rows before folding.
	Ladder ladder.TextOptions
	// Progress, when set, receives a self-overwriting progress line during
	// the congestion scenario.
	Progress io.Writer
	// CongestionMark is how long the congestion scenario's switch marks
	// packets, and CongestionRecoverMax the most its recovery phase runs;
	// 0 means DefaultCongestionMark and DefaultCongestionRecoverMax. Tests
	// that record the scenario shorten them.
	CongestionMark, CongestionRecoverMax time.Duration
}

// Tour holds the two endpoints of the demo.
type Tour struct {
	out  io.Writer
	opts Options
	a, b *end
	// lossy is Bob's network (drops a packet on request), marking Alice's
	// (marks packets CE on request).
	lossy   *lossyConn
	marking *markingConn
	notes   []note // annotations for the current scenario's ladder
	// tap records the current scenario: the workload scenarios, which
	// open devices of their own, give it to the device they record, and
	// header then says whose device that was.
	tap    transport.Tap
	header string
	// capturedOn notes the addresses of the devices the scenario's
	// capture was taken on (see localAddrs).
	capturedOn *localAddrs
}

type end struct {
	name string
	conn transport.Conn
	dev  *rxego.Device
	pd   *rxego.PD
	cq   *rxego.CQ
	qp   *rxego.QP
	mr   *rxego.MR
	buf  []byte
}

const bufSize = 64 << 10

// rnrPause is how long Bob takes to post his receive in the send
// scenario: a few of Alice's RNR retries (0.64 ms apart at the RNR timer
// the QPs use).
const rnrPause = 3 * time.Millisecond

// DefaultAddrs are the loopback addresses Open tries, in order.
var DefaultAddrs = []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"}

// Open starts two devices on free loopback addresses (the first two of
// DefaultAddrs that are free) and connects an RC QP pair between them.
func Open(out io.Writer) (*Tour, error) { return OpenWith(out, Options{}, DefaultAddrs...) }

// OpenOn is Open with the candidate addresses given.
func OpenOn(out io.Writer, candidates ...string) (*Tour, error) {
	return OpenWith(out, Options{}, candidates...)
}

// OpenWith is OpenOn with options.
func OpenWith(out io.Writer, o Options, candidates ...string) (*Tour, error) {
	t := &Tour{out: out, opts: o}
	var err error
	var ends []*end
	for _, addr := range candidates {
		if len(ends) == 2 {
			break
		}
		e, err := t.openEnd([]string{"alice", "bob"}[len(ends)], addr)
		if err != nil {
			continue // address busy (another rxego?): try the next one
		}
		ends = append(ends, e)
	}
	if len(ends) < 2 {
		for _, e := range ends {
			e.dev.Close()
		}
		return nil, errors.New("demo: could not bind UDP port 4791 on two loopback addresses (127.0.0.1-6)")
	}
	t.a, t.b = ends[0], ends[1]
	t.marking, t.lossy = t.a.conn.(*markingConn), t.b.conn.(*lossyConn)
	if o.Tap != nil {
		t.a.dev.SetTap(o.Tap)
	}
	opts := &rxego.ConnectOptions{MTU: 3, MinRNRTimer: 12, MaxRdAtomic: 4}
	oa, ob := *opts, *opts
	oa.LocalPSN, ob.LocalPSN = 1000, 2000
	if err = t.a.qp.Connect(rxego.RemoteQP{Addr: t.b.dev.Addr(), QPN: t.b.qp.Num(), PSN: 2000}, &oa); err == nil {
		err = t.b.qp.Connect(rxego.RemoteQP{Addr: t.a.dev.Addr(), QPN: t.a.qp.Num(), PSN: 1000}, &ob)
	}
	if err != nil {
		t.Close()
		return nil, err
	}
	// QP numbers as the ladders and the C tools print them (QPN 0x%06x).
	fmt.Fprintf(out, "Two rxego devices on loopback: %s at %v (QP %#06x) and %s at %v (QP %#06x),\n"+
		"joined by a reliable-connected (RC) queue pair, path MTU 1024.\n",
		t.a.name, t.a.dev.Addr(), t.a.qp.Num(), t.b.name, t.b.dev.Addr(), t.b.qp.Num())
	return t, nil
}

// openEnd opens one side's device behind the network shim of its role:
// Alice's marks packets CE when asked, Bob's loses a packet when asked.
func (t *Tour) openEnd(name, addr string) (*end, error) {
	local, err := rxego.ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	sock, err := transport.Listen(local, transport.Options{})
	if err != nil {
		return nil, err
	}
	var conn transport.Conn = &lossyConn{Conn: sock}
	if name == "alice" {
		conn = newMarkingConn(sock, 1)
	}
	dev, err := rxego.Open(addr, &rxego.Options{Conn: conn, Congestion: demoCongestion()})
	if err != nil {
		conn.Close()
		return nil, err
	}
	e := &end{name: name, conn: conn, dev: dev, buf: make([]byte, bufSize)}
	e.pd, _ = dev.AllocPD()
	e.cq, _ = dev.CreateCQ(64)
	if e.qp, err = e.pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: e.cq, RecvCQ: e.cq,
		Caps: rxego.Caps{MaxSendWR: 16, MaxRecvWR: 16}}); err == nil {
		e.mr, err = e.pd.RegMR(e.buf, rxego.AccessLocalWrite|rxego.AccessRemoteWrite|rxego.AccessRemoteRead|rxego.AccessRemoteAtomic)
	}
	if err != nil {
		dev.Close()
		return nil, err
	}
	return e, nil
}

// Close stops both devices.
func (t *Tour) Close() {
	for _, e := range []*end{t.a, t.b} {
		if e != nil {
			e.dev.Close()
		}
	}
}

// Run runs the named scenarios (all when names is empty).
func (t *Tour) Run(names ...string) error {
	for _, s := range Scenarios {
		if len(names) > 0 && !contains(names, s.Name) {
			continue
		}
		fmt.Fprintf(t.out, "\n== %s: %s\n", s.Name, s.Summary)
		if err := t.runCaptured(s); err != nil {
			return fmt.Errorf("%s: %w", s.Name, err)
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Names returns the scenario names.
func Names() []string {
	out := make([]string, len(Scenarios))
	for i, s := range Scenarios {
		out[i] = s.Name
	}
	return out
}

func (t *Tour) say(format string, args ...any) { fmt.Fprintf(t.out, format+"\n", args...) }

func (e *end) sge(off, n int) []rxego.SGE {
	return []rxego.SGE{{Addr: e.mr.IOVA() + uint64(off), Length: uint32(n), LKey: e.mr.LKey()}}
}

func wait(e *end) (rxego.WC, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wc := make([]rxego.WC, 1)
	if _, err := e.cq.PollWait(ctx, wc); err != nil {
		return rxego.WC{}, fmt.Errorf("%s saw no completion: %w", e.name, err)
	}
	if wc[0].Status != 0 {
		return wc[0], fmt.Errorf("%s's completion failed: %v", e.name, wc[0].Status)
	}
	return wc[0], nil
}

// idle reports whether e's CQ stays empty for a moment.
func idle(e *end) bool {
	time.Sleep(20 * time.Millisecond)
	return e.cq.Len() == 0
}

func (t *Tour) write() error {
	a, b := t.a, t.b
	msg := []byte("Hello Bob, this landed in your memory without your CPU lifting a finger.")
	copy(a.buf, msg)
	t.say("%s registered a buffer and told %s its address and rkey (%#x) out of band.", b.name, a.name, b.mr.RKey())
	t.say("%s posts an RDMA WRITE of %d bytes to that address.", a.name, len(msg))
	if err := a.qp.PostSend(rxego.SendWR{ID: 1, Opcode: rxego.WRWrite, Flags: rxego.SendSignaled, SGL: a.sge(0, len(msg)),
		RemoteAddr: b.mr.IOVA() + 100, RKey: b.mr.RKey()}); err != nil {
		return err
	}
	wc, err := wait(a)
	if err != nil {
		return err
	}
	b.dev.Sync()
	if !bytes.Equal(b.buf[100:100+len(msg)], msg) {
		return errors.New("the bytes did not land")
	}
	t.say("%s's completion: %s (%s acknowledged every packet; a send completion carries no byte count).", a.name, wcString(wc), b.name)
	t.say("%s's memory now reads: %q", b.name, b.buf[100:100+len(msg)])
	b.dev.Sync() // hand the buffer back to Bob's engine: the scenario may run again and WRITE there
	if !idle(b) {
		return errors.New("the receiver got a completion for a WRITE")
	}
	t.say("%s's CPU saw nothing: no receive was consumed, no completion was generated on its side.", b.name)
	return nil
}

func (t *Tour) send() error {
	a, b := t.a, t.b
	msg := []byte("A message Bob must take in: SEND needs a posted receive.")
	copy(a.buf, msg)
	rnr0 := a.dev.Stats().RcvdRNRErr
	t.say("%s SENDs %d bytes, but %s has posted no receive yet.", a.name, len(msg), b.name)
	if err := a.qp.PostSend(rxego.SendWR{ID: 2, Opcode: rxego.WRSend, Flags: rxego.SendSignaled, SGL: a.sge(0, len(msg))}); err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Second)
	for a.dev.Stats().RcvdRNRErr == rnr0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	rnr := a.dev.Stats().RcvdRNRErr - rnr0
	if rnr == 0 {
		return errors.New("expected a Receiver Not Ready NAK")
	}
	t.say("%s's responder answered with a Receiver-Not-Ready NAK (RNR); %s waits the RNR timer and tries again (%s so far).", b.name, a.name, ladder.Count(int(rnr), "RNR NAK"))
	time.Sleep(rnrPause)
	t.say("%s posts a receive buffer.", b.name)
	if err := b.qp.PostRecv(rxego.RecvWR{ID: 20, SGL: b.sge(1000, 256)}); err != nil {
		return err
	}
	wcb, err := wait(b)
	if err != nil {
		return err
	}
	wca, err := wait(a)
	if err != nil {
		return err
	}
	t.say("%s's completion: %s; %s's completion: %s.", b.name, wcString(wcb), a.name, wcString(wca))
	t.say("%s received: %q (after %s in all).", b.name, b.buf[1000:1000+wcb.ByteLen], ladder.Count(int(a.dev.Stats().RcvdRNRErr-rnr0), "RNR NAK"))
	return nil
}

func (t *Tour) writeImm() error {
	a, b := t.a, t.b
	msg := []byte("bulk data, written directly")
	copy(a.buf, msg)
	t.say("%s posts two receives, wr_id 30 and then 31; %s WRITEs %d bytes with the immediate value 0xC0FFEE.", b.name, a.name, len(msg))
	if err := b.qp.PostRecv(rxego.RecvWR{ID: 30, SGL: b.sge(2000, 64)}, rxego.RecvWR{ID: 31, SGL: b.sge(2100, 64)}); err != nil {
		return err
	}
	if err := a.qp.PostSend(rxego.SendWR{ID: 3, Opcode: rxego.WRWriteImm, Imm: 0xC0FFEE, Flags: rxego.SendSignaled,
		SGL: a.sge(0, len(msg)), RemoteAddr: b.mr.IOVA() + 3000, RKey: b.mr.RKey()}); err != nil {
		return err
	}
	wcb, err := wait(b)
	if err != nil {
		return err
	}
	if _, err := wait(a); err != nil {
		return err
	}
	t.say("The data landed where the WRITE pointed: %q.", b.buf[3000:3000+len(msg)])
	t.say("%s's completion: %s, immediate %#x, wr_id %d: it consumed the first receive only.", b.name, wcString(wcb), wcb.Imm, wcb.ID)
	if !idle(b) {
		return errors.New("more than one receive was consumed")
	}
	t.say("The second receive (wr_id 31) is still posted: a WRITE with immediate consumes exactly one.")
	t.say("To leave none behind for the next scenario, %s SENDs 4 bytes (\"tidy\"), which take it: message #2 below.", a.name)
	// Use it up so later scenarios start clean.
	copy(a.buf, "tidy")
	if err := a.qp.PostSend(rxego.SendWR{ID: 4, Opcode: rxego.WRSend, SGL: a.sge(0, 4)}); err != nil {
		return err
	}
	_, err = wait(b)
	return err
}

func (t *Tour) read() error {
	a, b := t.a, t.b
	copy(b.buf[4000:], "Bob's notes: fetched by Alice, Bob's CPU not involved.")
	b.dev.Sync() // publish the bytes to Bob's engine before Alice asks for them
	n := 54
	t.say("%s READs %d bytes from %s's memory.", a.name, n, b.name)
	if err := a.qp.PostSend(rxego.SendWR{ID: 5, Opcode: rxego.WRRead, Flags: rxego.SendSignaled, SGL: a.sge(5000, n),
		RemoteAddr: b.mr.IOVA() + 4000, RKey: b.mr.RKey()}); err != nil {
		return err
	}
	wc, err := wait(a)
	if err != nil {
		return err
	}
	t.say("%s's completion: %s; it now holds %q.", a.name, wcString(wc), a.buf[5000:5000+n])
	if !idle(b) {
		return errors.New("the target got a completion for a READ")
	}
	t.say("%s's CPU again saw nothing.", b.name)
	return nil
}

func (t *Tour) atomic() error {
	a, b := t.a, t.b
	off := 8192 - int(b.mr.IOVA()%8) // an 8-byte-aligned counter
	res := 8192 - int(a.mr.IOVA()%8)
	binary.LittleEndian.PutUint64(b.buf[off:], 100)
	b.dev.Sync()
	t.say("%s keeps a 64-bit counter holding 100; %s adds 5 to it three times with FETCH_AND_ADD.", b.name, a.name)
	var seen []string
	for i := 0; i < 3; i++ {
		if err := a.qp.PostSend(rxego.SendWR{ID: 6, Opcode: rxego.WRFetchAdd, Flags: rxego.SendSignaled, SGL: a.sge(res, 8),
			RemoteAddr: b.mr.IOVA() + uint64(off), RKey: b.mr.RKey(), CompareAdd: 5}); err != nil {
			return err
		}
		if _, err := wait(a); err != nil {
			return err
		}
		seen = append(seen, fmt.Sprint(binary.LittleEndian.Uint64(a.buf[res:])))
	}
	t.say("Each FETCH_AND_ADD returned the value before it: %s.", strings.Join(seen, ", "))
	t.say("Then a COMPARE_AND_SWAP: if the counter is 115, make it 7.")
	if err := a.qp.PostSend(rxego.SendWR{ID: 7, Opcode: rxego.WRCompareSwap, Flags: rxego.SendSignaled, SGL: a.sge(res, 8),
		RemoteAddr: b.mr.IOVA() + uint64(off), RKey: b.mr.RKey(), CompareAdd: 115, Swap: 7}); err != nil {
		return err
	}
	if _, err := wait(a); err != nil {
		return err
	}
	b.dev.Sync()
	got := binary.LittleEndian.Uint64(b.buf[off:])
	t.say("It returned %d (the compare matched), and %s's counter now holds %d.", binary.LittleEndian.Uint64(a.buf[res:]), b.name, got)
	if got != 7 {
		return fmt.Errorf("counter is %d, want 7", got)
	}
	return nil
}

// wcString says what a completion says: opcode, status and, where verbs
// sets it (receives, READs, atomics), byte_len; a WRITE's or SEND's
// completion carries no byte count.
func wcString(wc rxego.WC) string {
	switch wc.Opcode {
	case qp.WCRead, qp.WCCompareSwap, qp.WCFetchAdd:
	default:
		if wc.Opcode < qp.WCRecv {
			return fmt.Sprintf("%s %s", wc.Opcode, wc.Status)
		}
	}
	return fmt.Sprintf("%s %s, %d bytes", wc.Opcode, wc.Status, wc.ByteLen)
}

// Devices returns Alice's and Bob's devices, for metrics.
func (t *Tour) Devices() []*rxego.Device { return []*rxego.Device{t.a.dev, t.b.dev} }
