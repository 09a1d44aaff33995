package perftest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Version is the version string rxego sends in the exchange: that of
// Debian 12's perftest 4.5-0.17 (PACKAGE_VERSION 6.06). Peers refuse
// anything below 5.70, and the value picks the exchange's variants (an
// 8-byte iteration count in the reports from 5.33 on, a 2-byte MTU from
// 5.31 on), so rxego claims exactly what its peer expects.
const Version = "6.06"

// Sizes of the exchange's messages.
const (
	versionLen = 16  // MAX_VERSION
	recordLen  = 108 // KEY_MSG_SIZE_GID: the key record with its NUL
	// binaryRecordLen is sizeof(struct pingpong_dest) on x86-64, the key
	// record of the rdma_cm exchange and the size of its receive buffer.
	binaryRecordLen = 56
	reportLen       = 8 // each of the five report fields
	doneMsg         = "done\x00"
)

// minPeerVersion is the oldest version perftest itself accepts.
const minPeerVersion = 5.70

// Dest is one key record: what a side tells the other about one QP
// (perftest's struct pingpong_dest as it travels).
type Dest struct {
	LID      uint16
	OutReads uint16 // READ/atomic requests this side accepts outstanding
	QPN      uint32
	PSN      uint32
	RKey     uint32
	VAddr    uint64 // where the peer may write, read or apply atomics
	GID      [16]byte
	SRQN     uint32
}

// Addr returns the GID as an IP address (IPv4-mapped GIDs unmapped).
func (d Dest) Addr() netip.Addr { return netip.AddrFrom16(d.GID).Unmap() }

// MarshalRecord formats d as perftest's ethernet_write_keys does:
// "%04x:%04x:%06x:%06x:%08x:%016llx:" then the GID bytes as 16 "%02x:" and
// "%08x:" for the SRQ number, NUL-padded to 108 bytes.
func (d Dest) MarshalRecord() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%04x:%04x:%06x:%06x:%08x:%016x:", d.LID, d.OutReads, d.QPN, d.PSN, d.RKey, d.VAddr)
	for _, g := range d.GID {
		fmt.Fprintf(&b, "%02x:", g)
	}
	fmt.Fprintf(&b, "%08x:", d.SRQN)
	out := make([]byte, recordLen)
	copy(out, b.String())
	return out
}

// ParseRecord parses a 108-byte key record. It is stricter than perftest
// (every field must be hex and in range, the GID must have 16 bytes) so
// that a malformed record is an error rather than a wrong connection.
func ParseRecord(b []byte) (Dest, error) {
	if len(b) != recordLen {
		return Dest{}, fmt.Errorf("perftest: key record of %d bytes, want %d", len(b), recordLen)
	}
	s := string(b)
	if i := strings.IndexByte(s, 0); i >= 0 {
		if strings.Trim(s[i:], "\x00") != "" {
			return Dest{}, fmt.Errorf("perftest: key record has data after its NUL: %q", s)
		}
		s = s[:i]
	}
	bad := func(why string) error { return fmt.Errorf("perftest: malformed key record %q: %s", s, why) }
	if !strings.HasSuffix(s, ":") {
		return Dest{}, bad("no trailing ':'")
	}
	f := strings.Split(strings.TrimSuffix(s, ":"), ":")
	if len(f) != 6+16+1 {
		return Dest{}, bad(fmt.Sprintf("%d fields, want 23", len(f)))
	}
	num := func(i, bits int) (uint64, error) {
		v, err := strconv.ParseUint(f[i], 16, bits)
		if err != nil {
			return 0, bad(fmt.Sprintf("field %d %q", i+1, f[i]))
		}
		return v, nil
	}
	var v [23]uint64
	for i := range v {
		bits := 8 // the GID bytes
		switch {
		case i < 2:
			bits = 16 // LID, out_reads
		case i < 4:
			bits = 24 // QPN, PSN
		case i == 4, i == 22:
			bits = 32 // rkey, SRQ number
		case i == 5:
			bits = 64 // vaddr
		}
		var err error
		if v[i], err = num(i, bits); err != nil {
			return Dest{}, err
		}
	}
	d := Dest{LID: uint16(v[0]), OutReads: uint16(v[1]), QPN: uint32(v[2]), PSN: uint32(v[3]),
		RKey: uint32(v[4]), VAddr: v[5], SRQN: uint32(v[22])}
	for i := range d.GID {
		d.GID[i] = byte(v[6+i])
	}
	return d, nil
}

// MarshalBinary lays d out as perftest's rdma_write_keys sends it: struct
// pingpong_dest with every integer big-endian (lid, out_reads, qpn, psn,
// rkey as 4-byte ints, 4 bytes of padding, the 8-byte vaddr, the GID, srqn
// and gid_index, which rxego leaves 0).
func (d Dest) MarshalBinary() []byte {
	b := make([]byte, binaryRecordLen)
	be := binary.BigEndian
	be.PutUint32(b[0:], uint32(d.LID))
	be.PutUint32(b[4:], uint32(d.OutReads))
	be.PutUint32(b[8:], d.QPN)
	be.PutUint32(b[12:], d.PSN)
	be.PutUint32(b[16:], d.RKey)
	be.PutUint64(b[24:], d.VAddr)
	copy(b[32:48], d.GID[:])
	be.PutUint32(b[48:], d.SRQN)
	return b
}

// ParseBinary parses a key record of the rdma_cm exchange (see
// MarshalBinary). Values out of their field's range are an error.
func ParseBinary(b []byte) (Dest, error) {
	if len(b) != binaryRecordLen {
		return Dest{}, fmt.Errorf("perftest: binary key record of %d bytes, want %d", len(b), binaryRecordLen)
	}
	be := binary.BigEndian
	lid, out := be.Uint32(b[0:]), be.Uint32(b[4:])
	d := Dest{LID: uint16(lid), OutReads: uint16(out), QPN: be.Uint32(b[8:]), PSN: be.Uint32(b[12:]),
		RKey: be.Uint32(b[16:]), VAddr: be.Uint64(b[24:]), SRQN: be.Uint32(b[48:])}
	copy(d.GID[:], b[32:48])
	if lid > 0xffff || out > 0xffff || d.QPN > 0xffffff || d.PSN > 0xffffff {
		return Dest{}, fmt.Errorf("perftest: malformed binary key record: lid %#x, out_reads %d, qpn %#x, psn %#x",
			lid, out, d.QPN, d.PSN)
	}
	return d, nil
}

// Report is the bandwidth report the two sides of a write, read or atomic
// BW test swap at the end (perftest's struct bw_report_data as it
// travels: five big-endian 8-byte fields).
type Report struct {
	Size    uint64
	Iters   uint64
	BWPeak  float64 // MB/s
	BWAvg   float64 // MB/s
	MsgRate float64 // Mpps
}

// Exchange is perftest's out-of-band exchange: over a TCP connection by
// default, or with -R over SENDs on an rdma_cm-connected RC QP. Every step
// is symmetric: the client writes first, then reads; the server reads
// first, then writes (ctx_xchg_data and ctx_hand_shake).
type Exchange struct {
	ch     channel
	client bool
	// binaryKeys selects the key record format: perftest's rdma_cm
	// exchange sends struct pingpong_dest itself (rdma_write_keys), the
	// TCP one a text record (ethernet_write_keys).
	binaryKeys bool
	// PeerVersion is the version string the peer sent.
	PeerVersion string
}

// channel carries the exchange's messages, each read whole.
type channel interface {
	write(msg []byte) error
	read(n int) ([]byte, error)
}

// NewExchange wraps an established TCP connection; client says which side
// writes first. Every read and write must finish by deadline (zero: none).
func NewExchange(c net.Conn, client bool, deadline time.Time) *Exchange {
	return &Exchange{ch: &tcpChannel{conn: c, deadline: deadline}, client: client}
}

// tcpChannel is the exchange over TCP (ethernet_write_data and
// ethernet_read_data).
type tcpChannel struct {
	conn     net.Conn
	deadline time.Time
}

// write sends msg in one write, as perftest's read() expects it whole.
func (c *tcpChannel) write(msg []byte) error {
	if !c.deadline.IsZero() {
		c.conn.SetDeadline(c.deadline)
	}
	if _, err := c.conn.Write(msg); err != nil {
		return fmt.Errorf("perftest: writing %d bytes to the peer: %w", len(msg), err)
	}
	return nil
}

func (c *tcpChannel) read(n int) ([]byte, error) {
	if !c.deadline.IsZero() {
		c.conn.SetDeadline(c.deadline)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(c.conn, b); err != nil {
		return nil, fmt.Errorf("perftest: reading %d bytes from the peer: %w", n, err)
	}
	return b, nil
}

// swap sends mine and receives len(mine) bytes, in the order of the role.
func (x *Exchange) swap(mine []byte) ([]byte, error) {
	return x.swapHold(mine, len(mine), nil)
}

// swapHold is swap receiving n bytes, with hold (if not nil) called at the
// moment the peer is sure to be blocked waiting for this side: a client
// calls it before writing; a server after reading and before answering.
func (x *Exchange) swapHold(mine []byte, n int, hold func() error) ([]byte, error) {
	if x.client {
		if hold != nil {
			if err := hold(); err != nil {
				return nil, err
			}
		}
		if err := x.ch.write(mine); err != nil {
			return nil, err
		}
		return x.ch.read(n)
	}
	theirs, err := x.ch.read(n)
	if err != nil {
		return nil, err
	}
	if hold != nil {
		if err := hold(); err != nil {
			return nil, err
		}
	}
	return theirs, x.ch.write(mine)
}

// Versions swaps the 16-byte version strings and checks the peer's, as
// exchange_versions and check_version_compatibility do.
func (x *Exchange) Versions() error {
	mine := make([]byte, versionLen)
	copy(mine, Version)
	theirs, err := x.swap(mine)
	if err != nil {
		return err
	}
	v := strings.TrimRight(string(theirs), "\x00")
	if i := strings.IndexByte(v, 0); i >= 0 {
		v = v[:i]
	}
	x.PeerVersion = v
	f, err := strconv.ParseFloat(leadingFloat(v), 64)
	if err != nil || f < minPeerVersion {
		return fmt.Errorf("perftest: peer version %q; need %.2f or newer", v, minPeerVersion)
	}
	return nil
}

// leadingFloat returns the longest prefix of s that looks like a decimal
// number, as atof reads it ("6.06" of "6.06-rc1").
func leadingFloat(s string) string {
	end := 0
	dot := false
	for end < len(s) && (s[end] >= '0' && s[end] <= '9' || s[end] == '.' && !dot) {
		dot = dot || s[end] == '.'
		end++
	}
	return s[:end]
}

// SysData swaps the page size (the cycle buffer) and the cache line size,
// 4-byte big-endian each, and returns the larger of each pair, which both
// sides then use (check_sys_data).
func (x *Exchange) SysData(pageSize, cacheLine int) (int, int, error) {
	out := [2]int{pageSize, cacheLine}
	for i, v := range out {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(v))
		theirs, err := x.swap(b[:])
		if err != nil {
			return 0, 0, err
		}
		r := int(int32(binary.BigEndian.Uint32(theirs)))
		if r > v {
			out[i] = r
		}
	}
	if out[0] <= 0 || out[0] > 1<<24 || out[1] <= 0 || out[1] > 1<<16 || out[0]%out[1] != 0 {
		return 0, 0, fmt.Errorf("perftest: peer's page size %d and cache line %d are not usable", out[0], out[1])
	}
	return out[0], out[1], nil
}

// MTU swaps the path MTU as a 2-byte decimal ibv_mtu value ("3\0" for
// 1024) and returns the smaller valid one (check_mtu).
func (x *Exchange) MTU(mine int) (int, error) {
	if mine < 1 || mine > 5 {
		return 0, fmt.Errorf("perftest: MTU code %d", mine)
	}
	b := []byte{byte('0' + mine), 0}
	theirs, err := x.swap(b)
	if err != nil {
		return 0, err
	}
	r, err := strconv.Atoi(strings.TrimRight(string(theirs), "\x00"))
	if err == nil && r >= 1 && r <= 5 && r < mine {
		return r, nil
	}
	return mine, nil
}

// HandShake swaps one key record (ctx_hand_shake).
func (x *Exchange) HandShake(mine Dest) (Dest, error) {
	return x.HandShakeHold(mine, nil)
}

// HandShakeHold is HandShake with hold called at the moment the peer is
// sure to be blocked waiting for this side: a client calls it before
// writing its record; a server after reading the peer's record and before
// answering. Tests use it to inspect the peer's memory at the end of a run.
func (x *Exchange) HandShakeHold(mine Dest, hold func() error) (Dest, error) {
	if x.binaryKeys {
		theirs, err := x.swapHold(mine.MarshalBinary(), binaryRecordLen, hold)
		if err != nil {
			return Dest{}, err
		}
		return ParseBinary(theirs)
	}
	theirs, err := x.swapHold(mine.MarshalRecord(), recordLen, hold)
	if err != nil {
		return Dest{}, err
	}
	return ParseRecord(theirs)
}

// Reports swaps bandwidth reports field by field (xchg_bw_reports); the
// iteration count is 8 bytes for peers of version 5.33 and newer, 4 before.
func (x *Exchange) Reports(mine Report) (Report, error) {
	wide := true
	if f, err := strconv.ParseFloat(leadingFloat(x.PeerVersion), 64); err == nil && f < 5.33 {
		wide = false
	}
	var r Report
	u64 := func(v uint64, n int) ([]byte, error) {
		b := make([]byte, 8)
		binary.BigEndian.PutUint64(b, v)
		return x.swap(b[8-n:])
	}
	theirs, err := u64(mine.Size, 8)
	if err != nil {
		return r, err
	}
	r.Size = binary.BigEndian.Uint64(theirs)
	if wide {
		if theirs, err = u64(mine.Iters, 8); err != nil {
			return r, err
		}
		r.Iters = binary.BigEndian.Uint64(theirs)
	} else {
		if theirs, err = u64(mine.Iters, 4); err != nil {
			return r, err
		}
		r.Iters = uint64(binary.BigEndian.Uint32(theirs))
	}
	for _, p := range []struct {
		mine float64
		dst  *float64
	}{{mine.BWPeak, &r.BWPeak}, {mine.BWAvg, &r.BWAvg}, {mine.MsgRate, &r.MsgRate}} {
		if theirs, err = u64(math.Float64bits(p.mine), 8); err != nil {
			return r, err
		}
		*p.dst = math.Float64frombits(binary.BigEndian.Uint64(theirs))
	}
	return r, nil
}

// Close ends the exchange as ctx_close_connection does: one more key
// record each way, then over TCP "done" with its NUL (which nobody reads).
func (x *Exchange) Close(mine Dest, hold func() error) error {
	if _, err := x.HandShakeHold(mine, hold); err != nil {
		return err
	}
	if x.binaryKeys {
		return nil
	}
	if err := x.ch.write([]byte(doneMsg)); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}
