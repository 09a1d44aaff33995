package trace

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"os"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// ReadFile calls fn with the record of every RoCEv2 frame (UDP to or from
// port 4791) of the pcap or pcapng file at path, in file order. Other
// frames are skipped; malformed RoCE frames give records with Error set.
// It stops at the first error of fn or of the file.
func ReadFile(path string, fn func(Record) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return Read(f, fn)
}

// Read is ReadFile for a capture already open as r.
func Read(r io.Reader, fn func(Record) error) error {
	src, err := open(r)
	if err != nil {
		return err
	}
	for n := 1; ; n++ {
		data, ci, err := src.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		rec, ok := FromFrame(n, ci.Timestamp, src.linkType(ci), data)
		if !ok {
			continue
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
}

// source is a capture file reader of either format.
type source struct {
	gopacket.PacketDataSource
	linkType func(gopacket.CaptureInfo) layers.LinkType
}

// pcapngMagic is the block type of a pcapng Section Header Block; pcap
// files start with 0xa1b2c3d4 or 0xa1b23c4d in either byte order instead.
const pcapngMagic = 0x0a0d0d0a

// open detects the file format from its first bytes.
func open(r io.Reader) (source, error) {
	br := bufio.NewReader(r)
	magic, err := br.Peek(4)
	if err != nil {
		return source{}, err
	}
	if binary.LittleEndian.Uint32(magic) == pcapngMagic {
		ng, err := pcapgo.NewNgReader(br, pcapgo.DefaultNgReaderOptions)
		if err != nil {
			return source{}, err
		}
		// Each pcapng interface has its own link type.
		return source{ng, func(ci gopacket.CaptureInfo) layers.LinkType {
			if iface, err := ng.Interface(ci.InterfaceIndex); err == nil {
				return iface.LinkType
			}
			return ng.LinkType()
		}}, nil
	}
	pr, err := pcapgo.NewReader(br)
	if err != nil {
		return source{}, err
	}
	return source{pr, func(gopacket.CaptureInfo) layers.LinkType { return pr.LinkType() }}, nil
}
