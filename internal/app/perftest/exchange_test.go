package perftest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// capDir holds the captures of real perftest runs between two rxe guests.
const capDir = "../../../testdata/pcaps"

// tcpMsg is one TCP segment's payload of the exchange in a capture.
type tcpMsg struct {
	fromClient bool
	data       []byte
}

// exchangeOf returns the payloads on TCP port 18515 of a capture, in order.
func exchangeOf(t *testing.T, name string) []tcpMsg {
	t.Helper()
	f, err := os.Open(filepath.Join(capDir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewNgReader(f, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	var out []tcpMsg
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := gopacket.NewPacket(data, r.LinkType(), gopacket.NoCopy)
		tcp, ok := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if !ok || len(tcp.Payload) == 0 || (tcp.SrcPort != DefaultPort && tcp.DstPort != DefaultPort) {
			continue
		}
		out = append(out, tcpMsg{fromClient: tcp.DstPort == DefaultPort, data: bytes.Clone(tcp.Payload)})
	}
	if len(out) == 0 {
		t.Fatalf("%s: no exchange on TCP port %d", name, DefaultPort)
	}
	return out
}

// TestRecordFormat checks the key record against bytes real perftest sent.
func TestRecordFormat(t *testing.T) {
	msgs := exchangeOf(t, "cap_write_bw_64_6.12.pcapng")
	var rec []byte
	for _, m := range msgs {
		if m.fromClient && len(m.data) == recordLen {
			rec = m.data
			break
		}
	}
	d, err := ParseRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	want := Dest{LID: 0, OutReads: 1, QPN: 0x11, PSN: 0xcfa8a8, RKey: 0x29f, VAddr: 0x55f53c2c3000,
		GID: netip.MustParseAddr("::ffff:198.18.0.12").As16()}
	if d != want {
		t.Fatalf("parsed %+v, want %+v", d, want)
	}
	if got := d.MarshalRecord(); !bytes.Equal(got, rec) {
		t.Fatalf("marshalled\n%q\nperftest sent\n%q", got, rec)
	}
	if d.Addr() != netip.MustParseAddr("198.18.0.12") {
		t.Fatalf("Addr %v", d.Addr())
	}
}

// TestParseRecordRejects feeds malformed records: each must be an error.
func TestParseRecordRejects(t *testing.T) {
	good := Dest{OutReads: 0x80, QPN: 0x123456, PSN: 0xabcdef, RKey: 0xdeadbeef, VAddr: 0x7fff00001000, SRQN: 7}.MarshalRecord()
	if _, err := ParseRecord(good); err != nil {
		t.Fatalf("good record: %v", err)
	}
	mutate := func(f func(s string) string) []byte {
		b := make([]byte, recordLen)
		copy(b, f(strings.TrimRight(string(good), "\x00")))
		return b
	}
	cases := map[string][]byte{
		"short":         good[:recordLen-1],
		"empty":         make([]byte, recordLen),
		"no colon":      mutate(func(s string) string { return strings.TrimSuffix(s, ":") }),
		"bad hex":       mutate(func(s string) string { return "zz" + s[2:] }),
		"qpn too wide":  mutate(func(s string) string { return strings.Replace(s, "123456", "1234567", 1)[:len(s)] }),
		"missing field": mutate(func(s string) string { return s[strings.IndexByte(s, ':')+1:] }),
		"gid byte wide": mutate(func(s string) string { return strings.Replace(s, ":00:", ":100:", 1)[:len(s)] }),
	}
	for name, b := range cases {
		if d, err := ParseRecord(b); err == nil {
			t.Errorf("%s: parsed %+v from %q", name, d, b)
		}
	}
}

// replay plays the client side of a capture against conn and checks that
// every server message rxego sends has the captured length (and, for the
// fixed-content ones, the captured bytes). It returns the first error.
func replay(msgs []tcpMsg, conn net.Conn) error {
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	for i, m := range msgs {
		if string(m.data) == doneMsg {
			// Each side writes "done" and closes without reading the
			// other's: nothing to check past here.
			return nil
		}
		if m.fromClient {
			if _, err := conn.Write(m.data); err != nil {
				return err
			}
			continue
		}
		got := make([]byte, len(m.data))
		if _, err := io.ReadFull(conn, got); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		fixed := len(m.data) != recordLen && len(m.data) != reportLen
		if fixed && !bytes.Equal(got, m.data) {
			return fmt.Errorf("message %d: got %q, perftest sent %q", i, got, m.data)
		}
		if len(m.data) == recordLen {
			if _, err := ParseRecord(got); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestServerAgainstCapturedClient runs rxego's passive BW servers against
// the client side of real perftest exchanges (write, read and both
// atomics): the whole sequence of messages must line up, rxego must print
// the client's captured report, and its memory checks must see that the
// replayed client changed nothing.
func TestServerAgainstCapturedClient(t *testing.T) {
	for _, c := range []struct {
		file   string
		test   Test
		atomic AtomicOp
		size   int
		// bad is how many of rxego's memory checks must fail: the replayed
		// client reports ten FETCH_AND_ADDs that never reached rxego, so
		// the ten words it claims to have hit did not move.
		bad int
	}{
		{"cap_write_bw_64_6.12.pcapng", WriteBW, "", 64, 0},
		{"cap_write_bw_4k_6.12.pcapng", WriteBW, "", 4096, 0},
		{"cap_read_bw_4k_6.12.pcapng", ReadBW, "", 4096, 0},
		{"cap_atomic_fa_6.12.pcapng", AtomicBW, FetchAndAdd, 8, 10},
		{"cap_atomic_cas_6.12.pcapng", AtomicBW, CmpAndSwap, 8, 0},
	} {
		t.Run(c.file, func(t *testing.T) {
			msgs := exchangeOf(t, c.file)
			ln, err := net.Listen("tcp", netip.AddrPortFrom(serverAddr, 0).String())
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			errc := make(chan error, 1)
			go func() {
				cli, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					errc <- err
					return
				}
				defer cli.Close()
				errc <- replay(msgs, cli)
			}()
			var out bytes.Buffer
			res, err := Run(context.Background(), Config{Test: c.test, Atomic: c.atomic, Size: c.size, Iters: 10,
				Local: serverAddr, Listener: ln, Out: &out, Timeout: 20 * time.Second})
			if rerr := <-errc; rerr != nil {
				t.Fatalf("replay: %v\n%s", rerr, out.String())
			}
			if (err != nil) != (c.bad > 0) || res == nil {
				t.Fatalf("run: %v\n%s", err, out.String())
			}
			if len(res.BW) != 1 || res.BW[0].Size != uint64(c.size) || res.BW[0].Iters != 10 {
				t.Fatalf("client report %+v", res.BW)
			}
			if res.Remote.QPN != 0x11 || res.Remote.Addr() != netip.MustParseAddr("198.18.0.12") {
				t.Fatalf("remote %+v", res.Remote)
			}
			if res.Mismatches != c.bad || res.Checked == 0 {
				t.Fatalf("checks %d, mismatches %d", res.Checked, res.Mismatches)
			}
		})
	}
}

// TestExchangeRejects feeds bad peer messages to each step: old or
// garbled versions, unusable page and cache line sizes are errors; an
// invalid peer MTU leaves this side's.
func TestExchangeRejects(t *testing.T) {
	// step runs f as the server against a peer that sends msg (and reads
	// whatever the server answers).
	step := func(msg []byte, f func(x *Exchange) error) error {
		a, b := net.Pipe()
		defer a.Close()
		go io.Copy(io.Discard, b)
		go b.Write(msg)
		defer b.Close()
		return f(NewExchange(a, false, time.Now().Add(5*time.Second)))
	}
	version := func(v string) []byte { b := make([]byte, versionLen); copy(b, v); return b }
	for _, v := range []string{"5.60", "abc", "", "4.6"} {
		if err := step(version(v), func(x *Exchange) error { return x.Versions() }); err == nil {
			t.Errorf("version %q accepted", v)
		}
	}
	if err := step(version("6.06-rc1"), func(x *Exchange) error { return x.Versions() }); err != nil {
		t.Errorf("version 6.06-rc1: %v", err)
	}
	for _, bad := range [][]byte{{0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 64}, {0, 0, 0x10, 0, 0, 0, 0, 96}} {
		if err := step(bad, func(x *Exchange) error { _, _, err := x.SysData(4096, 64); return err }); err == nil {
			t.Errorf("sys data % x accepted", bad)
		}
	}
	var got int
	if err := step([]byte("9\x00"), func(x *Exchange) error { var err error; got, err = x.MTU(3); return err }); err != nil || got != 3 {
		t.Errorf("peer MTU 9: got %d, %v", got, err)
	}
	if err := step([]byte("2\x00"), func(x *Exchange) error { var err error; got, err = x.MTU(3); return err }); err != nil || got != 2 {
		t.Errorf("peer MTU 2: got %d, %v", got, err)
	}
}

// TestBinaryRecord checks the rdma_cm exchange's key record: struct
// pingpong_dest with big-endian integers at its x86-64 offsets, round
// trip, and values out of their fields' range refused.
func TestBinaryRecord(t *testing.T) {
	d := Dest{LID: 0x1234, OutReads: 16, QPN: 0x11, PSN: 0xabcdef, RKey: 0x1f00, VAddr: 0x5566778899aa,
		GID: netip.MustParseAddr("::ffff:198.18.0.1").As16(), SRQN: 7}
	b := d.MarshalBinary()
	want := map[int][]byte{0: {0, 0, 0x12, 0x34}, 4: {0, 0, 0, 16}, 8: {0, 0, 0, 0x11}, 12: {0, 0xab, 0xcd, 0xef},
		16: {0, 0, 0x1f, 0}, 24: {0, 0, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa}, 44: {198, 18, 0, 1}, 48: {0, 0, 0, 7}}
	for off, w := range want {
		if !bytes.Equal(b[off:off+len(w)], w) {
			t.Errorf("offset %d: % x, want % x", off, b[off:off+len(w)], w)
		}
	}
	got, err := ParseBinary(b)
	if err != nil || got != d {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for _, bad := range []func([]byte){
		func(b []byte) { b[8] = 1 },  // QPN beyond 24 bits
		func(b []byte) { b[12] = 1 }, // PSN beyond 24 bits
		func(b []byte) { b[1] = 1 },  // LID beyond 16 bits
	} {
		c := d.MarshalBinary()
		bad(c)
		if _, err := ParseBinary(c); err == nil {
			t.Errorf("% x accepted", c[:16])
		}
	}
	if _, err := ParseBinary(b[:55]); err == nil {
		t.Error("55 bytes accepted")
	}
}
