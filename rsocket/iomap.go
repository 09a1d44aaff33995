package rsocket

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rxego/rxego"
)

// Direct placement (rsocket's riomap, riowrite, riounmap): a side maps a
// buffer of its own at an offset of its choosing, which sends the peer an
// iomap entry (offset, address, rkey, length) written into the peer's
// target iomap with an IOMAP_SGL message; the peer then writes at that
// offset with IOWrite, an RDMA WRITE without immediate straight into the
// buffer. Nothing tells the mapping side that the bytes arrived: as with
// riostream, the application agrees on that itself (riostream sends
// the last byte of each transfer last and watches for it, and a Write
// after IOWrite arrives after it, since RC keeps the order).

// ErrNoMapping is returned by IOWrite for an offset no mapping of the
// peer covers, and by IOMap when the peer has no room for another.
var ErrNoMapping = errors.New("rsocket: no iomap entry")

// iomapping is one buffer this side mapped for the peer.
type iomapping struct {
	buf    []byte
	mr     *rxego.MR
	offset uint64
	index  int
}

// iomapEntry is struct rs_iomap: an offset and the region it maps.
type iomapEntry struct {
	offset uint64
	sge    sge
}

// IOMap maps buf for the peer to write into with its IOWrite at offset
// (negative: the buffer's address, as riomap's -1 does) and returns the
// offset. The peer must have asked for iomap entries (Config.IOMapSize).
// The buffer must stay untouched by Go code while the peer may write,
// and mapped until IOUnmap.
func (c *Conn) IOMap(buf []byte, offset int64) (int64, error) {
	if len(buf) == 0 || len(buf) > 1<<32-1 {
		return 0, fmt.Errorf("rsocket: IOMap of %d bytes", len(buf))
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	index := -1
	for i := range int(c.remoteMap.length) {
		if _, used := c.mappedIndex[i]; !used {
			index = i
			break
		}
	}
	if index < 0 {
		return 0, fmt.Errorf("%w: the peer has room for %d mappings, all used", ErrNoMapping, c.remoteMap.length)
	}
	mr, err := c.pd.RegMR(buf, rxego.AccessLocalWrite|rxego.AccessRemoteWrite)
	if err != nil {
		return 0, err
	}
	if offset < 0 {
		offset = int64(mr.IOVA())
	}
	m := &iomapping{buf: buf, mr: mr, offset: uint64(offset), index: index}
	// rs_send_iomaps: the entry goes as soon as a message may.
	if err = c.waitSendableLocked(); err != nil {
		mr.Deregister()
		return 0, c.opError("iomap", err)
	}
	var b [iomapSize]byte
	c.peerOrder.PutUint64(b[:], m.offset)
	sge{addr: mr.IOVA(), key: mr.RKey(), length: uint32(len(buf))}.put(c.peerOrder, b[8:])
	// rs_write_iomap counts the message as a data message, though the
	// peer takes no credit back for it; the same here, as the peer expects.
	c.sseqNo++
	c.sqeAvail--
	msg := msgSet(opIOMapSGL, uint32(index))
	if err := c.q.PostSend(rxego.SendWR{ID: uint64(msg), Opcode: rxego.WRWriteImm, Flags: rxego.SendInline, Inline: b[:],
		Imm: msg, RemoteAddr: c.remoteMap.addr + uint64(index)*iomapSize, RKey: c.remoteMap.key}); err != nil {
		mr.Deregister()
		c.failLocked(err)
		return 0, c.opError("iomap", c.err)
	}
	if c.mappedIndex == nil {
		c.mappedIndex = map[int]*iomapping{}
	}
	c.mappedIndex[index] = m
	return offset, nil
}

// IOUnmap ends the mapping of buf. As riounmap, it tells the peer nothing:
// a later IOWrite of the peer into it fails the connection.
func (c *Conn) IOUnmap(buf []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range c.mappedIndex {
		if len(m.buf) == len(buf) && len(buf) > 0 && &m.buf[0] == &buf[0] {
			delete(c.mappedIndex, i)
			return m.mr.Deregister()
		}
	}
	return fmt.Errorf("rsocket: IOUnmap: the buffer is not mapped")
}

// takeIOMapLocked reads the iomap entry the peer wrote at index.
func (c *Conn) takeIOMapLocked(index uint32) {
	if int(index) >= c.cfg.IOMapSize {
		c.stats.malformed.Add(1)
		return
	}
	if c.tmap == nil {
		c.tmap = make([]iomapEntry, c.cfg.IOMapSize)
	}
	b := c.tbuf[sglEntries*sgeSize+int(index)*iomapSize:]
	c.tmap[index] = iomapEntry{offset: binary.NativeEndian.Uint64(b), sge: getSGE(binary.NativeEndian, b[8:])}
}

// findIOMapLocked returns the peer's mapping that covers offset.
func (c *Conn) findIOMapLocked(offset uint64) (iomapEntry, bool) {
	for _, e := range c.tmap {
		if e.sge.length != 0 && offset >= e.offset && offset-e.offset < uint64(e.sge.length) {
			return e, true
		}
	}
	return iomapEntry{}, false
}

// IOWrite writes b at offset of the peer's mappings, straight into the
// peer's buffer (riowrite): RDMA WRITEs without immediate, ordered with
// the stream's messages. It returns how many bytes it wrote; a range
// beyond the mappings ends it with ErrNoMapping.
func (c *Conn) IOWrite(b []byte, offset int64) (int, error) {
	if offset < 0 {
		return 0, fmt.Errorf("rsocket: IOWrite at offset %d", offset)
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	for total < len(b) {
		at := uint64(offset) + uint64(total)
		e, ok := c.findIOMapLocked(at)
		if !ok {
			return total, c.opError("iowrite", fmt.Errorf("%w covers offset %d", ErrNoMapping, at))
		}
		if err := c.waitSendableLocked(); err != nil {
			return total, c.opError("iowrite", err)
		}
		size := min(len(b)-total, maxTransfer, c.sbufAvail, len(c.sbuf)-c.sbufHead, int(e.sge.length-uint32(at-e.offset)))
		copy(c.sbuf[c.sbufHead:], b[total:total+size])
		c.sqeAvail--
		c.sbufAvail -= size
		msg := msgSet(opWrite, uint32(size))
		wr := rxego.SendWR{ID: uint64(msg), Opcode: rxego.WRWrite, RemoteAddr: e.sge.addr + at - e.offset, RKey: e.sge.key,
			SGL: []rxego.SGE{{Addr: c.smr.IOVA() + uint64(c.sbufHead), Length: uint32(size), LKey: c.smr.LKey()}}}
		c.sbufHead = (c.sbufHead + size) % len(c.sbuf)
		if err := c.q.PostSend(wr); err != nil {
			c.failLocked(err)
			return total, c.opError("iowrite", c.err)
		}
		total += size
	}
	return total, nil
}
