package rxego_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/qp"
)

// TestErrorsNameWhatIsWrong: Modify names the attributes a transition
// lacks as verbs spells them, CreateQP names the Caps field out of range
// and its range, and a CQ that one QP uses for sending and receiving is
// in use by 1 QP, not 2.
func TestErrorsNameWhatIsWrong(t *testing.T) {
	a := openSide(t, nil)
	if err := a.qp.Init(0); err != nil {
		t.Fatal(err)
	}
	err := a.qp.Modify(&qp.Attr{State: qp.RTR}, qp.AttrState)
	want := "RC INIT -> RTR also needs IBV_QP_AV|IBV_QP_PATH_MTU|IBV_QP_RQ_PSN|IBV_QP_MIN_RNR_TIMER|IBV_QP_MAX_DEST_RD_ATOMIC|IBV_QP_DEST_QPN (attribute mask 0x129180)"
	if !errors.Is(err, qp.ErrInvalidModify) || !strings.Contains(err.Error(), want) {
		t.Errorf("Modify INIT -> RTR with no attribute: %v\nwant %q", err, want)
	}
	err = a.qp.Modify(&qp.Attr{State: qp.Init, QKey: 5}, qp.AttrState|qp.AttrQKey)
	if !errors.Is(err, qp.ErrInvalidModify) || !strings.Contains(err.Error(), "does not take IBV_QP_QKEY (attribute mask 0x40)") {
		t.Errorf("Modify RC with a Q_Key: %v", err)
	}
	for _, c := range []struct {
		caps rxego.Caps
		want string
	}{
		{rxego.Caps{}, "Caps.MaxSendWR 0 out of range: want 1 to 65536"},
		{rxego.Caps{MaxSendWR: 4}, "Caps.MaxRecvWR 0 out of range: want 1 to 65536 (the receive queue's depth (0 only with an SRQ))"},
		{rxego.Caps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 33}, "Caps.MaxSendSGE 33 out of range: want 0 to 32"},
		{rxego.Caps{MaxSendWR: 4, MaxRecvWR: 4, MaxInlineData: 513}, "Caps.MaxInlineData 513 out of range: want 0 to 512"},
	} {
		if _, err := a.pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: a.cq, RecvCQ: a.cq, Caps: c.caps}); err == nil ||
			!strings.Contains(err.Error(), c.want) {
			t.Errorf("CreateQP(%+v): %v; want %q", c.caps, err, c.want)
		}
	}
	if err := a.cq.Close(); !errors.Is(err, rxego.ErrBusy) || !strings.Contains(err.Error(), "in use by 1 QP(s)") {
		t.Errorf("CQ.Close while one QP uses it both ways: %v", err)
	}
	if err := a.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := a.cq.Close(); err != nil {
		t.Errorf("CQ.Close once its QP is destroyed: %v", err)
	}
}

// TestSecondCloseIsErrClosed: every object's second Close, Destroy,
// Deregister or Dealloc returns ErrClosed, as os.File's second Close.
func TestSecondCloseIsErrClosed(t *testing.T) {
	a := openSide(t, nil)
	srq, err := a.pd.CreateSRQ(4, 1)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := a.pd.AllocMW(rxego.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	pd2, err := a.dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		close func() error
	}{
		{"QP.Destroy", a.qp.Destroy},
		{"CQ.Close", a.cq.Close},
		{"MR.Deregister", a.mr.Deregister},
		{"MW.Dealloc", mw.Dealloc},
		{"SRQ.Destroy", srq.Destroy},
		{"PD.Dealloc", pd2.Dealloc},
		{"Device.Close", a.dev.Close},
	} {
		if err := c.close(); err != nil {
			t.Errorf("first %s: %v", c.name, err)
		}
		if err := c.close(); !errors.Is(err, rxego.ErrClosed) {
			t.Errorf("second %s: %v; want ErrClosed", c.name, err)
		}
	}
	// A closed, empty CQ says so to Poll as to PollWait.
	if n, err := a.cq.Poll(make([]rxego.WC, 4)); n != 0 || !errors.Is(err, rxego.ErrClosed) {
		t.Errorf("Poll on a closed CQ: %d, %v; want 0 and ErrClosed", n, err)
	}
}

// TestPollWaitNoRoom: PollWait with nil or empty wcs returns 0 at once,
// as ibv_poll_cq asked for 0 entries, whatever the CQ holds.
func TestPollWaitNoRoom(t *testing.T) {
	a := openSide(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, wcs := range [][]rxego.WC{nil, {}} {
		if n, err := a.cq.PollWait(ctx, wcs); n != 0 || err != nil {
			t.Errorf("PollWait(%d entries) = %d, %v; want 0, nil", len(wcs), n, err)
		}
	}
}

// TestConnectRCRollsBack: a ConnectRC that fails at its last step (a
// retry_cnt out of range) leaves a QP that was in RESET in RESET, and the
// error says so; one started in INIT, with receives posted, stays in RTR
// and keeps them.
func TestConnectRCRollsBack(t *testing.T) {
	a, b := openSide(t, nil), openSide(t, nil)
	o := rxego.DefaultConnectOptions()
	o.RetryCnt = 9
	remote := rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qp.Num()}
	err := a.qp.Connect(remote, &o)
	if err == nil || !strings.Contains(err.Error(), "(moved back to RESET)") || !strings.Contains(err.Error(), "retry_cnt 9 exceeds 7") {
		t.Errorf("ConnectRC with retry_cnt 9: %v", err)
	}
	if st := a.qp.State(); st != qp.Reset {
		t.Errorf("QP in %v after the failed ConnectRC; want RESET", st)
	}
	// It can be connected afterwards, as a fresh QP.
	if err := a.qp.Connect(remote, nil); err != nil {
		t.Fatalf("ConnectRC after the rollback: %v", err)
	}
	c := openSide(t, nil)
	if err := c.qp.Init(0); err != nil {
		t.Fatal(err)
	}
	if err := c.qp.PostRecv(rxego.RecvWR{ID: 1, SGL: []rxego.SGE{{Addr: c.mr.IOVA(), Length: 8, LKey: c.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	err = c.qp.Connect(remote, &o)
	if err == nil || !strings.Contains(err.Error(), "(left in RTR, not moved back: its posted receives would be dropped)") {
		t.Errorf("ConnectRC from INIT: %v", err)
	}
	if st := c.qp.State(); st != qp.RTR {
		t.Errorf("QP in %v; want RTR", st)
	}
}

// TestSRQDestroyAndLimit: an SRQ in use refuses Destroy (EBUSY); an armed
// limit fires once when a receive taken leaves fewer WQEs than the limit,
// and disarms (IBV_EVENT_SRQ_LIMIT_REACHED).
func TestSRQDestroyAndLimit(t *testing.T) {
	a, b := openSide(t, nil), openSide(t, nil)
	srq, err := b.pd.CreateSRQ(8, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := srq.Arm(8); err == nil || !strings.Contains(err.Error(), "SRQ limit 8 out of range: want 0 (disarm) to 7") {
		t.Errorf("Arm(depth): %v", err)
	}
	q, err := b.pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: b.cq, RecvCQ: b.cq, SRQ: srq, Caps: rxego.Caps{MaxSendWR: 4}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srq.Destroy(); !errors.Is(err, rxego.ErrBusy) {
		t.Errorf("SRQ.Destroy while a QP uses it: %v; want ErrBusy", err)
	}
	if err := a.qp.Connect(rxego.RemoteQP{Addr: b.dev.Addr(), QPN: q.Num(), PSN: 1}, &rxego.ConnectOptions{LocalPSN: 2}); err != nil {
		t.Fatal(err)
	}
	if err := q.Connect(rxego.RemoteQP{Addr: a.dev.Addr(), QPN: a.qp.Num(), PSN: 2}, &rxego.ConnectOptions{LocalPSN: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if err := srq.PostRecv(rxego.RecvWR{ID: uint64(i), SGL: []rxego.SGE{{Addr: b.mr.IOVA() + uint64(64*i), Length: 64, LKey: b.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := srq.Arm(3); err != nil {
		t.Fatal(err)
	}
	send := func(id uint64) {
		t.Helper()
		if err := a.qp.PostSend(rxego.SendWR{ID: id, Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
			SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: 8, LKey: a.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		if wc := wait1(t, b.cq); wc.Status != rxego.WCSuccess {
			t.Fatalf("receive %d: %+v", id, wc)
		}
	}
	send(1) // 3 left: not below the limit
	select {
	case <-srq.LimitReached():
		t.Fatal("limit event with 3 WQEs posted and the limit 3")
	default:
	}
	send(2) // 2 left: below 3
	select {
	case <-srq.LimitReached():
	default:
		t.Fatal("no limit event with 2 WQEs posted and the limit 3")
	}
	if srq.Limit() != 0 {
		t.Errorf("limit %d after the event; want 0 (disarmed)", srq.Limit())
	}
	send(3) // 1 left: disarmed, no second event
	select {
	case <-srq.LimitReached():
		t.Error("a second limit event without Arm")
	default:
	}
	if err := q.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := srq.Destroy(); err != nil {
		t.Errorf("SRQ.Destroy once its QP is gone: %v", err)
	}
	if err := srq.PostRecv(rxego.RecvWR{}); !errors.Is(err, rxego.ErrClosed) {
		t.Errorf("PostRecv on a destroyed SRQ: %v", err)
	}
	if _, ok := <-srq.LimitReached(); ok {
		t.Error("LimitReached's channel open after Destroy")
	}
}

// TestNamesPrint: MTUs and completion flags print as verbs names them.
func TestNamesPrint(t *testing.T) {
	for _, c := range []struct {
		v    fmt.Stringer
		want string
	}{
		{qp.MTU1024, "IBV_MTU_1024"},
		{rxego.MTU(9), "MTU(9)"},
		{rxego.WCWithGRH | rxego.WCWithImm, "IBV_WC_GRH|IBV_WC_WITH_IMM"},
		{qp.WCFlags(0), "0"},
		{qp.WCFlags(0x30), "0x30"},
		{qp.AttrState | qp.AttrDestQPN, "IBV_QP_STATE|IBV_QP_DEST_QPN"},
	} {
		if got := fmt.Sprint(c.v); got != c.want {
			t.Errorf("%#v prints %q; want %q", c.v, got, c.want)
		}
	}
}
