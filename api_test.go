package rxego_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/qp"
)

// TestRecvGRHFlag: successful RC receive completions (SEND, SEND with
// immediate, WRITE with immediate) carry IBV_WC_GRH, as rxe's do on
// RoCE; flushed ones do not.
func TestRecvGRHFlag(t *testing.T) {
	a, b := openSide(t, nil), openSide(t, nil)
	connectPair(t, a, b, &rxego.ConnectOptions{})
	for i := range 4 {
		if err := b.qp.PostRecv(rxego.RecvWR{ID: uint64(10 + i), SGL: []rxego.SGE{{Addr: b.mr.IOVA(), Length: 64, LKey: b.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	sge := []rxego.SGE{{Addr: a.mr.IOVA(), Length: 8, LKey: a.mr.LKey()}}
	wrs := []rxego.SendWR{
		{ID: 1, Opcode: rxego.WRSend, SGL: sge},
		{ID: 2, Opcode: rxego.WRSendImm, Imm: 5, SGL: sge},
		{ID: 3, Opcode: rxego.WRWriteImm, Imm: 6, SGL: sge, RemoteAddr: b.mr.IOVA() + 1024, RKey: b.mr.RKey()},
	}
	if err := a.qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		op    qp.WCOpcode
		flags qp.WCFlags
	}{{qp.WCRecv, qp.WCWithGRH}, {qp.WCRecv, qp.WCWithGRH | qp.WCWithImm}, {qp.WCRecvRDMAImm, qp.WCWithGRH | qp.WCWithImm}}
	for i, w := range want {
		wc := wait1(t, b.cq)
		if wc.Status != qp.WCSuccess || wc.Opcode != w.op || wc.Flags != w.flags {
			t.Errorf("receive %d: %+v; want %v with flags %#x", i, wc, w.op, w.flags)
		}
	}
	// The fourth receive flushes: no GRH.
	attr := rxego.QPAttr{State: qp.Err}
	if err := b.qp.Modify(&attr, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	if wc := wait1(t, b.cq); wc.Status != qp.WCWRFlushErr || wc.Flags&qp.WCWithGRH != 0 {
		t.Errorf("flushed receive: %+v; want WR_FLUSH_ERR without GRH", wc)
	}
}

// TestNotifySelect waits for completions in a select beside another
// channel, in both receive modes: every completion is seen, the other
// channel's events too, and an already non-empty CQ is ready at once.
func TestNotifySelect(t *testing.T) {
	for _, m := range lifecycleModes {
		t.Run(m.name, func(t *testing.T) {
			opts := m.opts()
			a, b := openSide(t, opts()), openSide(t, opts())
			connectPair(t, a, b, &rxego.ConnectOptions{})
			select {
			case <-a.cq.Notify():
				t.Fatal("Notify ready on an empty CQ")
			default:
			}
			const n = 50
			other := make(chan int)
			go func() {
				for i := range 3 {
					other <- i
				}
			}()
			posted, done, others := 0, 0, 0
			post := func() {
				if err := a.qp.PostSend(rxego.SendWR{ID: uint64(posted), Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
					SGL:        []rxego.SGE{{Addr: a.mr.IOVA(), Length: 256, LKey: a.mr.LKey()}},
					RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}); err != nil {
					t.Fatal(err)
				}
				posted++
			}
			post()
			timeout := time.After(10 * time.Second)
			wcs := make([]rxego.WC, 8)
			for done < n || others < 3 {
				select {
				case <-a.cq.Notify():
					for k, _ := a.cq.Poll(wcs); k > 0; k, _ = a.cq.Poll(wcs) {
						for _, wc := range wcs[:k] {
							if wc.Status != qp.WCSuccess || wc.ID != uint64(done) {
								t.Fatalf("completion %+v, want wr_id %d success", wc, done)
							}
							done++
							if posted < n {
								post()
							}
						}
					}
				case <-other:
					others++
				case <-timeout:
					t.Fatalf("%d of %d completions and %d of 3 other events after 10 s", done, n, others)
				}
			}

			// A completion that arrived before Notify is not missed.
			post()
			deadline := time.Now().Add(5 * time.Second)
			for a.cq.Len() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond) // the device's receive goroutine takes it in
			}
			select {
			case <-a.cq.Notify():
			default:
				t.Fatalf("Notify not ready with %d completions queued", a.cq.Len())
			}
		})
	}
}

// TestReadmeSnippet: the README's API code block is example_test.go's
// swapWrite, which Example_swapWrite compiles and runs.
func TestReadmeSnippet(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	ex, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, sect, ok := strings.Cut(string(readme), "## Using the API")
	_, block, ok2 := strings.Cut(sect, "```go\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 || !strings.Contains(block, "func swapWrite(") {
		t.Fatal("README.md has no ```go block with swapWrite under \"## Using the API\"")
	}
	if !strings.Contains(string(ex), block) {
		t.Fatal("README.md's API snippet differs from example_test.go's swapWrite: copy it over")
	}
}
