// Package pingpong is rxego's drop-in peer for rdma-core's
// ibv_rc_pingpong, ibv_uc_pingpong, ibv_ud_pingpong and ibv_srq_pingpong:
// the same TCP exchange of QP numbers, PSNs and GIDs, the same message
// pattern and the same printed results, as server or client.
package pingpong

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
)

// recordLen is the size of one "LID:QPN:PSN:GID" record with its NUL.
const recordLen = 4 + 1 + 6 + 1 + 6 + 1 + 32 + 1

// srqRecords is how many records ibv_srq_pingpong exchanges (its MAX_QP);
// the ones past the QP count are all zero.
const srqRecords = 256

// Dest is what one side tells the other: ibv_*_pingpong's pingpong_dest.
type Dest struct {
	LID uint16
	QPN uint32
	PSN uint32
	GID [16]byte
}

// Addr returns the GID as an IP address (IPv4-mapped GIDs unmapped).
func (d Dest) Addr() netip.Addr { return netip.AddrFrom16(d.GID).Unmap() }

// encode writes the record as the C tools do: "%04x:%06x:%06x:%s" with the
// GID as 32 hex digits in byte order, then a NUL.
func (d Dest) encode() []byte {
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, d.QPN, d.PSN, hex.EncodeToString(d.GID[:]))
	return append([]byte(s), 0)
}

func parseDest(b []byte) (Dest, error) {
	s := strings.TrimRight(string(b), "\x00")
	parts := strings.Split(s, ":")
	if len(parts) != 4 || len(parts[3]) != 32 {
		return Dest{}, fmt.Errorf("pingpong: malformed peer record %q", s)
	}
	var d Dest
	lid, err1 := strconv.ParseUint(parts[0], 16, 16)
	qpn, err2 := strconv.ParseUint(parts[1], 16, 24)
	psn, err3 := strconv.ParseUint(parts[2], 16, 24)
	gid, err4 := hex.DecodeString(parts[3])
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			return Dest{}, fmt.Errorf("pingpong: malformed peer record %q: %v", s, err)
		}
	}
	d.LID, d.QPN, d.PSN = uint16(lid), uint32(qpn), uint32(psn)
	copy(d.GID[:], gid)
	return d, nil
}

// writeDests sends n records (padding with zero records up to n).
func writeDests(w io.Writer, ds []Dest, n int) error {
	buf := make([]byte, 0, n*recordLen)
	for i := 0; i < n; i++ {
		var d Dest
		if i < len(ds) {
			d = ds[i]
		}
		buf = append(buf, d.encode()...)
	}
	_, err := w.Write(buf)
	return err
}

// readDests reads n records and returns the first k.
func readDests(r io.Reader, n, k int) ([]Dest, error) {
	buf := make([]byte, n*recordLen)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("pingpong: reading peer's address: %w", err)
	}
	out := make([]Dest, k)
	for i := range out {
		d, err := parseDest(buf[i*recordLen : (i+1)*recordLen])
		if err != nil {
			return nil, err
		}
		out[i] = d
	}
	return out, nil
}

// GIDString formats a GID as ibv_*_pingpong prints it (inet_ntop of the
// 16 bytes, e.g. ::ffff:198.18.0.1).
func GIDString(g [16]byte) string { return netip.AddrFrom16(g).String() }

// SwapRecord is ibv_rc_pingpong's whole exchange for one QP over c, for a
// peer that has nothing to do between reading and writing (rxego probe):
// a client writes its record, reads the server's and sends "done"; a
// server reads, writes, and waits for "done".
func SwapRecord(c io.ReadWriter, client bool, mine Dest) (Dest, error) {
	if client {
		if err := writeDests(c, []Dest{mine}, 1); err != nil {
			return Dest{}, err
		}
		theirs, err := readDests(c, 1, 1)
		if err != nil {
			return Dest{}, err
		}
		_, err = c.Write([]byte(doneMsg))
		return theirs[0], err
	}
	theirs, err := readDests(c, 1, 1)
	if err != nil {
		return Dest{}, err
	}
	if err := writeDests(c, []Dest{mine}, 1); err != nil {
		return Dest{}, err
	}
	if _, err := io.ReadFull(c, make([]byte, len(doneMsg))); err != nil {
		return Dest{}, fmt.Errorf("pingpong: waiting for the client's done: %w", err)
	}
	return theirs[0], nil
}

// doneMsg ends the client's side of the exchange, with its NUL.
const doneMsg = "done\x00"
