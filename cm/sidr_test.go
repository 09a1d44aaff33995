package cm

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/transport"
)

// The SIDR messages encode at the IBA offsets (MAD header 24 bytes in)
// and decode back.
func TestSIDRMarshal(t *testing.T) {
	req := &SIDRREQ{RequestID: 0x11223344, PKey: 0xffff, ServiceID: ServiceID(PortSpaceUDP, 7174), PrivateData: []byte{1, 2, 3}}
	b, err := Marshal(9, req)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b[24:28], []byte{0x11, 0x22, 0x33, 0x44}) || !bytes.Equal(b[32:40], []byte{0, 0, 0, 0, 1, 0x11, 0x1c, 0x06}) || b[40] != 1 {
		t.Fatalf("SIDR_REQ bytes % x", b[24:44])
	}
	h, m, err := Unmarshal(b[:])
	if err != nil || h.AttrID != AttrSIDRREQ || h.TID != 9 {
		t.Fatal(h, err)
	}
	if got := m.(*SIDRREQ); got.RequestID != req.RequestID || got.ServiceID != req.ServiceID || got.PKey != 0xffff || !bytes.Equal(got.PrivateData[:3], req.PrivateData) || len(got.PrivateData) != SIDRREQPrivateDataSize {
		t.Fatalf("%+v", got)
	}
	rep := &SIDRREP{RequestID: 5, Status: SIDRSuccess, QPN: 0xabcdef, ServiceID: 0x1110001, QKey: UDPQKey, PrivateData: []byte{9}}
	b, err = Marshal(10, rep)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b[32:35], []byte{0xab, 0xcd, 0xef}) || !bytes.Equal(b[44:48], []byte{1, 0x23, 0x45, 0x67}) || b[120] != 9 {
		t.Fatalf("SIDR_REP bytes % x", b[24:48])
	}
	_, m, err = Unmarshal(b[:])
	if got := m.(*SIDRREP); err != nil || got.QPN != rep.QPN || got.QKey != UDPQKey || got.ServiceID != rep.ServiceID || got.PrivateData[0] != 9 {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := Marshal(1, &SIDRREP{QPN: 1 << 24}); !errors.Is(err, ErrField) {
		t.Errorf("25-bit QPN: %v", err)
	}
	if _, err := Marshal(1, &SIDRREQ{PrivateData: make([]byte, SIDRREQPrivateDataSize+1)}); !errors.Is(err, ErrPrivData) {
		t.Errorf("long private data: %v", err)
	}
}

// udEndpoint is a UD QP in RTS with rdma_cm's UDP Q_Key.
func (nd *node) udEndpoint(t *testing.T) *endpoint {
	t.Helper()
	pd, _ := nd.dev.AllocPD()
	cq, _ := nd.dev.CreateCQ(64)
	q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.UD, SendCQ: cq, RecvCQ: cq,
		Caps: rxego.Caps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.ActivateUD(UDPQKey, 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	mr, err := pd.RegMR(buf, rxego.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	return &endpoint{cq, q, mr, buf}
}

// TestSIDR: DialUD resolves a listening UD port to the QPN the server
// accepted with and rdma_cm's Q_Key, with both sides' private data and
// rdma_cm's IP header; a UD SEND to the result arrives. A lost SIDR_REQ
// and a lost SIDR_REP are recovered by retransmission (the duplicate
// request is answered with the same reply); a port nobody listens on is
// refused with status 1, as the Linux CM does.
func TestSIDR(t *testing.T) {
	net := transport.NewPipeNetwork()
	var filter *madFilter
	srv := newNode(t, net, "198.18.0.1", fastConfig(), func(c transport.Conn) transport.Conn {
		filter = newMADFilter(c, map[uint16]int{AttrSIDRREP: 1})
		return filter
	})
	var cfilter *madFilter
	cli := newNode(t, net, "198.18.0.2", fastConfig(), func(c transport.Conn) transport.Conn {
		cfilter = newMADFilter(c, map[uint16]int{AttrSIDRREQ: 1})
		return cfilter
	})
	l, err := srv.m.ListenUD(7174)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.m.ListenUD(7174); !errors.Is(err, ErrInUse) {
		t.Errorf("second ListenUD: %v", err)
	}
	sq := srv.udEndpoint(t)
	if err := sq.q.PostRecv(rxego.RecvWR{ID: 1, SGL: []rxego.SGE{{Addr: sq.mr.IOVA(), Length: 4096, LKey: sq.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	done := make(chan error, 1)
	go func() {
		r, err := l.Accept(ctx)
		if err == nil {
			if r.Remote.Addr() != netip.MustParseAddr("198.18.0.2") || r.Local != netip.MustParseAddrPort("198.18.0.1:7174") || !bytes.Equal(r.PrivateData[:5], []byte("hello")) {
				t.Errorf("request %+v", r)
			}
			err = r.Accept(sq.q, []byte("welcome"))
		}
		done <- err
	}()
	peer, err := cli.m.DialUD(ctx, netip.MustParseAddrPort("198.18.0.1:7174"), []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if peer.QPN != sq.q.Num() || peer.QKey != UDPQKey || peer.Addr != netip.MustParseAddrPort("198.18.0.1:4791") || !bytes.Equal(peer.PrivateData[:7], []byte("welcome")) {
		t.Fatalf("peer %+v", peer)
	}
	if filter.droppedOf(AttrSIDRREP) != 1 || cfilter.droppedOf(AttrSIDRREQ) != 1 {
		t.Fatalf("dropped REP %d REQ %d", filter.droppedOf(AttrSIDRREP), cfilter.droppedOf(AttrSIDRREQ))
	}
	cq := cli.udEndpoint(t)
	copy(cq.buf, "datagram")
	ah := &rxego.AH{Dest: peer.Addr}
	if err := cq.q.PostSend(rxego.SendWR{ID: 2, Opcode: rxego.WRSend, Flags: rxego.SendSignaled, AH: ah, RemoteQPN: peer.QPN, RemoteQKey: peer.QKey,
		SGL: []rxego.SGE{{Addr: cq.mr.IOVA(), Length: 8, LKey: cq.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if wc := sq.wait(t); wc.Status != 0 || wc.ByteLen != rxego.GRHLen+8 || string(sq.buf[rxego.GRHLen:rxego.GRHLen+8]) != "datagram" {
		t.Fatalf("receive %+v %q", wc, sq.buf[:48])
	}
	if _, err := cli.m.DialUD(ctx, netip.MustParseAddrPort("198.18.0.1:7175"), nil); !errors.Is(err, ErrSIDRStatus) {
		t.Errorf("unknown port: %v", err)
	}
	if c := srv.m.Counters(); c["cm_duplicates"] != 1 || c["cm_rcvd_sidr_req"] != 3 || c["cm_sent_sidr_rep"] != 3 {
		t.Errorf("server counters %v: want the retransmitted SIDR_REQ answered as a duplicate", c)
	}
}
