// Package exchange holds the run parameters that rxego's ports of
// ucmatose and udaddy (cmatose, udaddy; mckey too) share: both tools take -c
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

// Tool is what tells the tools apart: the name that starts their errors
// and the largest message.
type Tool struct {
	Name     string
	MaxSize  int
	SizeText string // MaxSize as the tool's own usage words it
}

// Check reports whether p is usable for t (after the defaults), so a
// command can refuse bad arguments before it listens or dials.
func (t Tool) Check(p Params) error {
	_, err := p.WithDefaults(t)
	return err
}

// Result counts what a run of either tool did over all connections.
type Result struct {
	Connections int
	Sent        int // messages sent: SENDs or datagrams completed
	Received    int // messages received
	// Verified counts received messages that matched what was expected
	// (udaddy: replies that carried the client's data, client only).
	Verified int
}

// WithDefaults returns p with its zero fields set to the defaults (a nil
// Out to io.Discard), or an error that starts with t's name when a field
// is out of range.
func (p Params) WithDefaults(t Tool) (Params, error) {
	tool, maxSize, sizeText := t.Name, t.MaxSize, t.SizeText
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
