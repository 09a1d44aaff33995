package capfile

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/rxego/rxego/icrc"
	"github.com/rxego/rxego/internal/inetsum"
)

// segFrame builds the Ethernet/IPv4/UDP frame of one RoCE packet (BTH of
// opcode op for QP 0x11 at psn, pay payload bytes, ICRC) with IP ID id,
// as the kernel sends a segment.
func segFrame(op byte, psn uint32, pay int, id uint16) []byte {
	roce := make([]byte, bthLen+pay+icrc.Len)
	roce[0], roce[2], roce[3] = op, 0xff, 0xff
	binary.BigEndian.PutUint32(roce[4:], 0x11)
	binary.BigEndian.PutUint32(roce[8:], psn)
	for i := bthLen; i < bthLen+pay; i++ {
		roce[i] = byte(i)
	}
	b := make([]byte, 14+20+8, 14+20+8+len(roce))
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:34]
	ip[0], ip[6], ip[8], ip[9] = 0x45, 0x40, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(roce)))
	binary.BigEndian.PutUint16(ip[4:], id)
	copy(ip[12:], []byte{127, 0, 0, 3, 127, 0, 0, 2})
	u := b[34:42]
	binary.BigEndian.PutUint16(u[0:], 49152)
	binary.BigEndian.PutUint16(u[2:], RoCEPort)
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(roce)))
	b = append(b, roce...)
	crc, _ := icrc.FromHeaders(ip, u, b[42:])
	icrc.Put(b[42:], crc)
	binary.BigEndian.PutUint16(ip[10:], inetsum.IPv4(ip))
	binary.BigEndian.PutUint16(b[40:], inetsum.UDP(ip[12:20], b[34:]))
	return b
}

// glue makes the datagram a packet socket sees on loopback of the
// segments' frames: the first's headers with the lengths of the whole.
func glue(segs [][]byte) []byte {
	whole := bytes.Clone(segs[0][:42])
	for _, s := range segs {
		whole = append(whole, s[42:]...)
	}
	binary.BigEndian.PutUint16(whole[14+2:], uint16(len(whole)-14))
	binary.BigEndian.PutUint16(whole[34+4:], uint16(len(whole)-34))
	return whole
}

// TestSplitGSO builds the segments the kernel would send for a GSO
// datagram of three 1024-byte SEND packets and an ACK (IDs 100..103),
// glues them into the datagram a packet socket sees on loopback, and
// checks that SplitGSO gives back the segments byte for byte and that
// InferGSOSize finds the segment size.
func TestSplitGSO(t *testing.T) {
	segs := [][]byte{segFrame(0x00, 7, 1024, 100), segFrame(0x01, 8, 1024, 101), segFrame(0x02, 9, 1024, 102), segFrame(0x11, 3, 4, 103)}
	size := len(segs[0]) - 42
	whole := glue(segs)
	binary.BigEndian.PutUint16(whole[40:], 0x1234) // a partial sum, as on loopback
	got := SplitGSO(layers.LinkTypeEthernet, whole, size)
	if len(got) != len(segs) {
		t.Fatalf("%d segments, want %d", len(got), len(segs))
	}
	for i := range segs {
		if !bytes.Equal(got[i], segs[i]) {
			t.Errorf("segment %d differs:\n got %x\nwant %x", i+1, got[i][:48], segs[i][:48])
		}
	}
	if s := InferGSOSize(layers.LinkTypeEthernet, whole); s != size {
		t.Errorf("inferred segment size %d, want %d", s, size)
	}
	if s := InferGSOSize(layers.LinkTypeEthernet, segs[0]); s != 0 {
		t.Errorf("one packet: inferred segment size %d", s)
	}
	if SplitGSO(layers.LinkTypeEthernet, segs[0], size) != nil {
		t.Error("one packet split")
	}
}

// TestInferGSOSizeLargest infers the segment size of datagrams of the
// largest segments rxego sends (4096 payload bytes behind a BTH and a
// RETH-sized header), inside the sizes InferGSOSize tries.
func TestInferGSOSizeLargest(t *testing.T) {
	for _, pay := range []int{4096, 4096 + 16} {
		segs := [][]byte{segFrame(0x01, 7, pay, 9), segFrame(0x01, 8, pay, 10), segFrame(0x02, 9, pay, 11)}
		whole := glue(segs)
		if s, want := InferGSOSize(layers.LinkTypeEthernet, whole), len(segs[0])-42; s != want {
			t.Errorf("%d-byte payloads: inferred segment size %d, want %d", pay, s, want)
		}
	}
}
