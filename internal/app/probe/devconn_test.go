package probe

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/icrc"
	"github.com/rxego/rxego/internal/testenv/testaddr"
	"github.com/rxego/rxego/reth"
	"github.com/rxego/rxego/transport"
)

// TestDevConn: a device sharing the probe's port gets the packets of QPs
// the probe has not claimed, and only those; what it sends (a coalesced
// run too) leaves packet by packet with a correct ICRC, only to the peer.
func TestDevConn(t *testing.T) {
	local, peerAddr := testaddr.Loopback(), testaddr.Loopback()
	peer, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(peerAddr, transport.Port)))
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	w, err := openWire(local, peerAddr, time.Microsecond, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	dc := w.attachDevice()
	defer dc.Close()

	ack := func(qpn, psn uint32) []byte {
		h := bth.Header{Opcode: bth.RCAck, PKey: bth.DefaultPKey, DestQP: qpn, PSN: bth.PSN(psn),
			AETH: bth.AETHFields{Syndrome: reth.ACKSyndrome(reth.CreditsInvalid)}}
		buf := make([]byte, bth.PacketLen(bth.RCAck, 0))
		n, err := h.Encode(buf, nil)
		if err != nil {
			t.Fatal(err)
		}
		return buf[:n]
	}
	fromPeer := func(qpn, psn uint32) {
		pkt := ack(qpn, psn)
		v := icrc.V4{Src: peerAddr.As4(), Dst: local.As4(), SrcPort: transport.Port, DstPort: transport.Port, DF: true}
		v.Fill(0, pkt)
		if _, err := peer.WriteToUDPAddrPort(pkt, netip.AddrPortFrom(local, transport.Port)); err != nil {
			t.Fatal(err)
		}
	}
	w.claim(0x42)
	fromPeer(0x17, 1) // the device's
	fromPeer(0x42, 2) // the probe's
	msgs := make([]transport.Message, 4)
	n, err := dc.Recv(msgs)
	if err != nil || n != 1 || msgs[0].Pkt.Decode().DestQP != 0x17 {
		t.Fatalf("the device received %d packets (%v), want the one for QP 0x17", n, err)
	}
	select {
	case a := <-w.in:
		if a.hdr.DestQP != 0x42 {
			t.Errorf("the probe received a packet for QP %#x, want 0x42", a.hdr.DestQP)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the probe's claimed QP got nothing")
	}

	// A run of two packets (as transport.Coalesce makes) arrives as two
	// datagrams whose ICRCs check.
	run := append(ack(0x99, 7), ack(0x99, 8)...)
	seg := len(run) / 2
	if n, err := dc.Send([]transport.Message{{Buf: run, Seg: seg, Peer: netip.AddrPortFrom(peerAddr, transport.Port)}}); n != 1 || err != nil {
		t.Fatalf("Send: %d, %v", n, err)
	}
	for want := uint32(7); want <= 8; want++ {
		buf := make([]byte, 2048)
		peer.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := peer.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatal(err)
		}
		v := icrc.V4{Src: local.As4(), Dst: peerAddr.As4(), SrcPort: transport.Port, DstPort: transport.Port, DF: true}
		if _, ok := v.Recover(buf[:n]); !ok || n != seg {
			t.Fatalf("datagram of %d bytes (want %d), ICRC good: %v", n, seg, ok)
		}
		p, err := bth.Parse(buf[:n])
		if err != nil || uint32(p.Decode().PSN) != want {
			t.Errorf("datagram %v, PSN %d; want PSN %d", err, p.Decode().PSN, want)
		}
	}
	// Anywhere else: refused, nothing sent.
	other := netip.AddrPortFrom(testaddr.Loopback(), transport.Port)
	if n, err := dc.Send([]transport.Message{{Buf: ack(1, 1), Peer: other}}); n != 0 || err == nil {
		t.Errorf("Send to %v: %d, %v; want refused", other, n, err)
	}
	if st := dc.Stats(); st.SentPackets != 2 || st.RecvPackets != 1 {
		t.Errorf("stats: sent %d, received %d; want 2 and 1", st.SentPackets, st.RecvPackets)
	}
	dc.Close()
	if _, err := dc.Recv(msgs); err == nil {
		t.Error("Recv after Close succeeded")
	}
}
