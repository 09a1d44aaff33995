package reliability_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/transport"
)

// TestBigReadSmallSocket (issue 23): an 8 MiB READ into a device whose
// socket receive buffer is small completes without overflowing that
// socket: the device sizes its READ requests and the responses it lets be
// in flight from the buffer it got (qp/readsplit.go), where one 8 MiB
// request made the responder send 8 MiB at once and each retry asked for
// the rest of it again.
func TestBigReadSmallSocket(t *testing.T) {
	const size = 8 << 20
	addrA, addrB := nextLoopback()
	a := openEnd(t, endConfig{addr: addrA, size: size, opts: transport.Options{SocketRecvBuffer: 128 << 10}})
	b := openEnd(t, endConfig{addr: addrB, size: size})
	for i := range b.buf {
		b.buf[i] = byte(i*7 + i>>13)
	}
	connect(t, a, b, rxego.ConnectOptions{MTU: rxego.MTU1024, Timeout: 14, RetryCnt: 7, MaxRdAtomic: 16})
	if err := a.qp.PostSend(rxego.SendWR{ID: 1, Opcode: rxego.WRRead, Flags: rxego.SendSignaled, SGL: a.sge(0, size),
		RemoteAddr: b.addr(0), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	pollN(t, a.scq, 1, 60*time.Second, func(_ int, wc rxego.WC) {
		if wc.Status != rxego.WCSuccess || wc.ByteLen != size {
			t.Fatalf("READ completed %v, %d bytes", wc.Status, wc.ByteLen)
		}
	})
	a.dev.Sync()
	if !bytes.Equal(a.buf, b.buf) {
		t.Fatal("the data read differs")
	}
	ts := a.dev.Transport().Stats()
	st := a.dev.Stats()
	t.Logf("reader: %s", a.stats())
	if n := ts.Drops[transport.DropOverflow]; n != 0 {
		t.Fatalf("the reader's socket overflowed %d times: %s", n, a.stats())
	}
	if st.ReadBudgetWaits == 0 || st.RDMASends < 2 {
		t.Fatalf("read_budget_waits %d, rdma_sends %d: the READ was not split into requests within the budget",
			st.ReadBudgetWaits, st.RDMASends)
	}
}
