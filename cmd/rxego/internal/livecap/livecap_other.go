//go:build !linux

// Package livecap captures RoCEv2 frames live from a network interface;
// only Linux (AF_PACKET) is supported.
package livecap

import (
	"errors"
	"time"

	"github.com/gopacket/gopacket/layers"
)

// ErrTimeout is returned by Next when no frame came within its timeout.
var ErrTimeout = errors.New("livecap: no frame before the timeout")

// Capture is an open live capture.
type Capture struct{}

// Open fails: live capture needs Linux.
func Open(iface string, timeout time.Duration) (*Capture, error) {
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
