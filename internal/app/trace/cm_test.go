package trace_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/internal/app/trace/tsharktest"
	"github.com/rxego/rxego/rocelayer"
)

// TestCMRping decodes the CM exchange of a real rping against rxe 6.12:
// REQ, REP, RTU, then DREQ and DREP, with the communication IDs tying
// them together and the QPNs and PSNs the QPs then use, checked against
// the RC traffic of the same capture.
func TestCMRping(t *testing.T) {
	var cms []*trace.CM
	var reqFrom netip.Addr
	firstPSN := map[string]uint32{} // first RC request PSN by destination address and QP
	err := trace.ReadFile("../../../testdata/pcaps/rping_6.12.pcapng", func(r trace.Record) error {
		if r.RoCE == nil {
			return nil
		}
		key := fmt.Sprintf("%v/%#x", r.Dst, r.DestQP)
		if r.CM != nil {
			cms = append(cms, r.CM)
			if r.CM.Msg == "REQ" {
				reqFrom = r.Src
			}
		} else if _, seen := firstPSN[key]; !seen && r.Opcode.Info().Class == bth.RC && r.AETH == nil && !strings.Contains(r.OpcodeName, "READ_RESPONSE") {
			firstPSN[key] = uint32(r.PSN)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for _, c := range cms {
		msgs = append(msgs, c.Msg)
		if c.Error != "" {
			t.Errorf("%s: %s", c.Msg, c.Error)
		}
	}
	if len(cms) != 5 || msgs[0] != "REQ" || msgs[1] != "REP" || msgs[2] != "RTU" || msgs[3] != "DREQ" || msgs[4] != "DREP" {
		t.Fatalf("CM messages %v", msgs)
	}
	req, rep, rtu, dreq, drep := cms[0], cms[1], cms[2], cms[3], cms[4]
	if rep.RemoteCommID != req.LocalCommID || rtu.LocalCommID != req.LocalCommID || rtu.RemoteCommID != rep.LocalCommID ||
		dreq.LocalCommID != req.LocalCommID || drep.LocalCommID != rep.LocalCommID || drep.RemoteCommID != req.LocalCommID {
		t.Errorf("communication IDs do not tie up: %+v %+v %+v %+v %+v", req, rep, rtu, dreq, drep)
	}
	if req.LocalQPN == nil || rep.LocalQPN == nil || req.StartingPSN == nil || rep.StartingPSN == nil || req.ServiceID == nil ||
		dreq.RemoteQPN == nil || *dreq.RemoteQPN != *rep.LocalQPN {
		t.Fatalf("REQ %+v REP %+v DREQ %+v", req, rep, dreq)
	}
	// Each message's Starting PSN is the first PSN its sender expects:
	// the REQ's receiver (rping's server) sends from the REQ's PSN, the
	// REQ's sender from the REP's, to the QP the other message names.
	if reqFrom.String() != "198.18.0.12" {
		t.Fatalf("REQ from %v", reqFrom)
	}
	if got, ok := firstPSN[fmt.Sprintf("198.18.0.12/%#x", *req.LocalQPN)]; !ok || got != *req.StartingPSN {
		t.Errorf("first request to the REQ's QP %#x at PSN %d, REQ said %d", *req.LocalQPN, got, *req.StartingPSN)
	}
	if got, ok := firstPSN[fmt.Sprintf("198.18.0.11/%#x", *rep.LocalQPN)]; !ok || got != *rep.StartingPSN {
		t.Errorf("first request to the REP's QP %#x at PSN %d, REP said %d", *rep.LocalQPN, got, *rep.StartingPSN)
	}
	if *req.ServiceID != cm.ServiceID(cm.PortSpaceTCP, 7174) {
		t.Errorf("service ID %#x, want rdma_cm TCP port 7174", *req.ServiceID)
	}
}

// cmFrames builds one UD SEND Only to QP1 for each CM connection message,
// as the CM sends them.
func cmFrames(t *testing.T) [][]byte {
	msgs := []cm.Message{
		&cm.REQ{LocalCommID: 0x11, ServiceID: cm.ServiceID(cm.PortSpaceTCP, 7471), LocalQPN: 0x123, StartingPSN: 0xabcde, TransportType: cm.TransportRC},
		&cm.MRA{LocalCommID: 0x22, RemoteCommID: 0x11, MessageMRAed: cm.MsgREQ, ServiceTimeout: 20},
		&cm.REJ{LocalCommID: 0x22, RemoteCommID: 0x11, MessageRejected: cm.MsgREQ, Reason: cm.RejInvalidServiceID},
		&cm.REP{LocalCommID: 0x22, RemoteCommID: 0x11, LocalQPN: 0x456, StartingPSN: 0x12345},
		&cm.RTU{LocalCommID: 0x11, RemoteCommID: 0x22},
		&cm.DREQ{LocalCommID: 0x11, RemoteCommID: 0x22, RemoteQPN: 0x456},
		&cm.DREP{LocalCommID: 0x22, RemoteCommID: 0x11},
	}
	var out [][]byte
	for i, m := range msgs {
		mad, err := cm.Marshal(uint64(0x1000+i), m)
		if err != nil {
			t.Fatal(err)
		}
		h := bth.Header{Opcode: bth.UDSendOnly, PKey: 0xffff, DestQP: 1, PSN: bth.PSN(i), AckReq: true,
			DETH: bth.DETHFields{QKey: 0x80010000, SrcQP: 1}}
		out = append(out, frame(t, rocelayer.Port, h, mad[:]))
	}
	return out
}

// TestCMMessages decodes every CM connection message, in the text form
// and JSON, and compares each with tshark's decoding where tshark shows
// the field.
func TestCMMessages(t *testing.T) {
	frames := cmFrames(t)
	want := []string{
		"CM REQ local_id=0x00000011 qpn=0x000123 start_psn=703710 service_id=0x0000000001061d2f len=256",
		"CM MRA local_id=0x00000022 remote_id=0x00000011 len=256",
		"CM REJ local_id=0x00000022 remote_id=0x00000011 reason=8 len=256",
		"CM REP local_id=0x00000022 remote_id=0x00000011 qpn=0x000456 start_psn=74565 len=256",
		"CM RTU local_id=0x00000011 remote_id=0x00000022 len=256",
		"CM DREQ local_id=0x00000011 remote_id=0x00000022 remote_qpn=0x000456 len=256",
		"CM DREP local_id=0x00000022 remote_id=0x00000011 len=256",
	}
	var file bytes.Buffer
	w := pcapgo.NewWriter(&file)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	got := map[int]trace.Record{}
	for i, d := range frames {
		r, ok := trace.FromFrame(i+1, time.Unix(1700000000, int64(i)*1000).UTC(), layers.LinkTypeEthernet, d)
		if !ok || r.RoCE == nil || r.CM == nil {
			t.Fatalf("frame %d: %+v", i+1, r)
		}
		if s := r.String(); !bytes.Contains([]byte(s), []byte(want[i])) {
			t.Errorf("frame %d:\n%s\nwant %s", i+1, s, want[i])
		}
		if r.CM.TID != uint64(0x1000+i) {
			t.Errorf("frame %d: TID %#x", i+1, r.CM.TID)
		}
		got[i+1] = r
		if err := w.WritePacket(gopacket.CaptureInfo{Timestamp: r.Time, CaptureLength: len(d), Length: len(d)}, d); err != nil {
			t.Fatal(err)
		}
	}
	tsharktest.Need(t)
	path := filepath.Join(t.TempDir(), "cm.pcap")
	if err := os.WriteFile(path, file.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	ts := tsharktest.Frames(t, path)
	if len(ts) != len(frames) {
		t.Fatalf("tshark decoded %d frames", len(ts))
	}
	tsharktest.Compare(t, ts, got, nil)
}

// TestCMSIDR decodes udaddy's SIDR_REQ and SIDR_REP: the request ID, the
// UDP port space's service ID and the QPN the reply names.
func TestCMSIDR(t *testing.T) {
	msgs := []cm.Message{
		&cm.SIDRREQ{RequestID: 0x33, PKey: 0xffff, ServiceID: cm.ServiceID(cm.PortSpaceUDP, 7174)},
		&cm.SIDRREP{RequestID: 0x33, QPN: 0x789, ServiceID: cm.ServiceID(cm.PortSpaceUDP, 7174), QKey: cm.UDPQKey},
	}
	want := []string{
		"CM SIDR_REQ local_id=0x00000033 service_id=0x0000000001111c06 len=256",
		"CM SIDR_REP local_id=0x00000033 qpn=0x000789 service_id=0x0000000001111c06 len=256",
	}
	for i, m := range msgs {
		mad, err := cm.Marshal(uint64(0x2000+i), m)
		if err != nil {
			t.Fatal(err)
		}
		h := bth.Header{Opcode: bth.UDSendOnly, PKey: 0xffff, DestQP: 1, PSN: bth.PSN(i), AckReq: true,
			DETH: bth.DETHFields{QKey: 0x80010000, SrcQP: 1}}
		d := frame(t, rocelayer.Port, h, mad[:])
		r, ok := trace.FromFrame(i+1, time.Unix(1700000000, 0).UTC(), layers.LinkTypeEthernet, d)
		if !ok || r.CM == nil || r.CM.Error != "" {
			t.Fatalf("frame %d: %+v", i+1, r)
		}
		if s := r.String(); !strings.Contains(s, want[i]) {
			t.Errorf("frame %d:\n%s\nwant %s", i+1, s, want[i])
		}
	}
}
