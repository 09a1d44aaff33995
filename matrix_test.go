package rxego_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/internal/testenv/testaddr"
	"github.com/rxego/rxego/qp"
)

// node is one device with one QP and one registered buffer.
type node struct {
	dev *rxego.Device
	qp  *rxego.QP
	cq  *rxego.CQ
	mr  *rxego.MR
	buf []byte
}

const allRemote = rxego.AccessLocalWrite | rxego.AccessRemoteWrite | rxego.AccessRemoteRead | rxego.AccessRemoteAtomic

func newNode(t *testing.T, dev *rxego.Device, typ rxego.QPType, size int) *node {
	t.Helper()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(256)
	q, err := pd.CreateQP(rxego.QPInitAttr{Type: typ, SendCQ: cq, RecvCQ: cq, Caps: rxego.Caps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2}})
	if err != nil {
		t.Fatal(err)
	}
	// One extra page so 8-byte-aligned atomic targets fit after the data.
	buf := make([]byte, size+4096)
	m, err := pd.RegMR(buf, allRemote)
	if err != nil {
		t.Fatal(err)
	}
	return &node{dev, q, cq, m, buf}
}

// ipv6Pair opens two devices on [::1] with distinct UDP ports.
func ipv6Pair(t *testing.T) (*rxego.Device, *rxego.Device) {
	t.Helper()
	var devs []*rxego.Device
	for port := 20000 + rand.IntN(20000); len(devs) < 2 && port < 65000; port += 7 {
		d, err := rxego.Open(netip.AddrPortFrom(netip.IPv6Loopback(), uint16(port)).String(), nil)
		if err != nil {
			continue
		}
		t.Cleanup(func() { d.Close() })
		devs = append(devs, d)
	}
	if len(devs) < 2 {
		t.Skip("no IPv6 loopback")
	}
	return devs[0], devs[1]
}

func (n *node) one(t *testing.T, what string) rxego.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wc := make([]rxego.WC, 1)
	if _, err := n.cq.PollWait(ctx, wc); err != nil {
		t.Fatalf("%s: no completion: %v", what, err)
	}
	if wc[0].Status != 0 {
		t.Fatalf("%s: completion %v (%+v)", what, wc[0].Status, wc[0])
	}
	return wc[0]
}

func (n *node) sge(off, size int) []rxego.SGE {
	return []rxego.SGE{{Addr: n.mr.IOVA() + uint64(off), Length: uint32(size), LKey: n.mr.LKey()}}
}

// aligned returns an offset at or after off whose IOVA is 8-byte aligned.
func (n *node) aligned(off int) int { return off + int((8-(n.mr.IOVA()+uint64(off))%8)%8) }

// TestMatrix runs every operation of every QP type over real UDP sockets,
// IPv4 and IPv6, at every path MTU and the sizes around it, starting the
// PSNs just below the 24-bit wrap, and checks every byte and completion.
func TestMatrix(t *testing.T) {
	for _, family := range []string{"ipv4", "ipv6"} {
		for _, mtu := range []qp.MTU{qp.MTU256, qp.MTU512, qp.MTU1024, qp.MTU2048, qp.MTU4096} {
			for _, typ := range []rxego.QPType{rxego.RC, rxego.UC, rxego.UD} {
				t.Run(fmt.Sprintf("%s/%v/mtu%d", family, typ, mtu.Bytes()), func(t *testing.T) {
					var da, db *rxego.Device
					if family == "ipv4" {
						da, db = testaddr.Open(t, nil), testaddr.Open(t, nil)
					} else {
						da, db = ipv6Pair(t)
					}
					runMatrix(t, da, db, typ, mtu)
				})
			}
		}
	}
}

func runMatrix(t *testing.T, da, db *rxego.Device, typ rxego.QPType, mtu qp.MTU) {
	m := mtu.Bytes()
	const big = 1 << 20
	a, b := newNode(t, da, typ, big), newNode(t, db, typ, big)
	const psnA, psnB = 0xfffff0, 0xffffe0 // both wrap within the first messages
	if typ == rxego.UD {
		if err := a.qp.ActivateUD(0x1234, psnA); err != nil {
			t.Fatal(err)
		}
		if err := b.qp.ActivateUD(0x1234, psnB); err != nil {
			t.Fatal(err)
		}
	} else {
		o := &rxego.ConnectOptions{MTU: mtu, LocalPSN: psnA, MaxRdAtomic: 4, Timeout: 12}
		if err := a.qp.Connect(rxego.RemoteQP{Addr: db.Addr(), QPN: b.qp.Num(), PSN: psnB}, o); err != nil {
			t.Fatal(err)
		}
		o.LocalPSN = psnB
		if err := b.qp.Connect(rxego.RemoteQP{Addr: da.Addr(), QPN: a.qp.Num(), PSN: psnA}, o); err != nil {
			t.Fatal(err)
		}
	}
	sizes := []int{0, 1, m - 1, m, m + 1, big}
	if typ == rxego.UD {
		sizes = []int{0, 1, m - 1, m} // a UD message is one packet
		if m > 4096-1 {
			sizes = []int{0, 1, m - 1}
		}
	}
	var seed uint64
	for _, size := range sizes {
		for _, op := range opsFor(typ) {
			seed++
			what := fmt.Sprintf("%v %d bytes", op, size)
			r := rand.New(rand.NewPCG(seed, 7))
			for i := range a.buf[:size] {
				a.buf[i] = byte(r.Uint32())
			}
			clear(b.buf[:size])
			b.dev.Sync()
			switch op {
			case rxego.WRSend, rxego.WRSendImm:
				recvLen := size
				if typ == rxego.UD {
					recvLen += qp.GRHLen
				}
				if err := b.qp.PostRecv(rxego.RecvWR{ID: 1, SGL: b.sge(0, recvLen)}); err != nil {
					t.Fatal(err)
				}
				wr := rxego.SendWR{ID: 2, Opcode: op, Imm: uint32(seed), Flags: rxego.SendSignaled, SGL: a.sge(0, size)}
				if typ == rxego.UD {
					wr.AH, wr.RemoteQPN, wr.RemoteQKey = &rxego.AH{Dest: b.dev.Addr()}, b.qp.Num(), 0x1234
				}
				if err := a.qp.PostSend(wr); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				rw := b.one(t, what+" receive")
				sw := a.one(t, what+" send")
				got := b.buf[:size]
				if typ == rxego.UD {
					if rw.ByteLen != uint32(size+qp.GRHLen) || rw.SrcQP != a.qp.Num() || rw.Flags&qp.WCWithGRH == 0 {
						t.Fatalf("%s: UD receive %+v", what, rw)
					}
					got = b.buf[qp.GRHLen : qp.GRHLen+size]
				} else if rw.ByteLen != uint32(size) {
					t.Fatalf("%s: receive byte_len %d", what, rw.ByteLen)
				}
				if rw.Opcode != qp.WCRecv || sw.Opcode != qp.WCSend || sw.ID != 2 || rw.ID != 1 || rw.QPN != b.qp.Num() {
					t.Fatalf("%s: completions %+v / %+v", what, sw, rw)
				}
				if op == rxego.WRSendImm && (rw.Imm != uint32(seed) || rw.Flags&qp.WCWithImm == 0) {
					t.Fatalf("%s: immediate %+v", what, rw)
				}
				if !bytes.Equal(got, a.buf[:size]) {
					t.Fatalf("%s: data differs", what)
				}
			case rxego.WRWrite, rxego.WRWriteImm:
				rcvd0 := b.dev.Stats().RcvdBytes
				if op == rxego.WRWriteImm {
					if err := b.qp.PostRecv(rxego.RecvWR{ID: 3}); err != nil {
						t.Fatal(err)
					}
				}
				if err := a.qp.PostSend(rxego.SendWR{ID: 4, Opcode: op, Imm: uint32(seed), Flags: rxego.SendSignaled,
					SGL: a.sge(0, size), RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}); err != nil {
					t.Fatal(err)
				}
				if op == rxego.WRWriteImm {
					rw := b.one(t, what+" receive")
					if rw.Opcode != qp.WCRecvRDMAImm || rw.ByteLen != uint32(size) || rw.Imm != uint32(seed) || rw.ID != 3 {
						t.Fatalf("%s: receive %+v", what, rw)
					}
				}
				if sw := a.one(t, what); sw.Opcode != qp.WCWrite || sw.ID != 4 {
					t.Fatalf("%s: completion %+v", what, sw)
				}
				if typ == rxego.UC {
					// UC completes on send; the data may still be in flight.
					waitBytes(t, b, rcvd0+uint64(size), what)
				}
				b.dev.Sync()
				if !bytes.Equal(b.buf[:size], a.buf[:size]) {
					t.Fatalf("%s: data differs", what)
				}
				if op == rxego.WRWrite && b.cq.Len() != 0 {
					t.Fatalf("%s: a WRITE made a receiver completion", what)
				}
			case rxego.WRRead:
				copy(b.buf[:size], a.buf[:size])
				b.dev.Sync()
				clear(a.buf[big-size : big])
				if err := a.qp.PostSend(rxego.SendWR{ID: 5, Opcode: op, Flags: rxego.SendSignaled,
					SGL: a.sge(big-size, size), RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}); err != nil {
					t.Fatal(err)
				}
				if sw := a.one(t, what); sw.Opcode != qp.WCRead || sw.ByteLen != uint32(size) {
					t.Fatalf("%s: completion %+v", what, sw)
				}
				if !bytes.Equal(a.buf[big-size:big], b.buf[:size]) {
					t.Fatalf("%s: data differs", what)
				}
			case rxego.WRFetchAdd, rxego.WRCompareSwap, rxego.WRAtomicWrite:
				if size != 8 && size != 0 {
					continue // atomics are 8 bytes; run them once per MTU
				}
				tgt, res := b.aligned(big), a.aligned(big)
				binary.NativeEndian.PutUint64(b.buf[tgt:], 1000)
				b.dev.Sync()
				wr := rxego.SendWR{ID: 6, Opcode: op, Flags: rxego.SendSignaled, SGL: a.sge(res, 8),
					RemoteAddr: b.mr.IOVA() + uint64(tgt), RKey: b.mr.RKey(), CompareAdd: 1000, Swap: 77}
				binary.NativeEndian.PutUint64(wr.AtomicValue[:], 4242)
				if op == rxego.WRFetchAdd {
					wr.CompareAdd = 5
				}
				if err := a.qp.PostSend(wr); err != nil {
					t.Fatal(err)
				}
				a.one(t, what)
				b.dev.Sync()
				want := map[qp.WROpcode]uint64{rxego.WRFetchAdd: 1005, rxego.WRCompareSwap: 77, rxego.WRAtomicWrite: 4242}[op]
				if got := binary.NativeEndian.Uint64(b.buf[tgt:]); got != want {
					t.Fatalf("%s: target %d, want %d", what, got, want)
				}
				if op != rxego.WRAtomicWrite {
					if got := binary.NativeEndian.Uint64(a.buf[res:]); got != 1000 {
						t.Fatalf("%s: returned %d, want 1000", what, got)
					}
				}
			}
		}
	}
}

func opsFor(typ rxego.QPType) []qp.WROpcode {
	switch typ {
	case rxego.UD:
		return []qp.WROpcode{rxego.WRSend, rxego.WRSendImm}
	case rxego.UC:
		return []qp.WROpcode{rxego.WRSend, rxego.WRSendImm, rxego.WRWrite, rxego.WRWriteImm}
	}
	return []qp.WROpcode{rxego.WRSend, rxego.WRSendImm, rxego.WRWrite, rxego.WRWriteImm, rxego.WRRead,
		rxego.WRFetchAdd, rxego.WRCompareSwap, rxego.WRAtomicWrite}
}

// waitBytes waits (bounded) until b's engine has received n payload
// bytes in all: a UC WRITE has no acknowledgement, so the sender's
// completion can precede delivery. The counter is atomic, so watching it
// does not race with the engine writing the buffer.
func waitBytes(t *testing.T, b *node, n uint64, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if b.dev.Stats().RcvdBytes >= n {
			return
		}
	}
	t.Fatalf("%s: data never arrived", what)
}

// TestLargeMessages moves 64 MiB by WRITE and by READ over real sockets.
func TestLargeMessages(t *testing.T) {
	if testing.Short() {
		t.Skip("64 MiB transfers skipped in -short mode")
	}
	const size = 64 << 20
	a, b := newNode(t, testaddr.Open(t, nil), rxego.RC, size), newNode(t, testaddr.Open(t, nil), rxego.RC, size)
	o := &rxego.ConnectOptions{MTU: qp.MTU4096, MaxRdAtomic: 4}
	if err := a.qp.Connect(rxego.RemoteQP{Addr: b.dev.Addr(), QPN: b.qp.Num()}, o); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(rxego.RemoteQP{Addr: a.dev.Addr(), QPN: a.qp.Num()}, o); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < size; i += 8 {
		binary.LittleEndian.PutUint64(a.buf[i:], r.Uint64())
	}
	if err := a.qp.PostSend(rxego.SendWR{ID: 1, Opcode: rxego.WRWrite, Flags: rxego.SendSignaled, SGL: a.sge(0, size),
		RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	a.one(t, "64 MiB WRITE")
	b.dev.Sync()
	if !bytes.Equal(a.buf[:size], b.buf[:size]) {
		t.Fatal("WRITE data differs")
	}
	clear(a.buf[:size])
	if err := a.qp.PostSend(rxego.SendWR{ID: 2, Opcode: rxego.WRRead, Flags: rxego.SendSignaled, SGL: a.sge(0, size),
		RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := a.one(t, "64 MiB READ"); wc.ByteLen != size {
		t.Fatalf("READ byte_len %d", wc.ByteLen)
	}
	if !bytes.Equal(a.buf[:size], b.buf[:size]) {
		t.Fatal("READ data differs")
	}
}

// TestManyQPs runs 200 RC QP pairs between two devices at once.
func TestManyQPs(t *testing.T) {
	da, db := testaddr.Open(t, nil), testaddr.Open(t, nil)
	const n, size = 200, 3000
	as, bs := make([]*node, n), make([]*node, n)
	for i := range as {
		as[i], bs[i] = newNode(t, da, rxego.RC, size), newNode(t, db, rxego.RC, size)
		o := &rxego.ConnectOptions{LocalPSN: uint32(i * 1000)}
		if err := as[i].qp.Connect(rxego.RemoteQP{Addr: db.Addr(), QPN: bs[i].qp.Num(), PSN: uint32(i * 77)}, o); err != nil {
			t.Fatal(err)
		}
		o.LocalPSN = uint32(i * 77)
		if err := bs[i].qp.Connect(rxego.RemoteQP{Addr: da.Addr(), QPN: as[i].qp.Num(), PSN: uint32(i * 1000)}, o); err != nil {
			t.Fatal(err)
		}
	}
	for i := range as {
		for k := range as[i].buf[:size] {
			as[i].buf[k] = byte(i + k)
		}
		if err := as[i].qp.PostSend(rxego.SendWR{ID: uint64(i), Opcode: rxego.WRWrite, Flags: rxego.SendSignaled,
			SGL: as[i].sge(0, size), RemoteAddr: bs[i].mr.IOVA(), RKey: bs[i].mr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range as {
		if wc := as[i].one(t, "write"); wc.ID != uint64(i) {
			t.Fatalf("QP %d completed wr %d", i, wc.ID)
		}
	}
	db.Sync()
	for i := range bs {
		if !bytes.Equal(bs[i].buf[:size], as[i].buf[:size]) {
			t.Fatalf("QP pair %d: data differs", i)
		}
	}
}
