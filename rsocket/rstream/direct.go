package rstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// Direct placement, as librdmacm's riostream: each test maps the
// transfer buffer for the peer (riomap, at offset 0), and the transfers
// are RDMA WRITEs into the peer's buffer (riowrite) instead of stream
// messages. The receiver learns that a round arrived by watching the
// buffer's last byte, which the sender sets to a marker counting up from
// 0 before its last transfer of the round. With verification the last
// transfer's other bytes carry the counter.

// DirectConn is what direct placement needs of a connection: package
// rsocket's Conn.
type DirectConn interface {
	IOMap(buf []byte, offset int64) (int64, error)
	IOUnmap(buf []byte) error
	IOWrite(b []byte, offset int64) (int, error)
}

// errNotDirect is a connection without direct placement.
var errNotDirect = errors.New("rstream: the connection has no direct placement (riomap)")

// directTest is run_test of riostream.
func (r *run) directTest(ctx context.Context, conn any) error {
	c, ok := conn.(DirectConn)
	if !ok {
		return errNotDirect
	}
	nc, ok := conn.(io.ReadWriter)
	if !ok {
		return errNotDirect
	}
	buf := r.buf[:r.size]
	last := r.size - 1
	buf[last] = 0xff
	if _, err := c.IOMap(buf, 0); err != nil {
		return fmt.Errorf("riomap: %w", err)
	}
	defer c.IOUnmap(buf)
	// The sync messages go on the stream, unformatted.
	first, second := r.plainSend, r.plainRecv
	if !r.client {
		first, second = r.plainRecv, r.plainSend
	}
	if err := first(nc, 16); err != nil {
		return err
	}
	if err := second(nc, 16); err != nil {
		return err
	}
	var marker byte
	send := func() error {
		for range r.count - 1 {
			if _, err := c.IOWrite(buf, 0); err != nil {
				return fmt.Errorf("riowrite: %w", err)
			}
		}
		buf[last] = marker
		marker++
		if r.cfg.Verify {
			r.format(buf[:last])
		}
		if _, err := c.IOWrite(buf, 0); err != nil {
			return fmt.Errorf("riowrite: %w", err)
		}
		return nil
	}
	recv := func() error {
		if err := awaitByte(ctx, buf, last, marker); err != nil {
			return err
		}
		marker++
		if r.cfg.Verify {
			return r.check(buf[:last])
		}
		return nil
	}
	r.start = time.Now()
	for range r.iters {
		var err error
		if r.client {
			if err = send(); err == nil {
				err = recv()
			}
		} else {
			if err = recv(); err == nil {
				err = send()
			}
		}
		if err != nil {
			return err
		}
	}
	r.stopT = time.Now()
	r.show()
	return nil
}

// awaitByte spins until buf[i] holds want, which the peer's RDMA WRITE
// puts there; the load is atomic so that the compiler keeps it in the
// loop. It gives up when ctx ends.
func awaitByte(ctx context.Context, buf []byte, i int, want byte) error {
	word := (*uint32)(unsafe.Pointer(&buf[i&^3]))
	if uintptr(unsafe.Pointer(word))%4 != 0 || i&^3+4 > len(buf) {
		// An unaligned tail: the byte's own word is not in the buffer.
		word = nil
	}
	shift := 8 * uint(i&3)
	for spin := 0; ; spin++ {
		var b byte
		if word != nil {
			b = byte(atomic.LoadUint32(word) >> shift)
		} else {
			b = *(*byte)(unsafe.Pointer(&buf[i]))
		}
		if b == want {
			return nil
		}
		if spin%1024 == 1023 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("rstream: waiting for the peer's marker %d: %w", want, err)
			}
			runtime.Gosched()
		}
	}
}
