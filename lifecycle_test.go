package rxego_test

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/testaddr"
	"github.com/rxego/rxego/qp"
	"github.com/rxego/rxego/transport"
)

// lifecycleModes are the device's receive modes: Close and Notify must
// work in each. opts gives the options for one device of a pair.
var lifecycleModes = []struct {
	name string
	opts func() func() *rxego.Options
}{
	{"blocking", func() func() *rxego.Options { return func() *rxego.Options { return nil } }},
	{"busy-poll", func() func() *rxego.Options {
		return func() *rxego.Options { return &rxego.Options{BusyPoll: 50 * time.Microsecond} }
	}},
	{"pipe", func() func() *rxego.Options { // a Conn with neither Waker nor Poller
		net, n := transport.NewPipeNetwork(), byte(0)
		return func() *rxego.Options {
			n++
			c, err := net.Listen(netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, n}), rxego.DefaultPort), transport.Options{})
			if err != nil {
				panic(err)
			}
			return &rxego.Options{Conn: c}
		}
	}},
}

// openSide opens an RC side with device options.
func openSide(t *testing.T, opts *rxego.Options) *side { return openWith(t, opts, rxego.RC, 1<<16) }

// openWith opens a device with opts and one QP of type typ, its CQ and
// an MR of size bytes open to every access.
func openWith(t *testing.T, opts *rxego.Options, typ rxego.QPType, size int) *side {
	t.Helper()
	return sideOn(t, testaddr.Open(t, opts), typ, size)
}

// sideOn makes a PD, CQ, QP of type typ and an MR of size bytes open to
// every access on dev.
func sideOn(t *testing.T, dev *rxego.Device, typ rxego.QPType, size int) *side {
	t.Helper()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := dev.CreateCQ(256)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(rxego.QPInitAttr{Type: typ, SendCQ: cq, RecvCQ: cq, Caps: rxego.Caps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2}})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, size)
	m, err := pd.RegMR(buf, rxego.AccessLocalWrite|rxego.AccessRemoteWrite|rxego.AccessRemoteRead|rxego.AccessRemoteAtomic)
	if err != nil {
		t.Fatal(err)
	}
	return &side{dev, pd, cq, q, m, buf}
}

type waitResult struct {
	n   int
	wcs []rxego.WC
	err error
}

// waitOn runs PollWait on cq in a goroutine.
func waitOn(ctx context.Context, cq *rxego.CQ) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		wcs := make([]rxego.WC, 64)
		n, err := cq.PollWait(ctx, wcs)
		ch <- waitResult{n, wcs[:n], err}
	}()
	return ch
}

// TestDeviceCloseFlushes closes a device with work outstanding and
// goroutines waiting: the work completes with WR_FLUSH_ERR, the waiters
// return, the QP is in ERR, and every later call fails with ErrClosed.
func TestDeviceCloseFlushes(t *testing.T) {
	for _, m := range lifecycleModes {
		t.Run(m.name, func(t *testing.T) {
			const sends, recvs = 32, 8
			opts := m.opts()
			a, b := openSide(t, opts()), openSide(t, opts())
			connectPair(t, a, b, &rxego.ConnectOptions{})
			// b posts no receive: with rnr_retry 7 (infinite) a's SENDs
			// stay outstanding for as long as the test wants.
			for i := range recvs {
				if err := a.qp.PostRecv(rxego.RecvWR{ID: uint64(1000 + i), SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: 64, LKey: a.mr.LKey()}}}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range sends {
				if err := a.qp.PostSend(rxego.SendWR{ID: uint64(i), Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
					SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: 16, LKey: a.mr.LKey()}}}); err != nil {
					t.Fatal(err)
				}
			}
			idle, err := a.dev.CreateCQ(4)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			busyWait, idleWait := waitOn(ctx, a.cq), waitOn(ctx, idle)
			notify := idle.Notify()
			time.Sleep(20 * time.Millisecond) // let them block (and a's SENDs meet RNR)
			if n := a.cq.Len(); n != 0 {
				t.Fatalf("%d completions before Close; the SENDs should be stuck in RNR", n)
			}

			if err := a.dev.Close(); err != nil {
				t.Fatal(err)
			}
			deadline := time.After(2 * time.Second)
			var got []rxego.WC
			select {
			case r := <-busyWait:
				if r.err != nil || r.n == 0 {
					t.Fatalf("PollWait on the QP's CQ after Close = %d, %v; want flushed completions", r.n, r.err)
				}
				got = append(got, r.wcs...)
			case <-deadline:
				t.Fatal("PollWait on the QP's CQ still blocked 2 s after Close")
			}
			select {
			case r := <-idleWait:
				if !errors.Is(r.err, rxego.ErrClosed) {
					t.Fatalf("PollWait on an idle CQ after Close = %d, %v; want ErrClosed", r.n, r.err)
				}
			case <-deadline:
				t.Fatal("PollWait on an idle CQ still blocked 2 s after Close")
			}
			select {
			case _, ok := <-notify:
				if ok {
					t.Fatal("Notify's channel gave a value, not closed, for an idle CQ after Close")
				}
			case <-deadline:
				t.Fatal("Notify's channel not closed after Close")
			}
			// The rest of the flushed completions, then ErrClosed.
			for {
				wcs := make([]rxego.WC, 64)
				n, err := a.cq.PollWait(ctx, wcs)
				if err != nil {
					if !errors.Is(err, rxego.ErrClosed) {
						t.Fatalf("PollWait on an emptied, closed CQ: %v; want ErrClosed", err)
					}
					break
				}
				got = append(got, wcs[:n]...)
			}
			var nsend, nrecv int
			for _, wc := range got {
				if wc.Status != qp.WCWRFlushErr {
					t.Errorf("completion %+v: want WR_FLUSH_ERR", wc)
				}
				switch {
				case wc.Opcode == qp.WCRecv && wc.ID >= 1000:
					nrecv++
				case wc.Opcode == qp.WCSend && wc.ID < sends:
					nsend++
				default:
					t.Errorf("unexpected completion %+v", wc)
				}
			}
			if nsend != sends || nrecv != recvs {
				t.Fatalf("flushed %d sends and %d receives; want %d and %d", nsend, nrecv, sends, recvs)
			}
			if got := a.dev.Stats().FlushedWorkRequests; got != sends+recvs {
				t.Errorf("FlushedWorkRequests = %d, want %d", got, sends+recvs)
			}
			if st := a.qp.State(); st != qp.Err {
				t.Errorf("QP state after Close = %v, want ERR", st)
			}

			// Every later call fails with ErrClosed.
			wr := rxego.SendWR{Opcode: rxego.WRSend, SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: 1, LKey: a.mr.LKey()}}}
			attr := rxego.QPAttr{State: qp.Err}
			calls := map[string]error{
				"AllocPD":  second(a.dev.AllocPD()),
				"CreateCQ": second(a.dev.CreateCQ(4)),
				"CreateQP": second(a.pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: idle, RecvCQ: idle,
					Caps: rxego.Caps{MaxSendWR: 1, MaxRecvWR: 1}})),
				"CreateSRQ": second(a.pd.CreateSRQ(4, 1)),
				"CreateAH":  second(a.pd.CreateAH(b.dev.Addr())),
				"RegMR":     second(a.pd.RegMR(make([]byte, 64), rxego.AccessLocalWrite)),
				"PostSend":  a.qp.PostSend(wr),
				"PostRecv":  a.qp.PostRecv(rxego.RecvWR{}),
				"Modify":    a.qp.Modify(&attr, qp.AttrState),
				"CQ.Close":  a.cq.Close(),
			}
			for name, err := range calls {
				if !errors.Is(err, rxego.ErrClosed) {
					t.Errorf("%s after Close: %v; want ErrClosed", name, err)
				}
			}
			if err := a.dev.Close(); !errors.Is(err, rxego.ErrClosed) {
				t.Errorf("second Close: %v; want ErrClosed (os.File's rule)", err)
			}
		})
	}
}

func second[T any](_ T, err error) error { return err }

// TestZeroDevice: the zero Device and PD return errors, never panic.
func TestZeroDevice(t *testing.T) {
	var d rxego.Device
	if err := d.Close(); !errors.Is(err, rxego.ErrClosed) {
		t.Errorf("Close: %v", err)
	}
	if _, err := d.AllocPD(); !errors.Is(err, rxego.ErrClosed) {
		t.Errorf("AllocPD: %v", err)
	}
	if _, err := d.CreateCQ(4); !errors.Is(err, rxego.ErrClosed) {
		t.Errorf("CreateCQ: %v", err)
	}
	d.Sync()
	d.SetTap(nil)
	if d.Addr().IsValid() || d.Shards() != 0 || len(d.QPs()) != 0 || d.Transport() != nil {
		t.Error("the zero Device reports an address, shards, QPs or a transport")
	}
	var pd rxego.PD
	if _, err := pd.RegMR(make([]byte, 8), 0); !errors.Is(err, rxego.ErrClosed) {
		t.Errorf("PD.RegMR: %v", err)
	}
	if _, err := pd.CreateQP(rxego.QPInitAttr{}); !errors.Is(err, rxego.ErrClosed) {
		t.Errorf("PD.CreateQP: %v", err)
	}
	if err := pd.Dealloc(); !errors.Is(err, rxego.ErrClosed) {
		t.Errorf("PD.Dealloc: %v", err)
	}
}

// TestCQCloseBusy: a CQ that a live QP uses refuses to close (EBUSY) and
// keeps working; once the QP is destroyed it closes.
func TestCQCloseBusy(t *testing.T) {
	a, b := openSide(t, nil), openSide(t, nil)
	connectPair(t, a, b, &rxego.ConnectOptions{})
	var c io.Closer = a.cq
	if err := c.Close(); !errors.Is(err, rxego.ErrBusy) {
		t.Fatalf("CQ.Close with a live QP: %v; want ErrBusy", err)
	}
	copy(a.buf, "still working")
	if err := a.qp.PostSend(rxego.SendWR{ID: 9, Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: 13, LKey: a.mr.LKey()}}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, a.cq); wc.Status != qp.WCSuccess || wc.ID != 9 {
		t.Fatalf("WRITE after the refused Close: %+v", wc)
	}
	b.dev.Sync()
	if string(b.buf[:13]) != "still working" {
		t.Fatalf("peer holds %q", b.buf[:13])
	}
	if err := a.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := a.cq.Close(); err != nil {
		t.Fatalf("CQ.Close after the QP was destroyed: %v", err)
	}
	if err := a.cq.Close(); !errors.Is(err, rxego.ErrClosed) {
		t.Fatalf("second CQ.Close: %v; want ErrClosed", err)
	}
	// A closed CQ takes no new QP.
	if _, err := a.pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: a.cq, RecvCQ: a.cq,
		Caps: rxego.Caps{MaxSendWR: 1, MaxRecvWR: 1}}); !errors.Is(err, rxego.ErrClosed) {
		t.Fatalf("CreateQP on a closed CQ: %v; want ErrClosed", err)
	}
}

// TestPostWrongState: a post the QP's state does not allow is an invalid
// work request, and says so with the rxego: prefix; the engine's error
// stays in the chain.
func TestPostWrongState(t *testing.T) {
	a := openSide(t, nil)
	wr := rxego.SendWR{Opcode: rxego.WRSend, SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: 1, LKey: a.mr.LKey()}}}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, rxego.ErrInvalidWR) || !errors.Is(err, qp.ErrInvalidWR) || !strings.HasPrefix(err.Error(), "rxego: ") ||
			strings.Contains(err.Error(), "qp:") {
			t.Errorf("%s: %v; want an rxego: error matching ErrInvalidWR", what, err)
		}
	}
	check("PostSend in RESET", a.qp.PostSend(wr))
	check("PostRecv in RESET", a.qp.PostRecv(rxego.RecvWR{}))
	if err := a.qp.Init(0); err != nil {
		t.Fatal(err)
	}
	check("PostSend in INIT", a.qp.PostSend(wr))
	if !strings.HasPrefix(rxego.ErrInvalidWR.Error(), "rxego: ") {
		t.Errorf("ErrInvalidWR reads %q", rxego.ErrInvalidWR)
	}
}

// openMapped opens a device on a free loopback address written in its
// IPv4-mapped form (::ffff:127.x.y.z), as a GID decodes to.
func openMapped(t *testing.T) *rxego.Device {
	t.Helper()
	return openRetry(t, func(*rxego.Options) string { return netip.AddrFrom16(testaddr.Loopback().As16()).String() }, nil)
}

// openRetry opens a device on the address addr returns (it may also set
// opts' further GIDs), again while the address is taken, and closes it
// when the test ends.
func openRetry(t *testing.T, addr func(*rxego.Options) string, opts *rxego.Options) *rxego.Device {
	t.Helper()
	var last error
	for range 50 {
		d, err := rxego.Open(addr(opts), opts)
		if err == nil {
			t.Cleanup(func() { d.Close() })
			return d
		}
		if last = err; !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	t.Fatalf("open: %v", last)
	return nil
}

// TestIPv4MappedPeer connects to a peer named by its IPv4-mapped address
// (its GID, as ibv_rc_pingpong exchanges it): the replies, which come
// from the IPv4 address, must be taken as the peer's, in RC and in UD.
func TestIPv4MappedPeer(t *testing.T) {
	a, b := openSide(t, nil), openSide(t, nil)
	mapped := func(d *rxego.Device) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom16(d.GID()), d.Addr().Port())
	}
	if !mapped(b.dev).Addr().Is4In6() {
		t.Fatalf("GID %v is not IPv4-mapped", mapped(b.dev))
	}
	if err := a.qp.Connect(rxego.RemoteQP{Addr: mapped(b.dev), QPN: b.qp.Num(), PSN: 7}, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(rxego.RemoteQP{Addr: mapped(a.dev), QPN: a.qp.Num()}, &rxego.ConnectOptions{LocalPSN: 7}); err != nil {
		t.Fatal(err)
	}
	if got := a.qp.Query().Dest; got != b.dev.Addr() {
		t.Errorf("QP destination %v, want %v", got, b.dev.Addr())
	}
	copy(a.buf, "over a mapped GID")
	if err := a.qp.PostSend(rxego.SendWR{ID: 1, Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: 17, LKey: a.mr.LKey()}}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, a.cq); wc.Status != qp.WCSuccess {
		t.Fatalf("WRITE to a mapped peer: %+v", wc)
	}
	b.dev.Sync()
	if string(b.buf[:17]) != "over a mapped GID" {
		t.Fatalf("peer holds %q", b.buf[:17])
	}
	if n := a.dev.Stats().Drops[qp.DropWrongSource]; n != 0 {
		t.Errorf("%d packets dropped as wrong_source", n)
	}

	// A device opened on a mapped address is the IPv4 one.
	m := openMapped(t)
	if !m.Addr().Addr().Is4() {
		t.Fatalf("device opened on a mapped address reports %v", m.Addr())
	}
	// UD through an address handle made from a GID.
	pd, _ := m.AllocPD()
	cq, _ := m.CreateCQ(8)
	ud, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.UD, SendCQ: cq, RecvCQ: cq, Caps: rxego.Caps{MaxSendWR: 4, MaxRecvWR: 4}})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	mr, _ := pd.RegMR(buf, rxego.AccessLocalWrite)
	if err := ud.ActivateUD(0x1111, 0); err != nil {
		t.Fatal(err)
	}
	if err := ud.PostRecv(rxego.RecvWR{ID: 3, SGL: []rxego.SGE{{Addr: mr.IOVA(), Length: 256, LKey: mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	bpd, _ := b.dev.AllocPD()
	bcq, _ := b.dev.CreateCQ(8)
	bud, err := bpd.CreateQP(rxego.QPInitAttr{Type: rxego.UD, SendCQ: bcq, RecvCQ: bcq, Caps: rxego.Caps{MaxSendWR: 4, MaxRecvWR: 4, MaxInlineData: 16}})
	if err != nil {
		t.Fatal(err)
	}
	if err := bud.ActivateUD(0x1111, 0); err != nil {
		t.Fatal(err)
	}
	ah, err := bpd.CreateAH(netip.AddrPortFrom(netip.AddrFrom16(m.GID()), 0))
	if err != nil {
		t.Fatal(err)
	}
	if ah.Dest != m.Addr() {
		t.Errorf("AH destination %v, want %v", ah.Dest, m.Addr())
	}
	if err := bud.PostSend(rxego.SendWR{ID: 4, Opcode: rxego.WRSend, Flags: rxego.SendSignaled | rxego.SendInline,
		Inline: []byte("ud"), AH: ah, RemoteQPN: ud.Num(), RemoteQKey: 0x1111}); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, cq); wc.Status != qp.WCSuccess || wc.ByteLen != 40+2 || wc.Src.Addr() != b.dev.Addr().Addr() {
		t.Fatalf("UD receive: %+v", wc)
	}
}

// TestConnectOptionsZeros: from DefaultConnectOptions, zeros are verbs
// values. rnr_retry 0 fails a SEND at the first RNR NAK; the QP holds
// timeout 0, retry_cnt 0 and min_rnr_timer 0; a literal without Exact
// still takes the defaults for the fields it leaves out.
func TestConnectOptionsZeros(t *testing.T) {
	a, b := openSide(t, nil), openSide(t, nil)
	o := rxego.DefaultConnectOptions()
	o.RNRRetry, o.Timeout, o.RetryCnt, o.MinRNRTimer, o.LocalPSN = 0, 0, 0, 0, 100
	if err := a.qp.Connect(rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qp.Num(), PSN: 200}, &o); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(rxego.RemoteQP{Addr: a.dev.Addr(), QPN: a.qp.Num(), PSN: 100},
		&rxego.ConnectOptions{LocalPSN: 200}); err != nil {
		t.Fatal(err)
	}
	qa, qb := a.qp.Query(), b.qp.Query()
	if qa.RNRRetry != 0 || qa.Timeout != 0 || qa.RetryCnt != 0 || qa.MinRNRTimer != 0 || qa.PathMTU != qp.MTU1024 {
		t.Errorf("exact options: QP holds %+v", qa)
	}
	if qb.RNRRetry != 7 || qb.Timeout != 14 || qb.RetryCnt != 7 || qb.MinRNRTimer != 12 || qb.MaxRdAtomic != 1 {
		t.Errorf("literal options: QP holds %+v; want ibv_rc_pingpong's defaults", qb)
	}
	// b has no receive posted: the first RNR NAK ends the SEND.
	if err := a.qp.PostSend(rxego.SendWR{ID: 5, Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: 8, LKey: a.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, a.cq); wc.ID != 5 || wc.Status != qp.WCRNRRetryExcErr {
		t.Fatalf("SEND with rnr_retry 0 into no receive: %+v; want RNR_RETRY_EXC_ERR", wc)
	}
	if n := a.dev.Stats().RcvdRNRErr; n != 1 {
		t.Errorf("%d RNR NAKs received, want 1", n)
	}
}
