// Package capfile reads the project's capture files (pcap or pcapng) and
// yields the RoCEv2 frames in them with their IP and UDP headers, for tests
// and tools that check the wire layer against real traffic.
package capfile

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"time"

	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// RoCEPort is the IANA UDP port of RoCEv2.
const RoCEPort = 4791

// Frame is one RoCEv2 frame of a capture.
type Frame struct {
	Number   int // 1-based frame number in the file
	Time     time.Time
	Data     []byte // the whole frame as captured
	IPOffset int    // where IP starts in Data (after the link header)
	IP       []byte // IPv4 or IPv6 header
	UDP      []byte // UDP header
	RoCE     []byte // UDP payload: BTH .. ICRC
}

// Each calls fn for every frame of the capture file at path that carries
// UDP to or from port 4791. Frames that are not Ethernet/IP/UDP are skipped.
func Each(path string, fn func(Frame) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	magic, err := br.Peek(4)
	if err != nil {
		return err
	}
	var next func() ([]byte, time.Time, error)
	var link layers.LinkType
	if binary.LittleEndian.Uint32(magic) == 0x0a0d0d0a {
		r, err := pcapgo.NewNgReader(br, pcapgo.DefaultNgReaderOptions)
		if err != nil {
			return err
		}
		link = r.LinkType()
		next = func() ([]byte, time.Time, error) {
			d, ci, err := r.ReadPacketData()
			return d, ci.Timestamp, err
		}
	} else {
		r, err := pcapgo.NewReader(br)
		if err != nil {
			return err
		}
		link = r.LinkType()
		next = func() ([]byte, time.Time, error) {
			d, ci, err := r.ReadPacketData()
			return d, ci.Timestamp, err
		}
	}
	for n := 1; ; n++ {
		data, ts, err := next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		fr, ok := Split(link, data)
		if !ok {
			continue
		}
		fr.Number, fr.Time = n, ts
		if err := fn(fr); err != nil {
			return err
		}
	}
}

// Split finds the IP, UDP and RoCE parts of an Ethernet (or Linux cooked,
// or raw IP) frame; ok is false when it is not UDP to or from port 4791.
func Split(link layers.LinkType, data []byte) (Frame, bool) {
	var off int
	var etype uint16
	switch link {
	case layers.LinkTypeEthernet:
		if len(data) < 14 {
			return Frame{}, false
		}
		etype, off = binary.BigEndian.Uint16(data[12:14]), 14
		for etype == 0x8100 && len(data) >= off+4 {
			etype, off = binary.BigEndian.Uint16(data[off+2:off+4]), off+4
		}
	case layers.LinkTypeLinuxSLL:
		if len(data) < 16 {
			return Frame{}, false
		}
		etype, off = binary.BigEndian.Uint16(data[14:16]), 16
	case layers.LinkTypeRaw, layers.LinkTypeIPv4, layers.LinkTypeIPv6:
		if len(data) < 1 {
			return Frame{}, false
		}
		etype = map[byte]uint16{4: 0x0800, 6: 0x86dd}[data[0]>>4]
	default:
		return Frame{}, false
	}
	var ip []byte
	var proto byte
	var ipLen int
	switch etype {
	case 0x0800:
		if len(data) < off+20 {
			return Frame{}, false
		}
		ihl := int(data[off]&0xf) * 4
		total := int(binary.BigEndian.Uint16(data[off+2:]))
		if data[off]>>4 != 4 || ihl < 20 || len(data) < off+total || total < ihl {
			return Frame{}, false
		}
		ip, proto, ipLen = data[off:off+ihl], data[off+9], total
	case 0x86dd:
		if len(data) < off+40 || data[off]>>4 != 6 {
			return Frame{}, false
		}
		ip, proto, ipLen = data[off:off+40], data[off+6], 40+int(binary.BigEndian.Uint16(data[off+4:]))
		if len(data) < off+ipLen {
			return Frame{}, false
		}
	default:
		return Frame{}, false
	}
	if proto != 17 {
		return Frame{}, false
	}
	u := data[off+len(ip) : off+ipLen]
	if len(u) < 8 {
		return Frame{}, false
	}
	sport, dport := binary.BigEndian.Uint16(u[0:]), binary.BigEndian.Uint16(u[2:])
	ulen := int(binary.BigEndian.Uint16(u[4:]))
	if (sport != RoCEPort && dport != RoCEPort) || ulen < 8 || ulen > len(u) {
		return Frame{}, false
	}
	return Frame{Data: data, IPOffset: off, IP: ip, UDP: u[:8], RoCE: u[8:ulen]}, true
}
