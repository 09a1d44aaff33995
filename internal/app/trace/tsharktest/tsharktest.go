// Package tsharktest checks rxego's capture decoder against Wireshark's:
// it runs tshark over a capture and compares every InfiniBand frame field
// by field with what internal/app/trace decodes. It is shared by trace's own
// tests and the tests that record captures with the demo.
package tsharktest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/internal/app/trace"
)

// pdmlField is a <proto> or <field> element of tshark's PDML output.
type pdmlField struct {
	Name   string      `xml:"name,attr"`
	Show   string      `xml:"show,attr"`
	Value  string      `xml:"value,attr"`
	Pos    int         `xml:"pos,attr"`
	Size   int         `xml:"size,attr"`
	Fields []pdmlField `xml:"field"`
}

// pdmlPacket is one <packet> element.
type pdmlPacket struct {
	Protos []pdmlField `xml:"proto"`
}

// Frame is what tshark decoded from one frame: every field by name
// (first occurrence), the InfiniBand headers by name, and their fields
// keyed "header/field" so that the RETH's VA and the AtomicETH's VA (one
// tshark field name) stay apart.
type Frame struct {
	field map[string]pdmlField // ip.*, udp.*, geninfo's num and timestamp, data.len
	hdr   map[string]pdmlField // infiniband.bth, infiniband.reth, ... top level
	sub   map[string]pdmlField // "infiniband.reth/infiniband.reth.va"
}

func flatten(fs []pdmlField, into map[string]pdmlField) {
	for _, f := range fs {
		if _, ok := into[f.Name]; !ok {
			into[f.Name] = f
		}
		flatten(f.Fields, into)
	}
}

func newFrame(p pdmlPacket) *Frame {
	t := &Frame{field: map[string]pdmlField{}, hdr: map[string]pdmlField{}, sub: map[string]pdmlField{}}
	for _, pr := range p.Protos {
		if pr.Name != "infiniband" {
			flatten(pr.Fields, t.field)
			continue
		}
		for _, h := range pr.Fields {
			if _, ok := t.hdr[h.Name]; !ok {
				t.hdr[h.Name] = h
			}
			sub := map[string]pdmlField{}
			flatten(h.Fields, sub)
			for k, v := range sub {
				t.sub[h.Name+"/"+k] = v
			}
		}
	}
	return t
}

// Frames runs tshark over a capture and returns its InfiniBand
// frames by frame number.
func Frames(t *testing.T, path string) map[int]*Frame {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// RPC-over-RDMA's heuristic claims some SEND payloads (those with
	// Invalidate) and throws before the ICRC is shown; it is not ours to
	// compare, so it is turned off.
	cmd := exec.CommandContext(ctx, "tshark", "-n", "-r", path, "-d", "udp.port==4791,infiniband",
		"--disable-protocol", "rpcordma", "-Y", "infiniband", "-T", "pdml")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	frames := map[int]*Frame{}
	dec := xml.NewDecoder(out)
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("reading tshark PDML: %v", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Local != "packet" {
			continue
		}
		var p pdmlPacket
		if err := dec.DecodeElement(&p, &se); err != nil {
			t.Fatal(err)
		}
		f := newFrame(p)
		n, err := strconv.Atoi(f.field["num"].Show)
		if err != nil {
			t.Fatalf("tshark packet without a frame number: %v", err)
		}
		frames[n] = f
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr.String())
	}
	return frames
}

// num parses a number as tshark shows it: decimal, or hex with 0x.
func num(t *testing.T, f pdmlField) uint64 {
	t.Helper()
	s := f.Show
	base := 10
	if strings.HasPrefix(s, "0x") {
		s, base = s[2:], 16
	}
	v, err := strconv.ParseUint(s, base, 64)
	if err != nil {
		t.Fatalf("tshark field %s: show %q: %v", f.Name, f.Show, err)
	}
	return v
}

// raw returns the bytes of a field (its PDML value attribute).
func raw(t *testing.T, f pdmlField) []byte {
	t.Helper()
	b, err := hex.DecodeString(f.Value)
	if err != nil {
		t.Fatalf("tshark field %s: value %q: %v", f.Name, f.Value, err)
	}
	return b
}

// record turns tshark's decoding of a frame into a trace.Record, leaving
// zero what tshark does not decode (opcode name, ICRC check). With
// bthOnly, only the IP, UDP and BTH fields are taken: tshark 4.0 decodes
// nothing after the BTH of an opcode it does not know.
func (f *Frame) record(t *testing.T, bthOnly bool) trace.Record {
	t.Helper()
	get := func(m map[string]pdmlField, name string) pdmlField {
		v, ok := m[name]
		if !ok {
			t.Fatalf("tshark gave no %s", name)
		}
		return v
	}
	u := func(name string) uint64 { return num(t, get(f.sub, name)) }
	b := func(name string) bool { return u(name) != 0 }
	var r trace.Record
	r.Frame = int(num(t, get(f.field, "num")))
	r.Src = netip.MustParseAddr(get(f.field, "ip.src").Show)
	r.Dst = netip.MustParseAddr(get(f.field, "ip.dst").Show)
	r.SrcPort = uint16(num(t, get(f.field, "udp.srcport")))
	r.DstPort = uint16(num(t, get(f.field, "udp.dstport")))
	id := uint16(num(t, get(f.field, "ip.id")))
	r.IPID = &id
	r.DSCP = uint8(num(t, get(f.field, "ip.dsfield.dscp")))
	r.ECN = uint8(num(t, get(f.field, "ip.dsfield.ecn")))

	bthHdr := get(f.hdr, "infiniband.bth")
	const B = "infiniband.bth/infiniband.bth."
	x := &trace.RoCE{
		Opcode: bth.Opcode(u(B + "opcode")), SE: b(B + "se"), MigReq: b(B + "m"), Pad: uint8(u(B + "padcnt")),
		TVer: uint8(u(B + "tver")), PKey: uint16(u(B + "p_key")), DestQP: uint32(u(B + "destqp")),
		AckReq: b(B + "a"), PSN: bth.PSN(u(B + "psn")),
	}
	// tshark 4.0 shows BTH byte 4 (FECN, BECN, reserved) as one reserved
	// byte; take the bits from it.
	resv := get(f.sub, "infiniband.bth/infiniband.reserved")
	if resv.Pos != bthHdr.Pos+4 || resv.Size != 1 {
		t.Fatalf("tshark BTH reserved byte at %d+%d, BTH at %d", resv.Pos, resv.Size, bthHdr.Pos)
	}
	b4 := raw(t, resv)[0]
	x.FECN, x.BECN = b4&0x80 != 0, b4&0x40 != 0
	r.RoCE = x
	if bthOnly {
		return r
	}

	end := bthHdr.Pos + bthHdr.Size // end of the last extended header
	for name, h := range f.hdr {
		switch name {
		case "infiniband.rdeth", "infiniband.deth", "infiniband.reth", "infiniband.atomiceth", "infiniband.aeth",
			"infiniband.atomicacketh", "infiniband.immdt", "infiniband.ieth":
			end = max(end, h.Pos+h.Size)
		}
	}
	if _, ok := f.hdr["infiniband.reth"]; ok {
		const R = "infiniband.reth/infiniband.reth."
		x.RETH = &trace.RETH{VA: u(R + "va"), RKey: uint32(u(R + "r_key")), DMALen: uint32(u(R + "dmalen"))}
	}
	if _, ok := f.hdr["infiniband.aeth"]; ok {
		const A = "infiniband.aeth/infiniband.aeth."
		x.AETH = &trace.AETH{Syndrome: uint8(u(A + "syndrome")), MSN: uint32(u(A + "msn"))}
	}
	if h, ok := f.hdr["infiniband.immdt"]; ok {
		v := binary.BigEndian.Uint32(raw(t, h))
		x.Imm = &v
	}
	if h, ok := f.hdr["infiniband.ieth"]; ok {
		v := binary.BigEndian.Uint32(raw(t, h))
		x.IETHRKey = &v
	}
	if _, ok := f.hdr["infiniband.atomiceth"]; ok {
		const A = "infiniband.atomiceth/infiniband."
		x.Atomic = &trace.Atomic{VA: u(A + "reth.va"), RKey: uint32(u(A + "reth.r_key")),
			SwapAdd: u(A + "atomiceth.swapdt"), Compare: u(A + "atomiceth.cmpdt")}
	}
	if _, ok := f.hdr["infiniband.atomicacketh"]; ok {
		x.AtomicAck = &trace.AtomicAck{Orig: u("infiniband.atomicacketh/infiniband.atomicacketh.origremdt")}
	}
	if _, ok := f.hdr["infiniband.deth"]; ok {
		const D = "infiniband.deth/infiniband.deth."
		x.DETH = &trace.DETH{QKey: uint32(u(D + "q_key")), SrcQP: uint32(u(D + "srcqp"))}
	}
	if _, ok := f.hdr["infiniband.mad"]; ok {
		x.CM = f.cm(t)
	}
	crc := get(f.hdr, "infiniband.invariant.crc")
	x.ICRC = trace.HexU32(binary.LittleEndian.Uint32(raw(t, crc))) // same bytes, our byte order
	x.ICRCWire = crc.Show                                          // the wire form, as tshark shows it
	if len(x.ICRCWire) != 10 || !strings.HasPrefix(x.ICRCWire, "0x") {
		t.Fatalf("tshark shows ICRC %q, want 0x and 8 digits", crc.Show)
	}
	x.PayloadLen = crc.Pos - end - int(x.Pad)
	// tshark's data dissector gets the payload with its pad bytes.
	if d, ok := f.field["data.len"]; ok && int(num(t, d)) != x.PayloadLen+int(x.Pad) {
		t.Errorf("frame %d: tshark data.len %s, header positions give payload %d + pad %d", r.Frame, d.Show, x.PayloadLen, x.Pad)
	}
	return r
}

// cm turns tshark's decoding of a CM MAD into a trace.CM. tshark 4.0
// names each message's Local Communication ID after the message
// ("infiniband.cm.rep"), calls DREP "drsp", does not show a DREQ's
// Remote QPN and does not decode an MRA beyond its MAD header: those are
// left for the caller to fill in.
func (f *Frame) cm(t *testing.T) *trace.CM {
	t.Helper()
	field := func(name string) (uint64, bool) {
		v, ok := f.sub[name]
		if !ok {
			return 0, false
		}
		return num(t, v), true
	}
	must := func(name string) uint64 {
		v, ok := field(name)
		if !ok {
			t.Fatalf("tshark gave no %s", name)
		}
		return v
	}
	const M = "infiniband.mad/infiniband.mad."
	c := &trace.CM{AttrID: uint16(must(M + "attributeid")), TID: must(M + "transactionid")}
	c.Msg = cm.AttrName(c.AttrID)
	if c.Msg == "MRA" {
		return c
	}
	p := "infiniband.smplid.smpdata/infiniband.cm." + map[string]string{"DREP": "drsp"}[c.Msg]
	if p == "infiniband.smplid.smpdata/infiniband.cm." {
		p += strings.ToLower(c.Msg)
	}
	if v, ok := field(p); ok {
		c.LocalCommID = uint32(v)
	} else {
		c.LocalCommID = uint32(must(p + ".localcommid"))
	}
	if c.Msg != "REQ" {
		c.RemoteCommID = uint32(must(p + ".remotecommid"))
	}
	u32 := func(name string) *uint32 { v := uint32(must(p + name)); return &v }
	switch c.Msg {
	case "REQ":
		c.LocalQPN, c.StartingPSN = u32(".localqpn"), u32(".startpsn")
		v := must(p + ".serviceid")
		c.ServiceID = &v
	case "REP":
		c.LocalQPN, c.StartingPSN = u32(".localqpn"), u32(".startpsn")
	case "REJ":
		v := uint16(must(p + ".reason"))
		c.Reason = &v
	}
	return c
}

// epoch formats a time the way tshark's geninfo timestamp value does.
func epoch(ts time.Time) string { return fmt.Sprintf("%d.%09d", ts.Unix(), ts.Nanosecond()) }

// Compare checks every frame tshark decoded as InfiniBand against the
// trace record of the same frame. Opcodes for which bthOnly is true are
// compared up to the BTH.
func Compare(t *testing.T, want map[int]*Frame, got map[int]trace.Record, bthOnly func(bth.Opcode) bool) {
	t.Helper()
	for n, tf := range want {
		r, ok := got[n]
		if !ok {
			t.Errorf("frame %d: tshark decodes InfiniBand, trace has no record", n)
			continue
		}
		if r.RoCE == nil {
			t.Errorf("frame %d: trace error %q; tshark decodes it", n, r.Error)
			continue
		}
		if !r.ICRCOK {
			t.Errorf("frame %d: ICRC does not check", n)
		}
		if e := epoch(r.Time); e != tf.field["timestamp"].Value {
			t.Errorf("frame %d: time %s, tshark %s", n, e, tf.field["timestamp"].Value)
		}
		partial := bthOnly != nil && bthOnly(r.Opcode)
		w := tf.record(t, partial)
		w.Time = r.Time
		w.OpcodeName, w.ICRCOK = r.OpcodeName, r.ICRCOK // tshark has no equivalent
		if w.RoCE != nil && w.CM != nil && r.CM != nil {
			switch w.CM.Msg { // what tshark 4.0 does not show
			case "DREQ":
				w.CM.RemoteQPN = r.CM.RemoteQPN
			case "MRA":
				w.CM.LocalCommID, w.CM.RemoteCommID = r.CM.LocalCommID, r.CM.RemoteCommID
			}
		}
		if partial {
			bthPart := *r.RoCE
			bthPart = trace.RoCE{Opcode: bthPart.Opcode, OpcodeName: bthPart.OpcodeName, DestQP: bthPart.DestQP, PSN: bthPart.PSN,
				AckReq: bthPart.AckReq, SE: bthPart.SE, MigReq: bthPart.MigReq, Pad: bthPart.Pad, TVer: bthPart.TVer,
				PKey: bthPart.PKey, FECN: bthPart.FECN, BECN: bthPart.BECN, ICRCOK: bthPart.ICRCOK}
			r.RoCE = &bthPart
		}
		if !reflect.DeepEqual(r, w) {
			gj, _ := json.Marshal(r)
			wj, _ := json.Marshal(w)
			t.Errorf("frame %d differs:\ntrace  %s\ntshark %s", n, gj, wj)
		}
	}
}

// BTHOnly reports the opcodes whose extended headers tshark 4.0
// does not decode right, so only their BTH is compared: FLUSH and ATOMIC
// WRITE (IBTA 1.5) and CNP, which it shows as "Unknown" and decodes no
// further; and the RD opcodes, whose BTH it takes as 20 bytes long, so it
// reads the RDETH and everything after it 8 bytes late (IBTA puts the
// RDETH right after the 12-byte BTH; RoCEv2 carries no RD anyway).
func BTHOnly(op bth.Opcode) bool {
	return op == bth.RCFlush || op == bth.RCAtomicWrite || op == bth.CNPOpcode || op.Info().Class == bth.RD
}

// TestAgainstTsharkSynthetic covers what the captures do not: every opcode
// of the table (RC, UC, RD, UD, CNP) with random header fields, FECN and
// BECN, non-zero pad counts and random payload lengths, written to a pcap

// Need skips the test when tshark is missing, except in CI, where
// it must be installed.
func Need(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("tshark"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("tshark is not installed; CI must install it (apt-get install -y tshark)")
		}
		t.Skip("tshark not installed: apt-get install -y tshark")
	}
}

// Wireshark's expert severities (epan/proto.h).
const (
	severityWarn  = 0x00600000
	severityError = 0x00800000
)

// ExpertCheck runs tshark over a capture with IP and UDP checksum
// validation and fails on malformed frames and expert warnings or
// errors. It returns the number of frames.
func ExpertCheck(t *testing.T, path string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "tshark", "-n", "-r", path, "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
		"-d", "udp.port==4791,infiniband", "--disable-protocol", "rpcordma",
		"-T", "fields", "-E", "separator=|", "-e", "frame.number", "-e", "_ws.malformed", "-e", "_ws.expert.severity", "-e", "_ws.expert.message")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr.String())
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 4 {
			t.Fatalf("tshark line %q", line)
		}
		n++
		if f[1] != "" {
			t.Errorf("frame %s malformed: %s", f[0], f[3])
		}
		for _, sv := range strings.Split(f[2], ",") {
			if sv == "" {
				continue
			}
			v, err := strconv.ParseUint(strings.TrimPrefix(sv, "0x"), 16, 32)
			if err != nil {
				v, err = strconv.ParseUint(sv, 10, 32)
			}
			if err != nil || v >= severityWarn {
				t.Errorf("frame %s: expert severity %s: %s", f[0], sv, f[3])
			}
		}
	}
	return n
}
