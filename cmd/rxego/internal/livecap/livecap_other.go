//go:build !linux

// Package livecap captures RoCEv2 frames live from a network interface;
// only Linux (AF_PACKET) is supported.
package livecap

import (
	"errors"
	"net/netip"
	"time"

	"github.com/gopacket/gopacket/layers"
)

// ErrTimeout is returned by Next when no frame came within its timeout.
var ErrTimeout = errors.New("livecap: no frame before the timeout")

// Capture is an open live capture.
type Capture struct{}

// DefaultBuffer is the receive buffer a capture asks for by default.
const DefaultBuffer = 8 << 20

// Options are a capture's settings (see the Linux version).
type Options struct {
	Host   netip.Addr
	Buffer int
}

// Stats are a capture's kernel counters.
type Stats struct{ Frames, Dropped uint64 }

// Stats reports nothing captured.
func (c *Capture) Stats() (Stats, error) { return Stats{}, nil }

// Open fails: live capture needs Linux.
func Open(iface string, timeout time.Duration, o Options) (*Capture, error) {
	return nil, errors.New("livecap: live capture is supported on Linux only")
}

// LinkType is the link type of the frames Next returns.
func (c *Capture) LinkType() layers.LinkType { return layers.LinkTypeEthernet }

// Frame is one captured frame.
type Frame struct {
	Data    []byte
	Time    time.Time
	GSOSize int
}

// KnowsGSO reports false.
func (c *Capture) KnowsGSO() bool { return false }

// Next never returns a frame.
func (c *Capture) Next() (Frame, error) {
	return Frame{}, errors.New("livecap: unsupported")
}

// Close does nothing.
func (c *Capture) Close() error { return nil }
