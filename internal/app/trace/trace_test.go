package trace_test

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/rocelayer"
)

// frame builds an Ethernet/IPv4/UDP frame to dport carrying h and payload
// with a correct ICRC.
func frame(t testing.TB, dport layers.UDPPort, h bth.Header, payload []byte) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2},
		EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, TOS: 0x62, Id: 7, Flags: layers.IPv4DontFragment, Protocol: layers.IPProtocolUDP,
		SrcIP: net.IPv4(198, 18, 0, 1).To4(), DstIP: net.IPv4(198, 18, 0, 2).To4()}
	udp := &layers.UDP{SrcPort: 49152, DstPort: dport}
	r := &rocelayer.RoCE{Header: h}
	if err := r.SetNetworkLayerForICRC(ip, udp); err != nil {
		t.Fatal(err)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, eth, ip, udp, r,
		gopacket.Payload(payload)); err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(buf.Bytes())
}

var bigWrite = bth.Header{Opcode: bth.RCWriteFirst, PKey: 0x8001, BECN: true, DestQP: 0xabcdef, PSN: 0xffffff,
	RETH: bth.RETHFields{VA: 1<<63 + 12345, RKey: 0x1234, DMALen: 4096}}

// TestFromFrame checks one built frame's record: IP fields, BTH fields,
// RETH, and the exact digits of a VA above 2^53 in JSON.
func TestFromFrame(t *testing.T) {
	ts := time.Date(2025, 1, 2, 3, 4, 5, 6000, time.UTC)
	r, ok := trace.FromFrame(3, ts, layers.LinkTypeEthernet, frame(t, rocelayer.Port, bigWrite, make([]byte, 1021)))
	if !ok || r.RoCE == nil {
		t.Fatalf("ok %v record %+v", ok, r)
	}
	if r.Frame != 3 || !r.Time.Equal(ts) || r.Src.String() != "198.18.0.1" || r.DstPort != 4791 ||
		r.IPID == nil || *r.IPID != 7 || r.DSCP != 0x18 || r.ECN != 2 {
		t.Errorf("IP part: %+v", r)
	}
	if r.Opcode != bth.RCWriteFirst || r.OpcodeName != "RC_RDMA_WRITE_FIRST" || r.DestQP != 0xabcdef ||
		r.PSN != 0xffffff || !r.BECN || r.FECN || r.PKey != 0x8001 || r.Pad != 3 || r.PayloadLen != 1021 || !r.ICRCOK {
		t.Errorf("RoCE part: %+v", *r.RoCE)
	}
	if r.RETH == nil || r.RETH.VA != 1<<63+12345 || r.AETH != nil || r.Imm != nil {
		t.Errorf("ext headers: %+v", *r.RoCE)
	}
	j, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(j, []byte(`"reth":{"va":9223372036854788153,"rkey":4660,"dma_len":4096}`)) {
		t.Errorf("JSON %s", j)
	}
	want := "#3 2025-01-02T03:04:05.000006Z 198.18.0.1:49152 -> 198.18.0.2:4791 RC_RDMA_WRITE_FIRST dqpn=0xabcdef " +
		"psn=16777215 ackreq=0 becn=1 pad=3 pkey=0x8001 reth(va=0x8000000000003039 rkey=0x1234 dma_len=4096) len=1021 icrc=ok"
	if s := r.String(); s != want {
		t.Errorf("String:\n%s\nwant\n%s", s, want)
	}
}

// TestBadFrames checks that a frame that is not RoCE is skipped and that
// malformed RoCE frames give error records without header fields.
func TestBadFrames(t *testing.T) {
	if _, ok := trace.FromFrame(1, time.Time{}, layers.LinkTypeEthernet, frame(t, 53, bigWrite, nil)); ok {
		t.Error("UDP port 53 frame gave a record")
	}
	good := frame(t, rocelayer.Port, bth.Header{Opcode: bth.RCSendOnly, PSN: 1}, make([]byte, 40))
	badICRC := bytes.Clone(good)
	badICRC[len(badICRC)-1] ^= 0xff
	for name, data := range map[string][]byte{
		"opcode":    func() []byte { b := bytes.Clone(good); b[42] = 0x1e; return b }(),
		"truncated": good[:len(good)-8],
		"short":     good[:42+8],
	} {
		r, ok := trace.FromFrame(9, time.Time{}, layers.LinkTypeEthernet, data)
		if !ok || r.RoCE != nil || r.Error == "" {
			t.Errorf("%s: ok %v record %+v", name, ok, r)
			continue
		}
		j, _ := json.Marshal(r)
		if !bytes.Contains(j, []byte(`"error":`)) || bytes.Contains(j, []byte(`"opcode"`)) {
			t.Errorf("%s: JSON %s", name, j)
		}
		if s := r.String(); !strings.Contains(s, " error: ") {
			t.Errorf("%s: String %q", name, s)
		}
	}
	r, ok := trace.FromFrame(1, time.Time{}, layers.LinkTypeEthernet, badICRC)
	if !ok || r.RoCE == nil || r.ICRCOK || !strings.HasSuffix(r.String(), " icrc=bad("+r.ICRCWire+")") {
		t.Errorf("bad ICRC: %+v %q", r, r.String())
	}
}

// TestReadPcap writes a small pcap (RoCE, non-RoCE, malformed and
// snap-truncated frames) and reads it back: frame numbers count every
// frame, non-RoCE is skipped, errors do not stop the trace.
func TestReadPcap(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.pcap")
	var file bytes.Buffer
	w := pcapgo.NewWriter(&file)
	if err := w.WriteFileHeader(2048, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	good := frame(t, rocelayer.Port, bth.Header{Opcode: bth.RCAck, PSN: 5, AETH: bth.AETHFields{Syndrome: 0x1f, MSN: 2}}, nil)
	frames := [][]byte{good, frame(t, 53, bigWrite, nil), good[:len(good)-2], good}
	for i, f := range frames {
		ci := gopacket.CaptureInfo{Timestamp: time.Unix(int64(i), 0), CaptureLength: len(f), Length: len(f)}
		if i == 2 {
			ci.Length += 2 // cut by the snap length
		}
		if err := w.WritePacket(ci, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, file.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	var got []trace.Record
	if err := trace.ReadFile(path, func(r trace.Record) error { got = append(got, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Frame != 1 || got[1].Frame != 3 || got[2].Frame != 4 {
		t.Fatalf("records %+v", got)
	}
	if got[0].RoCE == nil || got[0].AETH == nil || got[0].AETH.MSN != 2 || got[1].Error == "" || got[2].RoCE == nil {
		t.Errorf("records %+v", got)
	}
	if err := trace.ReadFile(filepath.Join(t.TempDir(), "none"), func(trace.Record) error { return nil }); err == nil {
		t.Error("missing file: no error")
	}
	if err := trace.Read(strings.NewReader("not a capture"), func(trace.Record) error { return nil }); err == nil {
		t.Error("garbage file: no error")
	}
}

// TestReadStats reads a pcapng file of two interfaces whose statistics
// blocks say how many frames each capture dropped (the second twice: its
// last count counts) and checks the sum, the frames read beside it, and
// that a file without statistics says nothing.
func TestReadStats(t *testing.T) {
	good := frame(t, rocelayer.Port, bth.Header{Opcode: bth.RCAck, PSN: 5, AETH: bth.AETHFields{Syndrome: 0x1f, MSN: 2}}, nil)
	file := func(drops ...uint64) []byte {
		var b bytes.Buffer
		w, err := pcapgo.NewNgWriter(&b, layers.LinkTypeEthernet)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.AddInterface(pcapgo.NgInterface{Name: "second", LinkType: layers.LinkTypeEthernet}); err != nil {
			t.Fatal(err)
		}
		ci := gopacket.CaptureInfo{Timestamp: time.Unix(1, 0), CaptureLength: len(good), Length: len(good)}
		for range 3 {
			if err := w.WritePacket(ci, good); err != nil {
				t.Fatal(err)
			}
		}
		for i, d := range drops {
			st := pcapgo.NgInterfaceStatistics{LastUpdate: time.Unix(2, 0), PacketsReceived: pcapgo.NgNoValue64, PacketsDropped: d}
			if err := w.WriteInterfaceStats(min(i, 1), st); err != nil {
				t.Fatal(err)
			}
		}
		w.Flush()
		return b.Bytes()
	}
	n := 0
	count := func(trace.Record) error { n++; return nil }
	cs, err := trace.ReadStats(bytes.NewReader(file(4, 7, 11)), count)
	if err != nil || n != 3 || !cs.Known || cs.Dropped != 11+4 {
		t.Errorf("first interface's drops 4, second's 7 then 11: %+v, %d frames, %v", cs, n, err)
	}
	n = 0
	if cs, err := trace.ReadStats(bytes.NewReader(file()), count); err != nil || n != 3 || cs.Known || cs.Dropped != 0 {
		t.Errorf("no statistics: %+v, %d frames, %v", cs, n, err)
	}
}

// TestWireICRC checks the wire form of the example: the value
// 2229930251 (0x84ea090b) is the bytes 0b 09 ea 84 on the wire, which
// Wireshark shows as 0x0b09ea84.
func TestWireICRC(t *testing.T) {
	if got := trace.WireICRC(2229930251); got != "0x0b09ea84" {
		t.Errorf("WireICRC(2229930251) = %q, want 0x0b09ea84", got)
	}
	if got := trace.WireICRC(0x000000ff); got != "0xff000000" {
		t.Errorf("WireICRC(0xff) = %q", got)
	}
}
