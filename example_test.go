package rxego_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
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
	if err := a.qp.Connect(rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qp.Num(), PSN: 2000}, &rxego.ConnectOptions{LocalPSN: 1000}); err != nil {
		return err
	}
	return b.qp.Connect(rxego.RemoteQP{Addr: a.dev.Addr(), QPN: a.qp.Num(), PSN: 1000}, &rxego.ConnectOptions{LocalPSN: 2000})
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

// The README's "Using the API" snippet, kept compiling and running here.

// Peer is what two sides swap out of band (over TCP, say, as
// ibv_rc_pingpong does) before RDMA can flow.
type Peer struct {
	QP   rxego.RemoteQP // address, QP number, first PSN
	VA   uint64         // a registered buffer's address
	RKey uint32         // and its remote key
}

// swapWrite opens a device on addr, connects an RC QP to the peer, writes
// msg into the peer's buffer with RDMA WRITE and returns what the peer
// wrote into this side's buffer. swap trades Peers with the other side;
// done tells it this side's write completed and waits for its own.
func swapWrite(ctx context.Context, addr string, msg []byte, swap func(Peer) Peer, done func()) (string, error) {
	dev, err := rxego.Open(addr, nil) // UDP port 4791 unless addr names one
	if err != nil {
		return "", err
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	buf := make([]byte, 4096) // the peer writes into [0, 2048); msg goes out from [2048, 4096)
	mr, err := pd.RegMR(buf, rxego.AccessLocalWrite|rxego.AccessRemoteWrite)
	if err != nil {
		return "", err
	}
	cq, _ := dev.CreateCQ(16)
	qp, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq, RecvCQ: cq,
		Caps: rxego.Caps{MaxSendWR: 16, MaxRecvWR: 16}})
	if err != nil {
		return "", err
	}
	copy(buf[2048:], msg)
	peer := swap(Peer{QP: rxego.RemoteQP{Addr: dev.Addr(), QPN: qp.Num()}, VA: mr.IOVA(), RKey: mr.RKey()})
	if err := qp.Connect(peer.QP, nil); err != nil {
		return "", err
	}
	err = qp.PostSend(rxego.SendWR{ID: 1, Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
		SGL:        []rxego.SGE{{Addr: mr.IOVA() + 2048, Length: uint32(len(msg)), LKey: mr.LKey()}},
		RemoteAddr: peer.VA, RKey: peer.RKey})
	if err != nil {
		return "", err
	}
	wc := make([]rxego.WC, 1)
	if _, err := cq.PollWait(ctx, wc); err != nil {
		return "", err
	}
	if wc[0].Status != rxego.WCSuccess {
		return "", fmt.Errorf("RDMA WRITE: %v", wc[0].Status)
	}
	done()
	// The peer's write reached buf through the engine, and this goroutine
	// learnt of it out of band: Sync orders it before buf is read.
	dev.Sync()
	return string(bytes.TrimRight(buf[:2048], "\x00")), nil
}

// Two sides on loopback swap QP details and each writes a message into
// the other's memory: the README's snippet, run.
func Example_swapWrite() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	toA, toB := make(chan Peer, 1), make(chan Peer, 1)
	doneA, doneB := make(chan struct{}), make(chan struct{})
	var got [2]string
	var errs [2]error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		got[0], errs[0] = swapWrite(ctx, "127.0.0.1:24795", []byte("hello from A"),
			func(me Peer) Peer { toB <- me; return <-toA }, func() { close(doneA); <-doneB })
	}()
	go func() {
		defer wg.Done()
		got[1], errs[1] = swapWrite(ctx, "127.0.0.1:24796", []byte("hello from B"),
			func(me Peer) Peer { toA <- me; return <-toB }, func() { close(doneB); <-doneA })
	}()
	wg.Wait()
	fmt.Printf("A holds %q (%v), B holds %q (%v)\n", got[0], errs[0], got[1], errs[1])
	// Output:
	// A holds "hello from B" (<nil>), B holds "hello from A" (<nil>)
}
