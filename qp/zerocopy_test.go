package qp

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
)

// scatterOut is a node's Output that takes scattered packets
// (ScatterOutput), counting them, and gathers them onto the fabric.
type scatterOut struct {
	nodeOut
	scattered *int
}

func (o scatterOut) Scatters() bool { return true }

func (o scatterOut) Emit(pkts []OutPacket) {
	for i := range pkts {
		p := &pkts[i]
		if p.Payload != nil {
			*o.scattered++
			if h := p.Buf[0:bth.Len]; len(p.Buf) != bth.BTH(h).Opcode().Info().HdrLen+bth.BTH(h).PadCount()+bth.ICRCLen {
				panic(fmt.Sprintf("scattered packet's Buf is %d bytes, not its header and trailer", len(p.Buf)))
			}
		}
	}
	o.nodeOut.Emit(pkts)
}

// zeroCopyRun runs one RC operation of size bytes at mtu between two
// nodes whose Outputs scatter or not, and returns every packet the fabric
// delivered, in order, and how many were scattered. drop, if set, loses
// the packets it picks (once each).
func zeroCopyRun(t *testing.T, scatter bool, op WROpcode, mtu MTU, size int, drop func(p wirePkt) bool) (wire [][]byte, scattered int) {
	t.Helper()
	f := newFabric(t)
	if scatter {
		f.engineCfg = func(c *Config) { c.Out = scatterOut{c.Out.(nodeOut), &scattered} }
	}
	f.drop = drop
	f.tap = func(p wirePkt, _ bth.Packet) {
		// The RETH's address and key differ from one run to the next
		// (fresh MRs); they are set aside, the rest must match.
		b := append([]byte(nil), p.data...)
		if pkt, err := bth.Parse(b); err == nil {
			if h := pkt.RETH(); h != nil {
				h.Set(0, 0, h.DMALen())
			}
		}
		wire = append(wire, b)
	}
	a := f.node("198.18.0.1").newQP(t, RC, 64)
	b := f.node("198.18.0.2").newQP(t, RC, 64)
	o := defaultConn()
	o.mtu = mtu
	connect(t, a, b, o)
	amr, abuf := a.n.reg(t, size+16, allAccess)
	bmr, bbuf := b.n.reg(t, size+16, allAccess)
	fill(abuf, uint64(size))
	fill(bbuf, uint64(size)+1)
	src, dst := abuf[:size], bbuf[:size]
	wr := SendWR{ID: 1, Opcode: op, Flags: SendSignaled, SGL: sge(amr, 0, size), RemoteAddr: bmr.IOVA(), RKey: bmr.RKey()}
	switch op {
	case WRSend:
		if err := b.qp.PostRecv(RecvWR{ID: 2, SGL: sge(bmr, 0, size+16)}); err != nil {
			t.Fatal(err)
		}
	case WRRead:
		src, dst = bbuf[:size], abuf[:size]
	}
	want := append([]byte(nil), src...)
	if err := a.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	f.run(10 * time.Second)
	if wc := pollAll(a.scq); len(wc) != 1 || wc[0].Status != WCSuccess {
		t.Fatalf("completions %+v", wc)
	}
	if !bytes.Equal(dst, want) {
		t.Fatal("data differs at the destination")
	}
	return wire, scattered
}

// TestZeroCopySameBytes checks that WRITE, SEND and READ responses put
// the same packets on the wire with their payloads left in registered
// memory as when copied, for sizes from 1 byte to 1 MiB at MTU 1024 and
// 4096, and that exactly the payloads of ZeroCopyMinPayload bytes or more
// are scattered. (That the transport sends a scattered packet's bytes
// and ICRC as it does a whole one's is transport's
// TestScatteredSameBytes.)
func TestZeroCopySameBytes(t *testing.T) {
	sizes := []int{1, ZeroCopyMinPayload - 1, ZeroCopyMinPayload, 1000, 4096, 3*4096 + 5, 65536 + 3, 1 << 20}
	for _, op := range []WROpcode{WRWrite, WRSend, WRRead} {
		for _, mtu := range []MTU{MTU1024, MTU4096} {
			for _, size := range sizes {
				if testing.Short() && size == 1<<20 {
					continue
				}
				name := fmt.Sprintf("op %v mtu %d size %d", op, mtu.Bytes(), size)
				copied, none := zeroCopyRun(t, false, op, mtu, size, nil)
				scat, n := zeroCopyRun(t, true, op, mtu, size, nil)
				if none != 0 {
					t.Fatalf("%s: %d scattered packets from an Output that does not take them", name, none)
				}
				if len(copied) != len(scat) {
					t.Fatalf("%s: %d packets copied, %d scattered", name, len(copied), len(scat))
				}
				for i := range copied {
					if !bytes.Equal(copied[i], scat[i]) {
						t.Fatalf("%s: packet %d differs:\n%x\n%x", name, i, copied[i][:min(40, len(copied[i]))], scat[i][:min(40, len(scat[i]))])
					}
				}
				m := mtu.Bytes()
				wantN := 0
				for off := 0; off < size; off += m {
					if min(m, size-off) >= ZeroCopyMinPayload {
						wantN++
					}
				}
				if n != wantN {
					t.Fatalf("%s: %d packets scattered, want %d", name, n, wantN)
				}
			}
		}
	}
}

// TestZeroCopyRetransmit checks that a retransmitted packet whose payload
// was left in registered memory carries the same bytes as the first
// time: the second data packet of a WRITE and of a READ is lost once.
func TestZeroCopyRetransmit(t *testing.T) {
	for _, op := range []WROpcode{WRWrite, WRRead} {
		lost := false
		var lostBytes []byte
		drop := func(p wirePkt) bool {
			pkt, err := bth.Parse(p.data)
			if err != nil || lost || !pkt.Info.Has(bth.Payload) || pkt.Info.Opcode != bth.RCWriteMiddle && pkt.Info.Opcode != bth.RCReadResponseMiddle {
				return false
			}
			lost, lostBytes = true, append([]byte(nil), p.data...)
			return true
		}
		wire, n := zeroCopyRun(t, true, op, MTU1024, 8*1024, drop)
		if !lost || n == 0 {
			t.Fatalf("%v: nothing lost (%v) or nothing scattered (%d)", op, lost, n)
		}
		// The retry may differ in the AckReq bit (and a READ retry's first
		// response is a First, not a Middle); its PSN and
		// payload must not.
		lp, _ := bth.Parse(lostBytes)
		again := 0
		for _, b := range wire {
			p, err := bth.Parse(b)
			if err == nil && p.BTH().PSN() == lp.BTH().PSN() && bytes.Equal(p.Payload(), lp.Payload()) {
				again++
			}
		}
		if again != 1 {
			t.Fatalf("%v: the lost packet's bytes were delivered %d times on the retry, want 1", op, again)
		}
	}
}
