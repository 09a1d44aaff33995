// Package burst holds what rxego's peers for librdmacm's burst tools
// (ucmatose in cm/cmatose, udaddy in cm/udaddy) share: their settings,
// taken from the tools' -c, -C and -S flags, and their counts.
package burst

import (
	"fmt"
	"io"
)

// MaxCount bounds the messages each way per connection.
const MaxCount = 4096

// Config is what both roles of a tool take; zero fields take the tool's
// defaults.
type Config struct {
	Connections int // -c
	Count       int // -C: messages each way per connection
	Size        int // -S: message size
	// Out receives the tool's progress lines; nil discards them.
	Out io.Writer
}

// WithDefaults fills c's zero fields from def and checks the ranges:
// 1..1024 connections, 1..MaxCount messages, sizes 1..maxSize. Out nil
// becomes io.Discard.
func (c Config) WithDefaults(tool string, def Config, maxSize int) (Config, error) {
	if c.Connections == 0 {
		c.Connections = def.Connections
	}
	if c.Count == 0 {
		c.Count = def.Count
	}
	if c.Size == 0 {
		c.Size = def.Size
	}
	if c.Connections < 1 || c.Connections > 1024 || c.Count < 1 || c.Count > MaxCount || c.Size < 1 || c.Size > maxSize {
		return c, fmt.Errorf("%s: connections %d (1..1024), count %d (1..%d), size %d (1..%d)",
			tool, c.Connections, c.Count, MaxCount, c.Size, maxSize)
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	return c, nil
}

// Result counts what a run did over all connections.
type Result struct {
	Connections int
	Sent        int // messages sent
	Received    int // messages received
	Verified    int // received messages that matched what was expected
}
