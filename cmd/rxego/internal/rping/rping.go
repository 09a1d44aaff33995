// Package rping is rxego's peer for librdmacm's rping: the same ping-pong
// over an rdma_cm connection, so that rxego can face rping in either
// role.
//
// The protocol (rdma-core librdmacm/examples/rping.c), per ping:
//
//  1. the client SENDs 16 bytes naming its source buffer: address
//     (big-endian 64 bits), rkey and length (32 bits each);
//  2. the server RDMA READs that many bytes of it and SENDs a "go ahead";
//  3. the client SENDs the same record for its sink buffer;
//  4. the server RDMA WRITEs the ping data (up to its NUL) into the sink
//     and SENDs another "go ahead";
//  5. the client compares sink and source.
//
// The ping data is "rdma-ping-N: " followed by letters cycling through
// 'A'..'z' from a start that moves by one each ping, NUL-terminated at
// the buffer's end. rxego's server checks every ping it reads against
// that pattern, so data is verified in both directions: the server checks
// what it READ, the client what was WRITTEN back.
package rping

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
)

// Defaults and limits of rping.
const (
	DefaultPort = 7174        // rping's -p default
	DefaultSize = 64          // rping's -S default
	MaxSize     = 64*1024 - 1 // RPING_BUFSIZE - 1
	// MinSize is rping's RPING_MIN_BUFSIZE, sizeof(stringify(INT_MAX)) +
	// sizeof("rdma-ping-%d: "): rping.c does not include limits.h, so
	// INT_MAX stays unexpanded and the first term is sizeof("INT_MAX"),
	// 8, not the 11 of "2147483647". rping takes -S 23.
	MinSize  = 23
	infoSize = 16 // struct rping_rdma_info
	sqDepth  = 16 // RPING_SQ_DEPTH
)

// Config is what both roles take.
type Config struct {
	Size     int  // ping data size, MinSize..MaxSize (client; default DefaultSize)
	Count    int  // pings the client makes; 0 means until ctx ends
	Verbose  bool // print each ping's data, as rping -v
	Validate bool // client: compare each ping, as rping -V (the server always checks)
	// Out receives the verbose lines; nil discards them.
	Out io.Writer
}

// Result is what a run did.
type Result struct {
	Pings    int // completed ping-pongs
	Verified int // pings whose data was checked and matched
}

// ErrMismatch is returned when ping data differs from what was expected.
var ErrMismatch = errors.New("rping: data mismatch")

// FillPing writes ping n's data into buf, as rping's client does.
func FillPing(buf []byte, n int) {
	cc := copy(buf, "rdma-ping-"+strconv.Itoa(n)+": ")
	c := byte(65 + n%58)
	for i := cc; i < len(buf); i++ {
		buf[i] = c
		if c++; c > 122 {
			c = 65
		}
	}
	if len(buf) > 0 {
		buf[len(buf)-1] = 0
	}
}

// cstring returns b up to its first NUL.
func cstring(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

// peer is one side's verbs resources.
type peer struct {
	dev  *rxego.Device
	cq   *rxego.CQ
	q    *rxego.QP
	recv *rxego.MR // 16 bytes: the peer's info records
	send *rxego.MR // 16 bytes: ours
	rdma *rxego.MR // server: READ sink / WRITE source; client: WRITE sink
	src  *rxego.MR // client: READ source
	wcs  []rxego.WC
}

func newPeer(dev *rxego.Device, rdmaSize, srcSize int) (*peer, error) {
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	p := &peer{dev: dev, wcs: make([]rxego.WC, 1)}
	if p.cq, err = dev.CreateCQ(2 * sqDepth); err != nil {
		return nil, err
	}
	if p.q, err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: p.cq, RecvCQ: p.cq,
		Caps: rxego.Caps{MaxSendWR: sqDepth, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return nil, err
	}
	remote := rxego.AccessLocalWrite | rxego.AccessRemoteRead | rxego.AccessRemoteWrite
	for _, r := range []struct {
		mr     **rxego.MR
		size   int
		access rxego.Access
	}{{&p.recv, infoSize, rxego.AccessLocalWrite}, {&p.send, infoSize, 0}, {&p.rdma, rdmaSize, remote}, {&p.src, srcSize, remote}} {
		if r.size == 0 {
			continue
		}
		if *r.mr, err = pd.RegMR(make([]byte, r.size), r.access); err != nil {
			return nil, err
		}
	}
	if err := p.q.Init(0); err != nil {
		return nil, err
	}
	return p, p.postRecv()
}

func (p *peer) postRecv() error {
	return p.q.PostRecv(rxego.RecvWR{ID: 1, SGL: []rxego.SGE{{Addr: p.recv.IOVA(), Length: infoSize, LKey: p.recv.LKey()}}})
}

// sendInfo SENDs the record naming mr's first n bytes.
func (p *peer) sendInfo(mr *rxego.MR, n int) error {
	b := p.send.Buffer()
	if mr != nil {
		binary.BigEndian.PutUint64(b[0:], mr.IOVA())
		binary.BigEndian.PutUint32(b[8:], mr.RKey())
		binary.BigEndian.PutUint32(b[12:], uint32(n))
	}
	return p.q.PostSend(rxego.SendWR{ID: 2, Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: p.send.IOVA(), Length: infoSize, LKey: p.send.LKey()}}})
}

// rdmaOp posts an RDMA READ or WRITE of n bytes of p.rdma.
func (p *peer) rdmaOp(op rxego.WROpcode, n int, addr uint64, rkey uint32) error {
	return p.q.PostSend(rxego.SendWR{ID: 3, Opcode: op, Flags: rxego.SendSignaled,
		SGL:        []rxego.SGE{{Addr: p.rdma.IOVA(), Length: uint32(n), LKey: p.rdma.LKey()}},
		RemoteAddr: addr, RKey: rkey})
}

// await returns the next completion of opcode want; SEND completions on
// the way are checked and skipped. A received record is checked for size
// and the receive reposted. A flushed completion after the peer
// disconnected returns errPeerGone.
func (p *peer) await(ctx context.Context, c *cm.Conn, want rxego.WCOpcode) (rxego.WC, error) {
	for {
		if _, err := p.cq.PollWait(ctx, p.wcs); err != nil {
			return rxego.WC{}, err
		}
		wc := p.wcs[0]
		if wc.Status != rxego.WCSuccess {
			if wc.Status == rxego.WCWRFlushErr && c != nil && errors.Is(c.Err(), cm.ErrDisconnected) {
				return wc, errPeerGone
			}
			return wc, fmt.Errorf("rping: completion %v: %v", wc.Opcode, wc.Status)
		}
		switch {
		case wc.Opcode == want:
			if want == rxego.WCRecv {
				if wc.ByteLen != infoSize {
					return wc, fmt.Errorf("rping: received bogus data, size %d", wc.ByteLen)
				}
				if err := p.postRecv(); err != nil {
					return wc, err
				}
			}
			return wc, nil
		case wc.Opcode == rxego.WCSend:
		default:
			return wc, fmt.Errorf("rping: unexpected %v completion waiting for %v", wc.Opcode, want)
		}
	}
}

// errPeerGone ends a server loop normally: the client disconnected.
var errPeerGone = errors.New("rping: peer disconnected")

// Serve accepts one rping client on l and serves it until it disconnects
// (a normal end: the Result and nil) or ctx ends.
func Serve(ctx context.Context, m *cm.Manager, l *cm.Listener, cfg Config) (Result, error) {
	var res Result
	p, c, err := accept(ctx, m, l)
	if err != nil {
		return res, err
	}
	defer p.q.Destroy()
	err = p.serve(ctx, c, cfg, &res)
	if errors.Is(err, errPeerGone) {
		return res, nil
	}
	c.Disconnect(context.WithoutCancel(ctx))
	return res, err
}

// accept connects the first request whose initiator completes the
// handshake: one that sends no RTU (a forged source) gives its slot back
// after the manager's half-open timeout, and the next is taken.
func accept(ctx context.Context, m *cm.Manager, l *cm.Listener) (*peer, *cm.Conn, error) {
	var p *peer
	for {
		req, err := l.Accept(ctx)
		if err != nil {
			if p != nil {
				p.q.Destroy()
			}
			return nil, nil, err
		}
		if p == nil {
			if p, err = newPeer(m.Device(), MaxSize+1, 0); err != nil {
				req.Reject(nil)
				return nil, nil, err
			}
		}
		c, err := req.Accept(ctx, p.q, nil)
		if err == nil {
			return p, c, nil
		}
		if errors.Is(err, cm.ErrHalfOpen) {
			// The QP went to ERR: back to INIT with its receive, the
			// flushed completions drained.
			if err = p.q.Modify(&rxego.QPAttr{State: rxego.StateReset}, rxego.AttrState); err == nil {
				for n, _ := p.cq.Poll(p.wcs); n > 0; n, _ = p.cq.Poll(p.wcs) {
				}
				if err = p.q.Init(0); err == nil {
					if err = p.postRecv(); err == nil {
						continue
					}
				}
			}
		}
		p.q.Destroy()
		return nil, nil, err
	}
}

func (p *peer) serve(ctx context.Context, c *cm.Conn, cfg Config, res *Result) error {
	buf := p.rdma.Buffer()
	want := make([]byte, 0, len(buf))
	for ping := 0; ; ping++ {
		// The client's source buffer: READ it.
		if _, err := p.await(ctx, c, rxego.WCRecv); err != nil {
			return err
		}
		info := p.recv.Buffer()
		addr, rkey, n := binary.BigEndian.Uint64(info), binary.BigEndian.Uint32(info[8:]), int(binary.BigEndian.Uint32(info[12:]))
		if n > len(buf) {
			return fmt.Errorf("rping: client buffer of %d bytes exceeds %d", n, len(buf))
		}
		if err := p.rdmaOp(rxego.WRRead, n, addr, rkey); err != nil {
			return err
		}
		if _, err := p.await(ctx, c, rxego.WCRead); err != nil {
			return err
		}
		want = want[:n]
		FillPing(want, ping)
		if !bytes.Equal(buf[:n], want) {
			return fmt.Errorf("%w: ping %d read %q, want %q", ErrMismatch, ping, cstring(buf[:n]), cstring(want))
		}
		res.Verified++
		if cfg.Verbose && cfg.Out != nil {
			fmt.Fprintf(cfg.Out, "server ping data: %s\n", cstring(buf[:n]))
		}
		if err := p.sendInfo(nil, 0); err != nil { // go ahead
			return err
		}
		// The client's sink: WRITE the ping back.
		if _, err := p.await(ctx, c, rxego.WCRecv); err != nil {
			return err
		}
		addr, rkey = binary.BigEndian.Uint64(info), binary.BigEndian.Uint32(info[8:])
		if err := p.rdmaOp(rxego.WRWrite, len(cstring(buf[:n]))+1, addr, rkey); err != nil {
			return err
		}
		if _, err := p.await(ctx, c, rxego.WCWrite); err != nil {
			return err
		}
		if err := p.sendInfo(nil, 0); err != nil { // go ahead
			return err
		}
		res.Pings++
	}
}

// Dial connects to the rping server at addr and pings it cfg.Count times
// (until ctx ends when 0), then disconnects.
func Dial(ctx context.Context, m *cm.Manager, addr netip.AddrPort, cfg Config) (Result, error) {
	var res Result
	size := cfg.Size
	if size == 0 {
		size = DefaultSize
	}
	if size < MinSize || size > MaxSize {
		return res, fmt.Errorf("rping: size %d outside %d..%d", size, MinSize, MaxSize)
	}
	p, err := newPeer(m.Device(), size, size)
	if err != nil {
		return res, err
	}
	defer p.q.Destroy()
	c, err := m.Dial(ctx, addr, p.q, nil)
	if err != nil {
		return res, err
	}
	err = p.ping(ctx, c, cfg, size, &res)
	if cfg.Count == 0 && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		err = nil // an endless run ends with ctx
	}
	if derr := c.Disconnect(context.WithoutCancel(ctx)); err == nil && derr != nil {
		err = derr
	}
	return res, err
}

func (p *peer) ping(ctx context.Context, c *cm.Conn, cfg Config, size int, res *Result) error {
	src, sink := p.src.Buffer(), p.rdma.Buffer()
	for ping := 0; cfg.Count == 0 || ping < cfg.Count; ping++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		FillPing(src, ping)
		if err := p.sendInfo(p.src, size); err != nil {
			return err
		}
		if _, err := p.await(ctx, c, rxego.WCRecv); err != nil {
			return err
		}
		if err := p.sendInfo(p.rdma, size); err != nil {
			return err
		}
		if _, err := p.await(ctx, c, rxego.WCRecv); err != nil {
			return err
		}
		if cfg.Validate {
			if !bytes.Equal(src, sink) {
				return fmt.Errorf("%w: ping %d got %q, want %q", ErrMismatch, ping, cstring(sink), cstring(src))
			}
			res.Verified++
		}
		if cfg.Verbose && cfg.Out != nil {
			fmt.Fprintf(cfg.Out, "ping data: %s\n", cstring(sink))
		}
		res.Pings++
	}
	return nil
}
