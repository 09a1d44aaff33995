package qp

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego/mr"
)

// TestActiveMTU checks the interface MTU -> active_mtu rule against rxe's
// eth_mtu_int_to_enum (the netdev MTU less 80, rounded down to an IB MTU).
func TestActiveMTU(t *testing.T) {
	for _, c := range []struct {
		ifMTU int
		want  MTU
	}{{65536, MTU4096}, {9000, MTU4096}, {4176, MTU4096}, {4175, MTU2048}, {2128, MTU2048},
		{2127, MTU1024}, {1500, MTU1024}, {1104, MTU1024}, {1103, MTU512}, {576, MTU256}, {336, MTU256}, {335, 0}, {0, 0}} {
		if got := ActiveMTU(c.ifMTU); got != c.want {
			t.Errorf("ActiveMTU(%d) = %d, want %d", c.ifMTU, got, c.want)
		}
	}
}

// linkNode is a fabric node whose link refuses packets longer than limit
// bytes (BTH through ICRC) the way the kernel refuses a datagram over the
// interface MTU: the packet is not sent and the engine hears SendFailed.
// sent counts the packets that went out.
type linkOut struct {
	n     *node
	limit int
	sent  int
}

func (o *linkOut) Emit(pkts []OutPacket) {
	for i := range pkts {
		if len(pkts[i].Buf) > o.limit {
			o.n.e.SendFailed(&pkts[i])
			continue
		}
		o.sent++
		nodeOut{o.n}.Emit(pkts[i : i+1])
	}
}

func linkNode(t *testing.T, f *fabric, addr string, limit int, maxMTU MTU) (*node, *linkOut) {
	a := netip.MustParseAddr(addr)
	n := &node{f: f, addr: netip.AddrPortFrom(a, 4791), mrs: mr.NewTable()}
	out := &linkOut{n: n, limit: limit}
	e, err := NewEngine(Config{Local: a, Clock: f.clock, Out: out, MRs: n.mrs, MaxMTU: maxMTU})
	if err != nil {
		t.Fatal(err)
	}
	n.e, n.pd = e, n.mrs.AllocPD()
	f.nodes[a] = n
	return n, out
}

// TestPathMTUAboveActiveRefused: an engine whose link carries MTU 1024
// refuses path_mtu 2048 at the modify to RTR (nothing changes) and takes
// 1024; its UD QPs are bounded by 1024.
func TestPathMTUAboveActiveRefused(t *testing.T) {
	f := newFabric(t)
	n, _ := linkNode(t, f, "198.18.0.1", 1<<16, MTU1024)
	if n.e.MaxMTU() != MTU1024 {
		t.Fatalf("MaxMTU %d", n.e.MaxMTU())
	}
	q := n.newQP(t, RC, 4).qp
	bringTo(t, q, Init)
	rtr := fullAttr(RTR, Init)
	rtr.PathMTU = MTU2048
	r, _ := kernelAllows(RC, Init, RTR)
	if err := q.Modify(rtr, AttrState|r.req[RC]); !errors.Is(err, ErrInvalidModify) {
		t.Fatalf("path MTU 2048 over a 1024 port: %v, want ErrInvalidModify", err)
	}
	if got := q.Query(); got.State != Init || got.PathMTU != 0 {
		t.Fatalf("refused modify changed the QP: %+v", got)
	}
	rtr.PathMTU = MTU1024
	if err := q.Modify(rtr, AttrState|r.req[RC]); err != nil {
		t.Fatal(err)
	}
	u := n.newQP(t, UD, 4)
	bringTo(t, u.qp, RTS)
	smr, _ := n.reg(t, 2048, allAccess)
	ah := &AH{Dest: netip.MustParseAddrPort("198.18.0.2:4791")}
	if err := u.qp.PostSend(SendWR{Opcode: WRSend, SGL: sge(smr, 0, 1025), AH: ah, RemoteQPN: 5, RemoteQKey: 1}); err == nil {
		t.Fatal("UD message of 1025 bytes accepted on a 1024 port")
	}
	if err := u.qp.PostSend(SendWR{Opcode: WRSend, SGL: sge(smr, 0, 1024), AH: ah, RemoteQPN: 5, RemoteQKey: 1}); err != nil {
		t.Fatalf("UD message of 1024 bytes: %v", err)
	}
}

// TestSendFailedCompletes: when the link refuses a request for good
// (EMSGSIZE), the work request completes with WCLocQPOpErr, those behind
// it are flushed, the QP is in ERR and nothing is retransmitted, instead
// of the endless retries of a loss. The work request before it completes
// normally.
func TestSendFailedCompletes(t *testing.T) {
	for _, typ := range []Type{RC, UC} {
		f := newFabric(t)
		an, out := linkNode(t, f, "198.18.0.1", 600, 0)
		a := an.newQP(t, typ, 8)
		b := f.node("198.18.0.2").newQP(t, typ, 8)
		connect(t, a, b, defaultConn())
		lmr, _ := an.reg(t, 4096, allAccess)
		rmr, _ := b.n.reg(t, 4096, allAccess)
		for i := range 3 {
			if err := b.qp.PostRecv(RecvWR{ID: uint64(i), SGL: sge(rmr, 0, 4096)}); err != nil {
				t.Fatal(err)
			}
		}
		err := a.qp.PostSend(
			SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 0, 100)},
			SendWR{ID: 2, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(lmr, 0, 3000), RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()},
			SendWR{ID: 3, Opcode: WRSend, Flags: SendSignaled, SGL: sge(lmr, 0, 100)},
		)
		if err != nil {
			t.Fatal(err)
		}
		f.run(time.Second)
		wcs := pollAll(a.scq)
		if typ == RC {
			if len(wcs) != 3 || wcs[0].ID != 1 || wcs[0].Status != WCSuccess || wcs[1].ID != 2 || wcs[1].Status != WCLocQPOpErr ||
				wcs[2].ID != 3 || wcs[2].Status != WCWRFlushErr {
				t.Fatalf("%v completions %+v", typ, wcs)
			}
		} else if len(wcs) == 0 || wcs[0].ID != 1 || wcs[0].Status != WCSuccess {
			// UC completes a message once sent; the QP's move to ERR is
			// what tells the application.
			t.Fatalf("%v completions %+v", typ, wcs)
		}
		if s := a.qp.State(); s != Err {
			t.Fatalf("%v QP state %v, want ERR", typ, s)
		}
		sent := out.sent
		f.run(10 * time.Second)
		if out.sent != sent {
			t.Fatalf("%v: %d packets sent after the QP went to ERR", typ, out.sent-sent)
		}
	}
}
