package cm

import (
	"bytes"
	"errors"
	"net/netip"
	"reflect"
	"testing"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/capfile"
)

const rpingCapture = "../testdata/pcaps/rping_6.12.pcapng"

// capturedFrame is one RoCE packet of the rping capture.
type capturedFrame struct {
	num      int
	src, dst netip.Addr
	pkt      bth.Packet
}

// rpingFrames reads the rping capture: rping -c on 198.18.0.12 against
// rping -s on 198.18.0.11, both rxe on kernel 6.12.
func rpingFrames(t *testing.T) []capturedFrame {
	t.Helper()
	out, err := readRpingFrames()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func readRpingFrames() ([]capturedFrame, error) {
	var out []capturedFrame
	err := capfile.Each(rpingCapture, func(fr capfile.Frame) error {
		p, err := bth.Parse(append([]byte(nil), fr.RoCE...))
		if err != nil {
			return err
		}
		src, _ := netip.AddrFromSlice(fr.IP[12:16])
		dst, _ := netip.AddrFromSlice(fr.IP[16:20])
		out = append(out, capturedFrame{fr.Number, src, dst, p})
		return nil
	})
	return out, err
}

// TestCaptureMADs decodes every CM MAD of the capture, checks the fields
// against what tshark shows (and what rping and rdma_cm ask for), and
// re-encodes each one: the 256 bytes must come out identical.
func TestCaptureMADs(t *testing.T) {
	client, server := netip.MustParseAddr("198.18.0.12"), netip.MustParseAddr("198.18.0.11")
	var msgs []Message
	for _, f := range rpingFrames(t) {
		if f.pkt.Info.Opcode != bth.UDSendOnly {
			continue
		}
		if f.pkt.BTH().DestQP() != 1 || f.pkt.DETH().QKey() != 0x80010000 || f.pkt.DETH().SrcQP() != 1 {
			t.Errorf("frame %d: UD packet not GSI to GSI: %v", f.num, f.pkt.BTH().DestQP())
		}
		mad := f.pkt.Payload()
		if len(mad) != MADSize {
			t.Fatalf("frame %d: MAD of %d bytes", f.num, len(mad))
		}
		h, m, err := Unmarshal(mad)
		if err != nil {
			t.Fatalf("frame %d: %v", f.num, err)
		}
		if h.TID != 0x00000002c6418c08 {
			t.Errorf("frame %d: TID %#x", f.num, h.TID)
		}
		out, err := Marshal(h.TID, m)
		if err != nil {
			t.Fatalf("frame %d: marshal %s: %v", f.num, AttrName(h.AttrID), err)
		}
		if !bytes.Equal(out[:], mad) {
			t.Errorf("frame %d: %s re-encoded\n%x\nwant\n%x", f.num, AttrName(h.AttrID), out, mad)
		}
		msgs = append(msgs, m)
	}
	if len(msgs) != 5 {
		t.Fatalf("%d CM MADs, want REQ REP RTU DREQ DREP", len(msgs))
	}
	var zero92 [REQPrivateDataSize - IPHeaderSize]byte
	req := msgs[0].(*REQ)
	wantREQ := REQ{
		LocalCommID: 0x088c41c6, ServiceID: 0x0000000001061c06, LocalCAGUID: 0x505400fffe12000c,
		LocalQPN: 0x11, ResponderResources: 1, InitiatorDepth: 1, RemoteCMResponseTimeout: 20,
		StartingPSN: 0x75f325, LocalCMResponseTimeout: 20, RetryCount: 7, PKey: 0xffff, PathMTU: 3,
		RNRRetryCount: 7, MaxCMRetries: 15,
		Primary: Path{LocalLID: 0xffff, RemoteLID: 0xffff, LocalGID: client.As16(), RemoteGID: server.As16(),
			FlowLabel: 0x9f9ac, HopLimit: 64, LocalACKTimeout: 17},
		PrivateData: req.PrivateData,
	}
	// As16 of an IPv4 address is the IPv4-mapped GID rxe uses.
	if !reflect.DeepEqual(*req, wantREQ) {
		t.Errorf("REQ\n%+v\nwant\n%+v", *req, wantREQ)
	}
	ip, err := ParseIPHeader(req.PrivateData)
	if err != nil {
		t.Fatal(err)
	}
	if want := (IPHeader{SrcPort: 0xd59a, Src: client, Dst: server}); ip != want {
		t.Errorf("IP header %+v, want %+v", ip, want)
	}
	if !bytes.Equal(req.PrivateData[IPHeaderSize:], zero92[:]) {
		t.Errorf("rping's private data after the IP header: %x", req.PrivateData[IPHeaderSize:])
	}
	if ps, port, ok := ServicePort(req.ServiceID); !ok || ps != PortSpaceTCP || port != 7174 {
		t.Errorf("service ID %#x: port space %#x port %d %v", req.ServiceID, ps, port, ok)
	}
	rep := msgs[1].(*REP)
	wantREP := REP{LocalCommID: 0xcf512179, RemoteCommID: 0x088c41c6, LocalQPN: 0x11, StartingPSN: 0x12decc,
		ResponderResources: 1, InitiatorDepth: 1, TargetACKDelay: 15, RNRRetryCount: 7,
		LocalCAGUID: 0x505400fffe12000b, PrivateData: make([]byte, REPPrivateDataSize)}
	if !reflect.DeepEqual(*rep, wantREP) {
		t.Errorf("REP\n%+v\nwant\n%+v", *rep, wantREP)
	}
	if rtu := msgs[2].(*RTU); rtu.LocalCommID != req.LocalCommID || rtu.RemoteCommID != rep.LocalCommID {
		t.Errorf("RTU IDs %#x %#x", rtu.LocalCommID, rtu.RemoteCommID)
	}
	dreq := msgs[3].(*DREQ)
	if dreq.LocalCommID != req.LocalCommID || dreq.RemoteCommID != rep.LocalCommID || dreq.RemoteQPN != rep.LocalQPN {
		t.Errorf("DREQ %+v", dreq)
	}
	if drep := msgs[4].(*DREP); drep.LocalCommID != rep.LocalCommID || drep.RemoteCommID != req.LocalCommID {
		t.Errorf("DREP %+v", drep)
	}
}

// TestCaptureQPSetup checks the QP attributes the CM exchange implies
// against the RC traffic that followed it: each side's first request
// carries the starting PSN the other side announced (the REQ's Starting
// PSN is the passive side's send PSN, the REP's the initiator's), and
// every RC packet goes to the QP the other side announced.
func TestCaptureQPSetup(t *testing.T) {
	frames := rpingFrames(t)
	var req *REQ
	var rep *REP
	firstPSN := map[netip.Addr]uint32{}
	for _, f := range frames {
		if f.pkt.Info.Opcode == bth.UDSendOnly {
			_, m, err := Unmarshal(f.pkt.Payload())
			if err != nil {
				t.Fatal(err)
			}
			switch m := m.(type) {
			case *REQ:
				req = m
			case *REP:
				rep = m
			}
			continue
		}
		if req == nil || rep == nil {
			t.Fatalf("frame %d: RC traffic before REQ and REP", f.num)
		}
		b := f.pkt.BTH()
		wantQP := rep.LocalQPN // client to server
		if f.src == netip.MustParseAddr("198.18.0.11") {
			wantQP = req.LocalQPN
		}
		if b.DestQP() != wantQP {
			t.Errorf("frame %d: dest QP %#x, want %#x", f.num, b.DestQP(), wantQP)
		}
		if f.pkt.Info.Flags&bth.Response == 0 {
			if _, seen := firstPSN[f.src]; !seen {
				firstPSN[f.src] = uint32(b.PSN())
			}
		}
	}
	// The Linux CM's convention: each side sends from the PSN the other
	// announced.
	if got := firstPSN[netip.MustParseAddr("198.18.0.12")]; got != rep.StartingPSN {
		t.Errorf("client's first request PSN %#x, REP announced %#x", got, rep.StartingPSN)
	}
	if got := firstPSN[netip.MustParseAddr("198.18.0.11")]; got != req.StartingPSN {
		t.Errorf("server's first request PSN %#x, REQ announced %#x", got, req.StartingPSN)
	}
}

// TestMarshalRoundTrip encodes every message with every field set to a
// distinct value and decodes it back.
func TestMarshalRoundTrip(t *testing.T) {
	pd := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + 1)
		}
		return b
	}
	path := Path{LocalLID: 1, RemoteLID: 2, LocalGID: [16]byte{1, 2, 3}, RemoteGID: [16]byte{15: 9}, FlowLabel: 0xfffff,
		PacketRate: 0x3f, TrafficClass: 0xb8, HopLimit: 7, SL: 15, SubnetLocal: true, LocalACKTimeout: 31}
	msgs := []Message{
		&REQ{LocalCommID: 0xdeadbeef, ServiceID: 0x0106abcd, LocalCAGUID: 0x0123456789abcdef, LocalQKey: 0x11111111,
			LocalQPN: 0xffffff, ResponderResources: 200, LocalEECN: 0xabcdef, InitiatorDepth: 100, RemoteEECN: 0x123456,
			RemoteCMResponseTimeout: 31, TransportType: TransportUC, FlowControl: true, StartingPSN: 0xfffffe,
			LocalCMResponseTimeout: 30, RetryCount: 6, PKey: 0x8001, PathMTU: 15, RDCExists: true, RNRRetryCount: 5,
			MaxCMRetries: 14, SRQ: true, ExtendedTransport: 7, Primary: path, Alternate: Path{HopLimit: 1, SL: 3},
			PrivateData: pd(REQPrivateDataSize)},
		&MRA{LocalCommID: 1, RemoteCommID: 2, MessageMRAed: MsgOther, ServiceTimeout: 31, PrivateData: pd(MRAPrivateDataSize)},
		&REJ{LocalCommID: 3, RemoteCommID: 4, MessageRejected: MsgREP, Reason: 0xfffe, ARI: pd(REJARISize),
			PrivateData: pd(REJPrivateDataSize)},
		&REP{LocalCommID: 5, RemoteCommID: 6, LocalQKey: 7, LocalQPN: 0xfedcba, LocalEECN: 0xabcdef, StartingPSN: 0x123456,
			ResponderResources: 9, InitiatorDepth: 10, TargetACKDelay: 31, FailoverAccepted: 3, FlowControl: true,
			RNRRetryCount: 7, SRQ: true, LocalCAGUID: 11, PrivateData: pd(REPPrivateDataSize)},
		&RTU{LocalCommID: 12, RemoteCommID: 13, PrivateData: pd(RTUPrivateDataSize)},
		&DREQ{LocalCommID: 14, RemoteCommID: 15, RemoteQPN: 0xffffff, PrivateData: pd(DREQPrivateDataSize)},
		&DREP{LocalCommID: 16, RemoteCommID: 17, PrivateData: pd(DREPPrivateDataSize)},
	}
	for _, m := range msgs {
		b, err := Marshal(0x1122334455667788, m)
		if err != nil {
			t.Fatalf("%s: %v", AttrName(m.AttrID()), err)
		}
		h, got, err := Unmarshal(b[:])
		if err != nil {
			t.Fatalf("%s: %v", AttrName(m.AttrID()), err)
		}
		if h.TID != 0x1122334455667788 || h.AttrID != m.AttrID() || h.Method != MethodSend || h.MgmtClass != ClassCM {
			t.Errorf("%s: header %+v", AttrName(m.AttrID()), h)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%s: got\n%+v\nwant\n%+v", AttrName(m.AttrID()), got, m)
		}
	}
}

// TestMarshalRejects checks that fields wider than their bits and private
// data longer than its room are errors.
func TestMarshalRejects(t *testing.T) {
	bad := []Message{
		&REQ{LocalQPN: 1 << 24},
		&REQ{StartingPSN: 1 << 24},
		&REQ{RetryCount: 8},
		&REQ{PathMTU: 16},
		&REQ{RemoteCMResponseTimeout: 32},
		&REQ{MaxCMRetries: 16},
		&REQ{Primary: Path{FlowLabel: 1 << 20}},
		&REQ{Alternate: Path{LocalACKTimeout: 32}},
		&REQ{PrivateData: make([]byte, REQPrivateDataSize+1)},
		&MRA{ServiceTimeout: 32},
		&MRA{MessageMRAed: 4},
		&REJ{ARI: make([]byte, REJARISize+1)},
		&REJ{PrivateData: make([]byte, REJPrivateDataSize+1)},
		&REP{RNRRetryCount: 8},
		&REP{TargetACKDelay: 32},
		&REP{PrivateData: make([]byte, REPPrivateDataSize+1)},
		&RTU{PrivateData: make([]byte, RTUPrivateDataSize+1)},
		&DREQ{RemoteQPN: 1 << 24},
		&DREP{PrivateData: make([]byte, DREPPrivateDataSize+1)},
	}
	for _, m := range bad {
		b, err := Marshal(1, m)
		if !errors.Is(err, ErrField) && !errors.Is(err, ErrPrivData) {
			t.Errorf("%s %+v: err %v", AttrName(m.AttrID()), m, err)
		}
		if b != [MADSize]byte{} {
			t.Errorf("%s: wrote bytes on error", AttrName(m.AttrID()))
		}
	}
}

// TestUnmarshalRejects checks that what is not a CM connection MAD is an
// error, not a panic.
func TestUnmarshalRejects(t *testing.T) {
	good, _ := Marshal(1, &RTU{})
	mod := func(i int, v byte) []byte {
		b := good
		b[i] = v
		return b[:]
	}
	cases := []struct {
		b    []byte
		want error
	}{
		{nil, ErrShort},
		{good[:MADSize-1], ErrShort},
		{mod(0, 2), ErrNotCM},       // base version
		{mod(1, 0x81), ErrNotCM},    // class (SMP)
		{mod(2, 1), ErrNotCM},       // class version
		{mod(3, 0x81), ErrNotCM},    // method GetResp
		{mod(17, 0x1a), ErrUnknown}, // APR
		{mod(17, 0x19), ErrUnknown},
		{mod(17, 0xff), ErrUnknown},
	}
	for i, c := range cases {
		if _, m, err := Unmarshal(c.b); !errors.Is(err, c.want) || m != nil {
			t.Errorf("case %d: %v, %v; want %v", i, m, err, c.want)
		}
	}
	// A REJ whose ARI length claims more than the field holds is cut to
	// the field.
	rej, _ := Marshal(1, &REJ{Reason: 8})
	rej[HeaderSize+9] = 0xfe
	if _, m, err := Unmarshal(rej[:]); err != nil || len(m.(*REJ).ARI) != REJARISize {
		t.Errorf("REJ with ARI length 127: %v %v", m, err)
	}
}

// TestIPHeader covers rdma_cm's IP header for both families and its
// errors.
func TestIPHeader(t *testing.T) {
	for _, h := range []IPHeader{
		{SrcPort: 0xd59a, Src: netip.MustParseAddr("198.18.0.12"), Dst: netip.MustParseAddr("198.18.0.11")},
		{SrcPort: 1, Src: netip.MustParseAddr("2001:2::1"), Dst: netip.MustParseAddr("2001:2::ffff:1")},
	} {
		var b [IPHeaderSize]byte
		if err := h.Marshal(b[:]); err != nil {
			t.Fatal(err)
		}
		got, err := ParseIPHeader(b[:])
		if err != nil || got != h {
			t.Errorf("%+v: parsed %+v %v", h, got, err)
		}
	}
	var b [IPHeaderSize]byte
	if err := (&IPHeader{Src: netip.MustParseAddr("1.2.3.4"), Dst: netip.MustParseAddr("::1")}).Marshal(b[:]); !errors.Is(err, ErrField) {
		t.Errorf("mixed families: %v", err)
	}
	if err := (&IPHeader{}).Marshal(b[:]); !errors.Is(err, ErrField) {
		t.Errorf("no addresses: %v", err)
	}
	if err := (&IPHeader{Src: netip.MustParseAddr("1.2.3.4"), Dst: netip.MustParseAddr("1.2.3.5")}).Marshal(b[:10]); !errors.Is(err, ErrShort) {
		t.Errorf("short buffer: %v", err)
	}
	if _, err := ParseIPHeader(b[:35]); !errors.Is(err, ErrShort) {
		t.Errorf("short: %v", err)
	}
	b[1] = 0x50
	if _, err := ParseIPHeader(b[:]); !errors.Is(err, ErrField) {
		t.Errorf("IP version 5: %v", err)
	}
	b[0], b[1] = 1, 0x40
	if _, err := ParseIPHeader(b[:]); !errors.Is(err, ErrField) {
		t.Errorf("header version 1: %v", err)
	}
	if ServiceID(PortSpaceTCP, 7174) != 0x0000000001061c06 {
		t.Errorf("service ID %#x", ServiceID(PortSpaceTCP, 7174))
	}
	for _, sid := range []uint64{0x0000000101061c06, 0x0000000005061c06} {
		if _, _, ok := ServicePort(sid); ok {
			t.Errorf("ServicePort(%#x) ok", sid)
		}
	}
}
