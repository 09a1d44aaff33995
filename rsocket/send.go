package rsocket

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/rxego/rxego"
)

// canSendLocked tells whether a DATA message may go (rs_can_send): a send
// WR free, the send buffer not nearly full, a credit and a target SGE.
func (c *Conn) canSendLocked() bool {
	return c.sqeAvail > 0 && c.sbufAvail >= sendLowWater && c.sseqNo != c.sseqComp &&
		c.tsgl[c.tsge].length != 0
}

// allSendsDoneLocked tells whether every posted message completed.
func (c *Conn) allSendsDoneLocked() bool {
	return int(c.ctrlMax-c.ctrlSeq)+c.sqeAvail == c.cfg.SendQueue || c.state&stConnected == 0
}

// writeErrLocked is why a Write cannot go on.
func (c *Conn) writeErrLocked() error {
	switch {
	case c.err != nil:
		return c.err
	case c.shutWr:
		return ErrShutdown
	default:
		return ErrReset // the peer's DISCONNECT
	}
}

// Write writes b to the stream. It returns once every byte is posted (the
// peer holds them when Close or CloseWrite returns).
func (c *Conn) Write(b []byte) (int, error) {
	n, err := c.writeChunks(len(b), b, func(dst []byte, off int) (int, error) { return copy(dst, b[off:]), nil })
	return n, c.opError("write", err)
}

// ReadFrom sends what r gives until EOF, reading it straight into the send
// buffer, saving Write's copy.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	n, err := c.writeChunks(-1, nil, func(dst []byte, _ int) (int, error) { return r.Read(dst) })
	if err == io.EOF {
		err = nil
	}
	return int64(n), c.opError("write", err)
}

// writeChunks sends limit bytes (all until fill's io.EOF when negative) as
// DATA messages, each filled into the send buffer by fill (given the
// stream offset so far), which runs without c.mu. With src given, messages that fit inline are posted from
// it directly.
// waitSendableLocked waits, with c.mu held, until a message may be sent
// (credits and a send slot: canSendLocked), within the write deadline; it
// returns net.ErrClosed on a closed Conn and the write error once the
// connection can no longer send.
func (c *Conn) waitSendableLocked() error {
	if err := c.waitLocked(func() bool { return c.closed || c.canSendLocked() || c.state&stWritable == 0 }, &c.wdl); err != nil {
		return err
	}
	if c.closed {
		return net.ErrClosed
	}
	if c.state&stWritable == 0 {
		return c.writeErrLocked()
	}
	return nil
}

func (c *Conn) writeChunks(limit int, src []byte, fill func(dst []byte, off int) (int, error)) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	for limit < 0 || total < limit {
		if err := c.waitSendableLocked(); err != nil {
			return total, err
		}
		size := min(maxTransfer, c.sbufAvail, int(c.tsgl[c.tsge].length))
		if limit >= 0 {
			size = min(size, limit-total)
		}
		if src != nil && size <= c.cfg.Inline {
			if err := c.postDataLocked(size, src[total:total+size]); err != nil {
				return total, err
			}
			total += size
			continue
		}
		size = min(size, len(c.sbuf)-c.sbufHead)
		c.mu.Unlock()
		n, ferr := fill(c.sbuf[c.sbufHead:c.sbufHead+size], total)
		c.mu.Lock()
		if n > 0 {
			if c.closed {
				return total, net.ErrClosed
			}
			if c.state&stWritable == 0 {
				return total, c.writeErrLocked()
			}
			if err := c.postDataLocked(n, nil); err != nil {
				return total, err
			}
			total += n
		}
		if ferr != nil {
			return total, ferr
		}
	}
	return total, nil
}

// postDataLocked posts a DATA message of n bytes: inline ones from inline,
// the others from the send buffer's head (rs_write_data).
func (c *Conn) postDataLocked(n int, inline []byte) error {
	c.sseqNo++
	c.sqeAvail--
	c.sbufAvail -= n
	addr, rkey := c.consumeTargetLocked(n)
	msg := msgSet(opData, uint32(n))
	wr := rxego.SendWR{ID: uint64(msg), Opcode: rxego.WRWriteImm, Imm: msg, RemoteAddr: addr, RKey: rkey}
	if inline != nil {
		wr.Flags, wr.Inline = rxego.SendInline, inline
	} else {
		wr.SGL = []rxego.SGE{{Addr: c.smr.IOVA() + uint64(c.sbufHead), Length: uint32(n), LKey: c.smr.LKey()}}
		c.sbufHead = (c.sbufHead + n) % len(c.sbuf)
	}
	if err := c.q.PostSend(wr); err != nil {
		c.failLocked(err)
		return c.err
	}
	c.stats.dataSent.Add(1)
	c.stats.bytesSent.Add(uint64(n))
	return nil
}

// sendCtrlLocked sends a control message once a control slot is free,
// waiting at most until deadline.
func (c *Conn) sendCtrlLocked(ctrl uint32, deadline time.Time) error {
	if err := c.waitLocked(func() bool { return c.ctrlAvailLocked() || c.state&stConnected == 0 }, &deadline); err != nil {
		return err
	}
	if c.state&stConnected == 0 {
		return nil
	}
	c.ctrlSeq++
	if err := c.postMsgLocked(msgSet(opCtrl, ctrl)); err != nil {
		c.failLocked(err)
		return c.err
	}
	c.shutSent = true
	return nil
}

// CloseWrite shuts the sending side down: the peer reads the data sent so
// far, then io.EOF. It sends rsocket's SHUTDOWN (DISCONNECT when the
// receiving side is shut too) and waits for the peer to take everything.
func (c *Conn) CloseWrite() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opError("close", net.ErrClosed)
	}
	if c.state&stWritable == 0 {
		return nil
	}
	c.shutWr = true
	c.state &^= stWritable
	c.broadcastLocked()
	ctrl := uint32(ctrlShutdown)
	if c.state&stReadable == 0 {
		ctrl = ctrlDisconnect
	}
	return c.opError("close", c.flushLocked(ctrl))
}

// flushLocked sends ctrl and waits, up to closeWait, for every message to
// complete.
func (c *Conn) flushLocked(ctrl uint32) error {
	deadline := time.Now().Add(closeWait)
	if err := c.sendCtrlLocked(ctrl, deadline); err != nil {
		return err
	}
	return c.waitLocked(c.allSendsDoneLocked, &deadline)
}

// Close ends the connection: it sends rsocket's DISCONNECT after the data
// written, waits (a bounded time) for the peer to take it, disconnects the
// CM connection and frees the QP and buffers. Blocked Read and Write
// calls return net.ErrClosed.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opError("close", net.ErrClosed)
	}
	c.closed = true
	c.broadcastLocked()
	if c.state&stConnected != 0 {
		c.state &^= stReadable | stWritable
		c.flushLocked(ctrlDisconnect) // a peer that takes nothing is torn down anyway
	}
	c.mu.Unlock()
	c.shutdown()
	return nil
}

// shutdown disconnects the CM connection and frees everything.
func (c *Conn) shutdown() {
	c.teardown.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), closeWait)
		c.cmc.Disconnect(ctx) // an error means the peer went first
		cancel()
		c.cancel()
		<-c.pollDone
		c.drainCQ()
		c.release()
	})
}

// drainCQ counts, in Stats.AfterShutdown, the peer's messages the QP took
// (and acknowledged) after this side's SHUTDOWN or DISCONNECT that the
// poll goroutine left; the rest of what the CQ holds is moot now.
func (c *Conn) drainCQ() {
	wcs := make([]rxego.WC, 64)
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		n, err := c.cq.Poll(wcs)
		if err != nil || n == 0 {
			return
		}
		for _, wc := range wcs[:n] {
			if c.shutSent && wc.ID&recvWRFlag != 0 && wc.Status == rxego.WCSuccess {
				c.stats.afterShutdown.Add(1)
			}
		}
	}
}

// release frees the verbs resources, those that exist.
func (c *Conn) release() {
	if c.q != nil {
		c.q.Destroy()
	}
	for _, m := range []*rxego.MR{c.rmr, c.smr, c.tmr} {
		if m != nil {
			m.Deregister()
		}
	}
	c.mu.Lock()
	for _, m := range c.mappedIndex {
		m.mr.Deregister()
	}
	c.mappedIndex = nil
	c.mu.Unlock()
	if c.cq != nil {
		c.cq.Close()
	}
	if c.pd != nil {
		c.pd.Dealloc()
	}
}

// LocalAddr returns this side's address and rdma_cm port.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the peer's address and rdma_cm port.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets both the read and the write deadline.
func (c *Conn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rdl, c.wdl = t, t
	c.broadcastLocked()
	return nil
}

// SetReadDeadline sets when blocked and future Reads give up with
// os.ErrDeadlineExceeded; the zero time means never.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rdl = t
	c.broadcastLocked()
	return nil
}

// SetWriteDeadline sets when blocked and future Writes give up with
// os.ErrDeadlineExceeded; the zero time means never.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wdl = t
	c.broadcastLocked()
	return nil
}

// Stats returns the connection's counters.
func (c *Conn) Stats() Stats {
	s := &c.stats
	return Stats{DataSent: s.dataSent.Load(), DataReceived: s.dataRecv.Load(), BytesSent: s.bytesSent.Load(),
		BytesReceived: s.bytesRecv.Load(), CreditUpdates: s.credits.Load(), Keepalives: s.keepalives.Load(),
		Malformed: s.malformed.Load(), AfterShutdown: s.afterShutdown.Load()}
}
