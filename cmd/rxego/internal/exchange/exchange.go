// Package exchange holds the run parameters that rxego's ports of
// ucmatose and udaddy (cm/cmatose, cm/udaddy) share: both tools take -c
// connections, -C messages each way per connection and -S message size,
// with the same defaults and limits but for the largest message.
package exchange

import (
	"cmp"
	"fmt"
	"io"
)

// Defaults and limits of both tools.
const (
	DefaultConnections = 1
	DefaultCount       = 10
	DefaultSize        = 100
	MaxConnections     = 1024
	MaxCount           = 4096
)

// Params is what both roles of either tool take; zero fields take the
// tools' defaults.
type Params struct {
	Connections int // -c
	Count       int // -C: messages each way per connection
	Size        int // -S: message size
	// Out receives the tool's progress lines; nil discards them.
	Out io.Writer
}

// WithDefaults returns p with its zero fields set to the defaults (a nil
// Out to io.Discard), or an error that tool starts when a field is out of
// range; maxSize is the largest message, sizeText its wording.
func (p Params) WithDefaults(tool string, maxSize int, sizeText string) (Params, error) {
	p.Connections = cmp.Or(p.Connections, DefaultConnections)
	p.Count = cmp.Or(p.Count, DefaultCount)
	p.Size = cmp.Or(p.Size, DefaultSize)
	if p.Connections < 1 || p.Connections > MaxConnections || p.Count < 1 || p.Count > MaxCount || p.Size < 1 || p.Size > maxSize {
		return p, fmt.Errorf("%s: connections %d (1..%d), count %d (1..%d), size %d (1..%s)",
			tool, p.Connections, MaxConnections, p.Count, MaxCount, p.Size, sizeText)
	}
	if p.Out == nil {
		p.Out = io.Discard
	}
	return p, nil
}
