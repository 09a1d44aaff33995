package trace

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// ReadFile calls fn with the record of every RoCEv2 frame (UDP to or from
// port 4791) of the pcap or pcapng file at path, in file order. Other
// frames are skipped; malformed RoCE frames give records with Error set.
// It stops at the first error of fn or of the file; the file's errors
// name it (path: ...) and match ErrEmpty, ErrNotCapture or ErrTruncated
// with errors.Is.
func ReadFile(path string, fn func(Record) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = Read(f, fn)
	var fe *FileError
	if errors.As(err, &fe) {
		return fmt.Errorf("%s: %w", path, err)
	}
	return err
}

// Errors of the capture file itself, wrapped in a *FileError.
var (
	ErrEmpty      = errors.New("empty file, not a capture")
	ErrNotCapture = errors.New("not a pcap or pcapng file")
	ErrTruncated  = errors.New("truncated")
)

// FileError is an error of the capture file (not of the callback): what
// is wrong and where.
type FileError struct {
	Err    error  // ErrEmpty, ErrNotCapture or ErrTruncated
	Detail string // where, or what was found instead
	Cause  error  // the reader's own error, if any
}

func (e *FileError) Error() string {
	s := e.Err.Error()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Cause != nil && !errors.Is(e.Cause, io.ErrUnexpectedEOF) {
		s += " (" + e.Cause.Error() + ")"
	}
	return s
}

// Unwrap lets errors.Is match the kind and the cause.
func (e *FileError) Unwrap() []error { return []error{e.Err, e.Cause} }

// Read is ReadFile for a capture already open as r.
func Read(r io.Reader, fn func(Record) error) error {
	_, err := ReadStats(r, fn)
	return err
}

// CaptureStats is what a pcapng file says of its capture in its
// interface statistics blocks (pcap files say nothing).
type CaptureStats struct {
	// Known reports whether some interface's statistics carried a drop
	// count.
	Known bool
	// Dropped is the sum over the interfaces of the last drop count
	// each reported: frames the capturing side lost (its buffer full),
	// which the file lacks, so a trace with drops can show losses that
	// never happened on the wire.
	Dropped uint64
}

// ReadStats is Read that also returns what the file says of the frames
// its capture dropped, read as far as Read got.
func ReadStats(r io.Reader, fn func(Record) error) (CaptureStats, error) {
	dropped := map[int]uint64{}
	src, err := open(r, func(iface int, st pcapgo.NgInterfaceStatistics) {
		if st.PacketsDropped != pcapgo.NgNoValue64 {
			dropped[iface] = st.PacketsDropped
		}
	})
	stats := func() CaptureStats {
		var cs CaptureStats
		for _, d := range dropped {
			cs.Known, cs.Dropped = true, cs.Dropped+d
		}
		return cs
	}
	if err != nil {
		return stats(), err
	}
	for n := 1; ; n++ {
		data, ci, err := src.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return stats(), nil
		}
		if err != nil {
			where := fmt.Sprintf("the file ends inside frame %d", n)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				where = fmt.Sprintf("frame %d is damaged", n)
			}
			return stats(), &FileError{Err: ErrTruncated, Detail: where, Cause: err}
		}
		rec, ok := FromFrame(n, ci.Timestamp, src.linkType(ci), data)
		if !ok {
			continue
		}
		if err := fn(rec); err != nil {
			return stats(), err
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

// pcapMagics are the first four bytes of a pcap file read little-endian:
// microsecond and nanosecond resolution, in either byte order.
var pcapMagics = []uint32{0xa1b2c3d4, 0xd4c3b2a1, 0xa1b23c4d, 0x4d3cb2a1}

// open detects the file format from its first bytes; a pcapng file's
// interface statistics go to onStats as they are read.
func open(r io.Reader, onStats func(int, pcapgo.NgInterfaceStatistics)) (source, error) {
	br := bufio.NewReader(r)
	magic, err := br.Peek(4)
	switch {
	case len(magic) == 0 && errors.Is(err, io.EOF):
		return source{}, &FileError{Err: ErrEmpty}
	case len(magic) < 4 && (err == nil || errors.Is(err, io.EOF)):
		return source{}, &FileError{Err: ErrTruncated, Detail: fmt.Sprintf("only %d bytes", len(magic))}
	case err != nil:
		return source{}, err
	}
	le := binary.LittleEndian.Uint32(magic)
	if le != pcapngMagic && !slices.Contains(pcapMagics, le) {
		head, _ := br.Peek(16)
		return source{}, &FileError{Err: ErrNotCapture, Detail: fmt.Sprintf("it starts with %q", head)}
	}
	if le == pcapngMagic {
		opts := pcapgo.DefaultNgReaderOptions
		opts.StatisticsCallback = onStats
		ng, err := pcapgo.NewNgReader(br, opts)
		if err != nil {
			return source{}, &FileError{Err: ErrTruncated, Detail: "in the pcapng section header", Cause: err}
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
		return source{}, &FileError{Err: ErrTruncated, Detail: "in the pcap file header", Cause: err}
	}
	return source{pr, func(gopacket.CaptureInfo) layers.LinkType { return pr.LinkType() }}, nil
}
