package conformance

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/conformance/lab"
	"github.com/rxego/rxego/internal/app/devstats"
)

// The RNR cases run rxego inside the test process (a Device opened in the
// lab namespace), so that the test decides exactly when receives are
// posted; the guest runs ibv_rc_pingpong.

// rnrMsgSize is the message size of the RNR cases: one packet, and small
// enough that the C tool's single buffer (it sends from the buffer it
// receives into) cannot be torn by a message arriving while it copies.
const rnrMsgSize = 16

// rnrMinTimer is rxego's min_rnr_timer in the RNR cases: 20 is 10.24 ms
// (IBTA table 45), the wait rxe's requester is told to take between tries.
const rnrMinTimer = 20

// inproc is one rxego RC QP in the test process, facing the guest.
type inproc struct {
	dev  *rxego.Device
	mr   *rxego.MR
	buf  []byte // slots of rnrMsgSize bytes: receives, then sends
	cq   *rxego.CQ
	qp   *rxego.QP
	psn  uint32
	wcs  []rxego.WC
	sent int // sends posted
	rcvd int // receives posted
}

// openInproc opens a Device on p's host end inside the lab namespace with
// one RC QP in INIT and room for n receives and n sends.
func (p *Peer) openInproc(t *testing.T, n int) *inproc {
	t.Helper()
	var dev *rxego.Device
	err := p.Lab.InNetns(func() error {
		var err error
		// The socket is made now, so it stays in the namespace.
		dev, err = rxego.Open(p.HostIP, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	x := &inproc{dev: dev, buf: make([]byte, 2*n*rnrMsgSize), psn: rand.Uint32() & 0xffffff, wcs: make([]rxego.WC, 8)}
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if x.mr, err = pd.RegMR(x.buf, rxego.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if x.cq, err = dev.CreateCQ(2*n + 4); err != nil {
		t.Fatal(err)
	}
	if x.qp, err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: x.cq, RecvCQ: x.cq,
		Caps: rxego.Caps{MaxSendWR: n, MaxRecvWR: n, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := x.qp.Init(0); err != nil {
		t.Fatal(err)
	}
	return x
}

// slot returns receive slot i (i < n) or send slot n+i.
func (x *inproc) slot(i int) []byte { return x.buf[i*rnrMsgSize : (i+1)*rnrMsgSize] }

func (x *inproc) sge(i int) rxego.SGE {
	return rxego.SGE{Addr: x.mr.IOVA() + uint64(i*rnrMsgSize), Length: rnrMsgSize, LKey: x.mr.LKey()}
}

// postRecv posts the next receive slot.
func (x *inproc) postRecv(t *testing.T) {
	t.Helper()
	if err := x.qp.PostRecv(rxego.RecvWR{ID: uint64(x.rcvd), SGL: []rxego.SGE{x.sge(x.rcvd)}}); err != nil {
		t.Fatal(err)
	}
	x.rcvd++
}

// postSend sends message seq (rxego's self-checking pattern) from the next
// send slot.
func (x *inproc) postSend(t *testing.T, seq uint64) {
	t.Helper()
	i := len(x.buf)/rnrMsgSize/2 + x.sent
	pattern(x.slot(i), seq)
	wr := rxego.SendWR{ID: 1 << 32, Opcode: rxego.WRSend, Flags: rxego.SendSignaled, SGL: []rxego.SGE{x.sge(i)}}
	if err := x.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	x.sent++
}

// await collects completions until want receives and sends completed
// (counted since the start), failing on any error status.
func (x *inproc) await(t *testing.T, ctx context.Context, recvs, sends *int, wantR, wantS int) {
	t.Helper()
	for *recvs < wantR || *sends < wantS {
		n, err := x.cq.PollWait(ctx, x.wcs)
		if err != nil {
			t.Fatalf("after %d receives and %d sends: %v", *recvs, *sends, err)
		}
		for _, wc := range x.wcs[:n] {
			if wc.Status != 0 {
				t.Fatalf("completion %d: status %s", wc.ID, wc.Status)
			}
			if wc.ID >= 1<<32 {
				*sends++
			} else {
				*recvs++
				if wc.ByteLen != rnrMsgSize {
					t.Fatalf("received %d bytes, want %d", wc.ByteLen, rnrMsgSize)
				}
			}
		}
	}
}

// connect moves the QP to RTS towards the guest's QP.
func (x *inproc) connect(t *testing.T, p *Peer, remote ppDest) {
	t.Helper()
	r := rxego.RemoteQP{Addr: netip.AddrPortFrom(netip.MustParseAddr(p.Guest.IP()), rxego.DefaultPort), QPN: remote.qpn, PSN: remote.psn}
	if err := x.qp.Connect(r, &rxego.ConnectOptions{LocalPSN: x.psn, MinRNRTimer: rnrMinTimer}); err != nil {
		t.Fatal(err)
	}
}

// stats waits for the device to go quiet and returns its counters.
func (x *inproc) stats() map[string]uint64 {
	devstats.Settle(x.dev, 250*time.Millisecond, 5*time.Second)
	return devstats.Map(x.dev)
}

// ppServe starts ibv_rc_pingpong in the guest as a client of x with the
// tool's extra args, answers its TCP exchange, connects x to the tool's
// QP and returns once the tool has connected too (it sent "done").
func (p *Peer) ppServe(t *testing.T, x *inproc, args ...string) *lab.Proc {
	t.Helper()
	ln, err := p.Lab.Listen("tcp4", net.JoinHostPort(p.HostIP, strconv.Itoa(p.Port)))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	proc, err := p.Guest.Start(append(append([]string{"ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-p", strconv.Itoa(p.Port)},
		args...), p.HostIP)...)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(30 * time.Second))
	conn, err := ln.Accept()
	if err != nil {
		proc.Kill()
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	remote, err := readPPDest(conn)
	if err == nil {
		x.connect(t, p, remote)
		_, err = conn.Write(ppDest{qpn: x.qp.Num(), psn: x.psn, gid: netip.MustParseAddr(p.HostIP)}.encode())
	}
	if err == nil {
		_, err = io.ReadFull(conn, make([]byte, len("done\x00")))
	}
	if err != nil {
		proc.Kill()
		t.Fatal(err)
	}
	return proc
}

// ppDial starts ibv_rc_pingpong in the guest as a server with the tool's
// extra args, dials its TCP exchange and connects x to the tool's QP.
func (p *Peer) ppDial(t *testing.T, ctx context.Context, x *inproc, args ...string) *lab.Proc {
	t.Helper()
	proc, conn, remote := p.pingpongServer(t, ctx, ppDest{qpn: x.qp.Num(), psn: x.psn, gid: netip.MustParseAddr(p.HostIP)}, args...)
	x.connect(t, p, remote)
	if _, err := conn.Write([]byte("done\x00")); err != nil {
		t.Fatal(err)
	}
	return proc
}

// pingpongServer starts ibv_rc_pingpong in the guest as the server with
// args (after -d rxe0 -g 1 -p PORT), connects to its exchange, sends
// local's record and returns the tool, the exchange's connection (30 s
// deadline) and the tool's record. Both are closed at the test's end.
func (p *Peer) pingpongServer(t *testing.T, ctx context.Context, local ppDest, args ...string) (*lab.Proc, net.Conn, ppDest) {
	t.Helper()
	proc, err := p.Guest.Start(append([]string{"ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-p", strconv.Itoa(p.Port)}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proc.Kill() })
	if err := p.Guest.WaitTCPListen(ctx, p.Port); err != nil {
		t.Fatal(err)
	}
	conn, err := p.Lab.Dial(ctx, "tcp4", net.JoinHostPort(p.Guest.IP(), strconv.Itoa(p.Port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write(local.encode()); err != nil {
		t.Fatal(err)
	}
	remote, err := readPPDest(conn)
	if err != nil {
		t.Fatal(err)
	}
	return proc, conn, remote
}

// ppDest is one record of the ibv_*_pingpong TCP exchange.
type ppDest struct {
	qpn, psn uint32
	gid      netip.Addr
}

// ppRecordLen is a record's size: "LLLL:QQQQQQ:PPPPPP:" 32 hex digits, NUL.
const ppRecordLen = 4 + 1 + 6 + 1 + 6 + 1 + 32 + 1

// encode renders d as the C tools write it.
func (d ppDest) encode() []byte {
	g := d.gid.As16()
	return fmt.Appendf(nil, "%04x:%06x:%06x:%s\x00", 0, d.qpn, d.psn, hex.EncodeToString(g[:]))
}

// readPPDest reads one record.
func readPPDest(r io.Reader) (ppDest, error) {
	b := make([]byte, ppRecordLen)
	if _, err := io.ReadFull(r, b); err != nil {
		return ppDest{}, fmt.Errorf("pingpong exchange: %w", err)
	}
	f := strings.Split(strings.TrimRight(string(b), "\x00"), ":")
	if len(f) != 4 {
		return ppDest{}, fmt.Errorf("pingpong exchange: record %q", b)
	}
	qpn, err1 := strconv.ParseUint(f[1], 16, 24)
	psn, err2 := strconv.ParseUint(f[2], 16, 24)
	g, err3 := hex.DecodeString(f[3])
	if err1 != nil || err2 != nil || err3 != nil || len(g) != 16 {
		return ppDest{}, fmt.Errorf("pingpong exchange: record %q", b)
	}
	return ppDest{qpn: uint32(qpn), psn: uint32(psn), gid: netip.AddrFrom16([16]byte(g)).Unmap()}, nil
}

// pattern fills b with a self-describing pattern: the first 8 bytes hold
// seq, the rest derive from it, so a receiver can tell an intact message.
func pattern(b []byte, seq uint64) {
	binary.LittleEndian.PutUint64(b, seq)
	x := seq*0x9e3779b97f4a7c15 + 1
	for i := 8; i < len(b); i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

// patternSeq returns the seq of an intact pattern, or false.
func patternSeq(b []byte) (uint64, bool) {
	if len(b) < 8 {
		return 0, false
	}
	want := make([]byte, len(b))
	seq := binary.LittleEndian.Uint64(b)
	pattern(want, seq)
	return seq, bytes.Equal(want, b)
}

// rnrIters is how many messages each RNR case exchanges.
const rnrIters = 6

// TestRNR makes each side meet a peer with no receive posted, with
// ibv_rc_pingpong in the guest:
//
//   - rxe waits: rxego serves ibv_rc_pingpong's client but posts the
//     receive for each message only after it has answered that message
//     with an RNR NAK at least once; rxe must wait (rxego's 10.24 ms
//     min_rnr_timer), resend, and succeed.
//   - rxego waits: ibv_rc_pingpong serves with -r 1 (one receive posted at
//     a time) and rxego sends messages in pairs: the second finds no
//     receive, rxe answers with an RNR NAK, and rxego must wait, resend and
//     succeed once the tool has reposted.
//
// Both sides' RNR counters must have moved (rxe's send_rnr_err and
// rxego's rcvd_rnr_err, or the other way round), every message must
// arrive intact, and packet counts balance.
func TestRNR(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		p.Case(t, Case{Name: "rnr rxe waits", Role: "rxego server",
			// rxego counts each RNR NAK also as a NAK sent and a packet
			// dropped for want of a receive.
			Expect:  []string{"rcvd_rnr_err", "send_rnr_err", "naks_sent", "drop_no_recv_wqe"},
			Require: []string{"rxe:rcvd_rnr_err", "rxego:send_rnr_err"}},
			func(t *testing.T) Outcome { return p.rnrRxeWaits(t) })
		p.Case(t, Case{Name: "rnr rxego waits", Role: "rxego client",
			Expect:  []string{"rcvd_rnr_err", "send_rnr_err"},
			Require: []string{"rxe:send_rnr_err", "rxego:rcvd_rnr_err"}},
			func(t *testing.T) Outcome { return p.rnrRxegoWaits(t) })
	})
}

// rnrRxeWaits: rxego as ibv_rc_pingpong's server, holding back receives.
func (p *Peer) rnrRxeWaits(t *testing.T) Outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	x := p.openInproc(t, rnrIters)
	proc := p.ppServe(t, x, "-e", "-s", strconv.Itoa(rnrMsgSize), "-n", strconv.Itoa(rnrIters))
	defer proc.Kill()

	rnr := func() uint64 { return x.dev.Stats().SendRNRErr }
	var recvs, sends int
	for k := 1; k <= rnrIters; k++ {
		// Message k is on its way with no receive for it: wait until
		// rxego has refused it with an RNR NAK, then post the receive.
		before := uint64(k - 1)
		for rnr() <= before {
			if ctx.Err() != nil {
				t.Fatalf("message %d: no RNR NAK sent (send_rnr_err %d)", k, rnr())
			}
			time.Sleep(time.Millisecond)
		}
		x.postRecv(t)
		x.await(t, ctx, &recvs, &sends, k, k-1)
		got := x.slot(k - 1)
		if k == 1 {
			// The tool's first message is its buffer's fill byte.
			if !bytes.Equal(got, bytes.Repeat([]byte{0x7b}, rnrMsgSize)) {
				t.Fatalf("message 1 = %x, want the 0x7b fill", got)
			}
		} else if seq, ok := patternSeq(got); !ok || seq != uint64(k-1) {
			t.Fatalf("message %d = %x, want the echo of our message %d", k, got, k-1)
		}
		x.postSend(t, uint64(k))
		x.await(t, ctx, &recvs, &sends, k, k)
	}
	if _, err := proc.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	st := x.stats()
	return Outcome{Note: fmt.Sprintf("%d messages verified, each refused with an RNR NAK first", rnrIters), Rxego: st}
}

// rnrRxegoWaits: rxego as ibv_rc_pingpong -r 1's client, sending in pairs.
func (p *Peer) rnrRxegoWaits(t *testing.T) Outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	x := p.openInproc(t, rnrIters)
	for range rnrIters {
		x.postRecv(t)
	}
	proc := p.ppDial(t, ctx, x, "-e", "-s", strconv.Itoa(rnrMsgSize), "-n", strconv.Itoa(rnrIters), "-r", "1")
	defer proc.Kill()

	// Pairs: the tool has one receive posted, so the second message of
	// each pair arrives before it can repost.
	var recvs, sends int
	for k := 1; k <= rnrIters; k += 2 {
		x.postSend(t, uint64(k))
		x.postSend(t, uint64(k+1))
		x.await(t, ctx, &recvs, &sends, k+1, k+1)
	}
	// The tool echoes its buffer, which holds what it received last: each
	// echo must be one of our messages, intact.
	for i := range rnrIters {
		got := x.slot(i)
		if seq, ok := patternSeq(got); !ok || seq < 1 || seq > rnrIters {
			t.Fatalf("echo %d = %x, not one of our %d messages", i+1, got, rnrIters)
		}
	}
	if _, err := proc.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	st := x.stats()
	return Outcome{Note: fmt.Sprintf("%d messages in pairs, %d echoes verified", rnrIters, rnrIters), Rxego: st}
}
