package cm

import (
	"context"
	"encoding/binary"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/transport"
)

// fastConfig times retransmissions in tens of milliseconds: REQ every
// 2*4+32 = 40 ms, REP every 32 ms (the REQ's response timeout), time-wait
// 4 ms.
func fastConfig() *Config {
	return &Config{ResponseTimeout: 13, PacketLifeTime: 10, MaxRetries: 6}
}

// madFilter is a transport.Conn that drops chosen CM MADs it sends, as a
// lossy link would: the first n of each attribute in drop.
type madFilter struct {
	transport.Conn
	mu      sync.Mutex
	drop    map[uint16]int
	dropped map[uint16]int
}

func newMADFilter(c transport.Conn, drop map[uint16]int) *madFilter {
	return &madFilter{Conn: c, drop: drop, dropped: map[uint16]int{}}
}

// attrOf returns the CM attribute of a UD packet to QP1, or 0.
func attrOf(pkt []byte) uint16 {
	p, err := bth.Parse(pkt)
	if err != nil || p.Info.Opcode != bth.UDSendOnly || p.BTH().DestQP() != 1 {
		return 0
	}
	mad := p.Payload()
	if len(mad) < HeaderSize || mad[1] != ClassCM {
		return 0
	}
	return binary.BigEndian.Uint16(mad[16:])
}

func (f *madFilter) Send(msgs []transport.Message) (int, error) {
	for i := range msgs {
		a := attrOf(msgs[i].Buf)
		f.mu.Lock()
		drop := a != 0 && f.dropped[a] < f.drop[a]
		if drop {
			f.dropped[a]++
		}
		f.mu.Unlock()
		if drop {
			continue
		}
		if _, err := f.Conn.Send(msgs[i : i+1]); err != nil {
			return i, err
		}
	}
	return len(msgs), nil
}

func (f *madFilter) droppedOf(a uint16) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dropped[a]
}

// node is one rxego device with a connection manager.
type node struct {
	dev *rxego.Device
	m   *Manager
}

// newNode opens a device on the in-memory network at addr (port 4791),
// its sends passing through wrap when given, and starts a Manager on it.
func newNode(t *testing.T, n *transport.PipeNetwork, addr string, cfg *Config, wrap func(transport.Conn) transport.Conn) *node {
	t.Helper()
	c, err := n.Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), transport.Port), transport.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		c = wrap(c)
	}
	dev, err := rxego.Open(addr, &rxego.Options{Conn: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	m, err := New(dev, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return &node{dev, m}
}

// endpoint is an RC QP with a registered buffer.
type endpoint struct {
	cq  *rxego.CQ
	q   *rxego.QP
	mr  *rxego.MR
	buf []byte
}

func (nd *node) newEndpoint(t *testing.T, size int) *endpoint {
	t.Helper()
	pd, err := nd.dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, _ := nd.dev.CreateCQ(64)
	q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq, RecvCQ: cq,
		Caps: rxego.Caps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, size)
	mr, err := pd.RegMR(buf, rxego.AccessLocalWrite|rxego.AccessRemoteWrite|rxego.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	return &endpoint{cq, q, mr, buf}
}

// postRecv posts a receive of the first n bytes of the buffer, moving
// the QP to INIT first, as rdma_create_qp leaves it.
func (e *endpoint) postRecv(t *testing.T, n uint32) {
	t.Helper()
	if e.q.State() == rxego.StateReset {
		if err := e.q.Init(0); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.q.PostRecv(rxego.RecvWR{ID: 1, SGL: []rxego.SGE{{Addr: e.mr.IOVA(), Length: n, LKey: e.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
}

func (e *endpoint) wait(t *testing.T) rxego.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]rxego.WC, 1)
	if _, err := e.cq.PollWait(ctx, wc); err != nil {
		t.Fatalf("no completion: %v", err)
	}
	return wc[0]
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitClosed waits (bounded) for ch to close.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not closed", what)
	}
}

// eventually polls cond every few milliseconds until it holds or 10
// seconds pass, and reports whether it held.
func eventually(cond func() bool) bool {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}
