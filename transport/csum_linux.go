package transport

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"strconv"

	"github.com/rxego/rxego/internal/inetsum"
)

// UDP checksum errors.
//
// A datagram with a bad UDP checksum never reaches a UDP socket: the
// kernel drops it, counts it in the namespace's Udp InCsumErrors (Udp6
// for IPv6) and in the socket's drop count, which SO_RXQ_OVFL reports with
// the next datagram, the count rxego's overflow drops come from. To tell
// the two apart, the socket's new drops are split: as many as the
// namespace's InCsumErrors rose since the last split (at most all of
// them) are DropBadUDPChecksum, the rest DropOverflow. The counter is
// per namespace, so a checksum error on another socket of the namespace
// can take the place of an overflow of this one if both happen between
// two splits; the total stays exact. In raw mode the raw socket sees the
// datagram before UDP does, and the checksum is checked here
// (udpChecksumOK).

// csumCounter reads one network namespace's UDP InCsumErrors.
type csumCounter struct {
	f    *os.File
	v6   bool
	buf  []byte
	last uint64
}

// openCsumCounter opens the counter of the calling thread's namespace
// (/proc/thread-self, not /proc/self: a Conn opened by a thread switched
// into another namespace belongs to that one). nil when it cannot be read;
// then every socket drop counts as an overflow.
func openCsumCounter(v6 bool) *csumCounter {
	name := "/proc/thread-self/net/snmp"
	if v6 {
		name += "6"
	}
	f, err := os.Open(name)
	if err != nil {
		return nil
	}
	c := &csumCounter{f: f, v6: v6, buf: make([]byte, 16<<10)}
	var ok bool
	if c.last, ok = c.read(); !ok {
		f.Close()
		return nil
	}
	return c
}

// read returns the counter's current value.
func (c *csumCounter) read() (uint64, bool) {
	n, err := c.f.ReadAt(c.buf, 0)
	if err != nil && err != io.EOF {
		return 0, false
	}
	if c.v6 {
		return snmp6Value(c.buf[:n], "Udp6InCsumErrors")
	}
	return snmpValue(c.buf[:n], "Udp:", "InCsumErrors")
}

// take returns how many of d new socket drops were checksum errors.
func (c *csumCounter) take(d uint64) uint64 {
	if c == nil {
		return 0
	}
	v, ok := c.read()
	if !ok {
		return 0
	}
	rise := v - c.last
	c.last = v
	return min(d, rise)
}

// close releases the counter's file.
func (c *csumCounter) close() {
	if c != nil {
		c.f.Close()
	}
}

// snmpValue finds field in /proc/net/snmp's table for proto ("Udp:"): a
// header line of names followed by a line of values.
func snmpValue(b []byte, proto, field string) (uint64, bool) {
	var names []byte
	for len(b) > 0 {
		line, rest, _ := bytes.Cut(b, []byte{'\n'})
		b = rest
		if !bytes.HasPrefix(line, []byte(proto)) {
			continue
		}
		if names == nil {
			names = line
			continue
		}
		k, v := bytes.Fields(names), bytes.Fields(line)
		for i := range k {
			if string(k[i]) == field && i < len(v) {
				n, err := strconv.ParseUint(string(v[i]), 10, 64)
				return n, err == nil
			}
		}
		return 0, false
	}
	return 0, false
}

// snmp6Value finds field in /proc/net/snmp6's "name value" lines.
func snmp6Value(b []byte, field string) (uint64, bool) {
	for len(b) > 0 {
		line, rest, _ := bytes.Cut(b, []byte{'\n'})
		b = rest
		f := bytes.Fields(line)
		if len(f) == 2 && string(f[0]) == field {
			n, err := strconv.ParseUint(string(f[1]), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// udpChecksumOK checks the UDP checksum of an IPv4 datagram (u: UDP header
// and payload) under addrs (source and destination, as in the IP header),
// as the raw socket sees it: 0 means none (what rxe sends); a datagram
// from a sender on this host, over lo or veth, still holds the partial
// sum its kernel left for an offload (CHECKSUM_PARTIAL), accepted as
// such; otherwise the checksum must be right.
func udpChecksumOK(addrs, u []byte) bool {
	if len(u) < 8 {
		return false
	}
	got := binary.BigEndian.Uint16(u[6:])
	return got == 0 || got == inetsum.UDPPartial(addrs, len(u)) || inetsum.UDPValid(addrs, u)
}
