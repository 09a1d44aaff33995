package rsocket

import (
	"fmt"
	"time"
)

// Config sets a connection's resources before it connects, as rsocket's
// setsockopt options do before rconnect or rlisten. The zero value gives
// rsocket's defaults.
type Config struct {
	// SendBuffer and RecvBuffer are the sizes in bytes of the send and
	// receive buffers (rsocket's SO_SNDBUF and SO_RCVBUF set twice the
	// value given). The receive buffer is advertised in two halves; 0
	// means 128 KiB. SendBuffer is at least 4 KiB, RecvBuffer at least
	// 4 KiB and even.
	SendBuffer, RecvBuffer int
	// SendQueue and RecvQueue are the QP's send and receive queue depths
	// (RDMA_SQSIZE, RDMA_RQSIZE); RecvQueue is also the credit count the
	// peer gets. 0 means 384; values are kept within 16..65534.
	SendQueue, RecvQueue int
	// Inline is the largest message sent inline (RDMA_INLINE); 0 means
	// 64, negative none, at most 512.
	Inline int
	// IOMapSize is how many direct-placement mappings the peer may make
	// into this side (RDMA_IOMAPSIZE); 0 means none. Values above 128
	// are rounded down to a multiple of 256, as rsocket encodes them.
	IOMapSize int
	// KeepAlive, when positive, sends rsocket's keepalive (a zero-length
	// RDMA WRITE) that often, so that a dead peer fails the connection
	// through the QP's retries. rsocket's SO_KEEPALIVE with TCP_KEEPIDLE.
	KeepAlive time.Duration
}

// withDefaults returns c with zero fields defaulted and sizes clamped as
// rsocket clamps them, or an error naming a bad value.
func (c *Config) withDefaults() (Config, error) {
	var o Config
	if c != nil {
		o = *c
	}
	if o.SendBuffer < 0 || o.RecvBuffer < 0 || o.SendQueue < 0 || o.RecvQueue < 0 ||
		o.IOMapSize < 0 || o.KeepAlive < 0 {
		return o, fmt.Errorf("rsocket: negative value in %+v", o)
	}
	if o.SendBuffer == 0 {
		o.SendBuffer = defaultBuffer
	}
	if o.RecvBuffer == 0 {
		o.RecvBuffer = defaultBuffer
	}
	o.SendBuffer = max(o.SendBuffer, 2*sendLowWater)
	o.RecvBuffer = max(o.RecvBuffer, 2*sendLowWater) &^ 1
	if o.SendBuffer > 1<<30 || o.RecvBuffer > 1<<30 {
		return o, fmt.Errorf("rsocket: buffers of %d and %d bytes exceed 1 GiB", o.SendBuffer, o.RecvBuffer)
	}
	for _, q := range []*int{&o.SendQueue, &o.RecvQueue} {
		if *q == 0 {
			*q = defaultQueue
		}
		*q = min(max(*q, minQueue), maxQueue)
	}
	switch {
	case o.Inline == 0:
		o.Inline = defaultInline
	case o.Inline < 0:
		o.Inline = 0
	}
	o.Inline = min(o.Inline, 512)
	if o.IOMapSize > 0x7f00 {
		return o, fmt.Errorf("rsocket: iomap size %d exceeds %d", o.IOMapSize, 0x7f00)
	}
	o.IOMapSize = valueOf(scaleOf(o.IOMapSize))
	return o, nil
}
