package rxego_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/rxego/rxego"
)

// endpoint is what each side of the examples sets up.
type endpoint struct {
	dev *rxego.Device
	pd  *rxego.PD
	cq  *rxego.CQ
	qp  *rxego.QP
	mr  *rxego.MR
	buf []byte
}

func setup(addr string) (*endpoint, error) {
	dev, err := rxego.Open(addr, nil)
	if err != nil {
		return nil, err
	}
	e := &endpoint{dev: dev, buf: make([]byte, 4096)}
	e.pd, _ = dev.AllocPD()
	e.cq, _ = dev.CreateCQ(16)
	if e.qp, err = e.pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: e.cq, RecvCQ: e.cq,
		Caps: rxego.Caps{MaxSendWR: 16, MaxRecvWR: 16}}); err != nil {
		return nil, err
	}
	e.mr, err = e.pd.RegMR(e.buf, rxego.AccessLocalWrite|rxego.AccessRemoteWrite|rxego.AccessRemoteRead|rxego.AccessRemoteAtomic)
	return e, err
}

// connect joins two endpoints, as an out-of-band exchange of QP numbers
// and PSNs would.
func connect(a, b *endpoint) error {
	if err := rxego.ConnectRC(a.qp, rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qp.Num(), PSN: 2000}, &rxego.ConnectOptions{LocalPSN: 1000}); err != nil {
		return err
	}
	return rxego.ConnectRC(b.qp, rxego.RemoteQP{Addr: a.dev.Addr(), QPN: a.qp.Num(), PSN: 1000}, &rxego.ConnectOptions{LocalPSN: 2000})
}

// pair sets up and connects endpoints on two addresses.
func pair(addrA, addrB string) (a, b *endpoint, err error) {
	if a, err = setup(addrA); err != nil {
		return nil, nil, err
	}
	if b, err = setup(addrB); err == nil {
		err = connect(a, b)
	}
	if err != nil {
		a.dev.Close()
		if b != nil {
			b.dev.Close()
		}
		return nil, nil, err
	}
	return a, b, nil
}

func wait(cq *rxego.CQ) rxego.WC {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wc := make([]rxego.WC, 1)
	cq.PollWait(ctx, wc)
	return wc[0]
}

// Two devices on loopback: an RDMA WRITE places bytes in the peer's memory
// without the peer's CPU taking part; a SEND hands a message to a posted
// receive.
func Example() {
	a, b, err := pair("127.0.0.1:24791", "127.0.0.1:24792")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.dev.Close()
	defer b.dev.Close()

	copy(a.buf, "written remotely")
	a.qp.PostSend(rxego.SendWR{ID: 1, Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
		SGL:        []rxego.SGE{{Addr: a.mr.IOVA(), Length: 16, LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()})
	wc := wait(a.cq)
	b.dev.Sync() // the write came over the network: order it before reading
	fmt.Printf("WRITE: %v; the peer holds %q\n", wc.Status, b.buf[:16])

	b.qp.PostRecv(rxego.RecvWR{ID: 2, SGL: []rxego.SGE{{Addr: b.mr.IOVA() + 100, Length: 64, LKey: b.mr.LKey()}}})
	copy(a.buf, "hello over SEND")
	a.qp.PostSend(rxego.SendWR{ID: 3, Opcode: rxego.WRSendImm, Imm: 42, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: a.mr.IOVA(), Length: 15, LKey: a.mr.LKey()}}})
	rwc := wait(b.cq)
	wait(a.cq)
	fmt.Printf("SEND: receiver got %d bytes %q with immediate %d\n", rwc.ByteLen, b.buf[100:100+rwc.ByteLen], rwc.Imm)
	// Output:
	// WRITE: success; the peer holds "written remotely"
	// SEND: receiver got 15 bytes "hello over SEND" with immediate 42
}

// An RDMA READ fetches remote memory; FETCH_AND_ADD updates a remote
// 64-bit counter atomically and returns the value before.
func Example_readAndAtomics() {
	a, b, err := pair("127.0.0.1:24793", "127.0.0.1:24794")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.dev.Close()
	defer b.dev.Close()
	copy(b.buf, "remote notes")
	off := 1024 - int(b.mr.IOVA()%8) // an 8-byte-aligned counter
	binary.NativeEndian.PutUint64(b.buf[off:], 10)
	b.dev.Sync() // publish the bytes before the peer reads them

	a.qp.PostSend(rxego.SendWR{ID: 1, Opcode: rxego.WRRead, Flags: rxego.SendSignaled,
		SGL:        []rxego.SGE{{Addr: a.mr.IOVA(), Length: 12, LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()})
	wc := wait(a.cq)
	fmt.Printf("READ: %v, %q\n", wc.Status, a.buf[:12])

	res := 2048 - int(a.mr.IOVA()%8)
	a.qp.PostSend(rxego.SendWR{ID: 2, Opcode: rxego.WRFetchAdd, Flags: rxego.SendSignaled, CompareAdd: 5,
		SGL:        []rxego.SGE{{Addr: a.mr.IOVA() + uint64(res), Length: 8, LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.IOVA() + uint64(off), RKey: b.mr.RKey()})
	wait(a.cq)
	b.dev.Sync()
	fmt.Printf("FETCH_AND_ADD returned %d; the counter is now %d\n",
		binary.NativeEndian.Uint64(a.buf[res:]), binary.NativeEndian.Uint64(b.buf[off:]))
	// Output:
	// READ: success, "remote notes"
	// FETCH_AND_ADD returned 10; the counter is now 15
}
