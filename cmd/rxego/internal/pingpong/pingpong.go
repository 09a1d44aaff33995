package pingpong

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
)

// Kind is which of the four tools to mimic.
type Kind string

// Kinds.
const (
	RC  Kind = "rc"
	UC  Kind = "uc"
	UD  Kind = "ud"
	SRQ Kind = "srq"
)

// Config mirrors the tools' flags.
type Config struct {
	Kind     Kind
	Local    netip.Addr // local RoCE address (the GID); required
	Server   string     // peer host name or address; empty means act as server
	TCPPort  int        // -p, default 18515
	Size     int        // -s, default 4096 (ud: 2048, or the MTU when that is smaller)
	Iters    int        // -n, default 1000
	MTU      int        // -m, default 1024
	RxDepth  int        // -r, default 500
	Events   bool       // -e: sleep on the CQ instead of busy polling
	NumQP    int        // -q (srq), default 16
	SL       int        // -l, accepted for compatibility
	Verify   bool       // rxego's own check: every message is a known pattern or an echo of ours
	Timeout  time.Duration
	Out      io.Writer // where results go (stdout)
	Listener net.Listener
	// Device, when set, is used instead of opening one on Local.
	Device *rxego.Device
	// GIDIndex is the Device's GID the QPs send from and the exchange
	// names (ibv_*_pingpong's -g index; needs Device; 0: Open's address).
	GIDIndex int
	// RDMACM connects the QPs with rdma_cm instead of the TCP exchange
	// (kinds rc and srq; see rdmacm.go); CMConfig tunes its connection
	// manager (nil: rdma_cm's values).
	RDMACM   bool
	CMConfig *cm.Config
}

// pollSpin is how long the polling loop spins on an empty CQ before it
// blocks.
const pollSpin = 50 * time.Microsecond

// ibv_ud_pingpong's Q_Key.
const udQKey = 0x11111111

// Work request IDs of the C tools.
const (
	recvWRID = 1
	sendWRID = 2
)

// fillByte is what the C tools memset their buffer to, except
// ibv_srq_pingpong, which zeroes it (srqFillByte).
const (
	fillByte    = 0x7b
	srqFillByte = 0x00
)

// Limits checked before anything is allocated. rxego gives every posted
// receive its own slot (so a completion's bytes can be checked), so the
// buffer is size x (rx depth + QPs), bounded by maxBuffer.
const (
	maxSize    = 1 << 30 // -s
	maxRxDepth = 16384   // -r
	maxIters   = 1 << 31 // -n
	maxBuffer  = 1 << 30 // size x rx depth
)

// Result is what a run measured.
type Result struct {
	Bytes      int64
	Iters      int
	Elapsed    time.Duration
	Mismatches int
}

// Check reports whether c is usable, applying the defaults to a copy:
// every limit is checked before Run allocates anything.
func (c Config) Check() error { return c.defaults() }

func (c *Config) defaults() error {
	if c.Kind == "" {
		c.Kind = RC
	}
	switch c.Kind {
	case RC, UC, UD, SRQ:
	default:
		return fmt.Errorf("pingpong: unknown kind %q", c.Kind)
	}
	if c.TCPPort == 0 {
		c.TCPPort = 18515
	}
	if c.MTU == 0 {
		c.MTU = 1024
	}
	if c.Size == 0 {
		c.Size = 4096
		if c.Kind == UD {
			// ibv_ud_pingpong's 2048 exceeds rxe's usual port MTU (1024
			// on a 1500-byte link), where the tool refuses it.
			c.Size = min(2048, c.MTU)
		}
	}
	if c.Iters == 0 {
		c.Iters = 1000
	}
	if c.RxDepth == 0 {
		c.RxDepth = 500
	}
	if c.NumQP == 0 {
		c.NumQP = 16
	}
	if c.Kind != SRQ {
		c.NumQP = 1
	}
	if c.Timeout == 0 {
		c.Timeout = 60 * time.Second
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if err := c.checkLimits(); err != nil {
		return err
	}
	if _, ok := rxego.MTUFromBytes(c.MTU); !ok {
		return fmt.Errorf("pingpong: MTU %d is not 256, 512, 1024, 2048 or 4096", c.MTU)
	}
	if c.Kind == UD && c.Size > c.MTU {
		return fmt.Errorf("pingpong: UD message size %d exceeds the MTU %d", c.Size, c.MTU)
	}
	if !c.Local.IsValid() && c.Device == nil {
		return errors.New("pingpong: a local RoCE address is needed (-g ADDRESS)")
	}
	if c.GIDIndex != 0 {
		if c.Device == nil {
			return errors.New("pingpong: a GID index needs a Device")
		}
		if _, err := c.Device.QueryGID(c.GIDIndex); err != nil {
			return fmt.Errorf("pingpong: %w", err)
		}
	}
	if c.RDMACM {
		return c.checkRDMACM()
	}
	return nil
}

// checkLimits checks every size, count and depth against rxego's limits.
func (c *Config) checkLimits() error {
	for _, v := range []struct {
		name  string
		v, hi int
	}{{"message size (-s)", c.Size, maxSize}, {"iterations (-n)", c.Iters, maxIters},
		{"rx depth (-r)", c.RxDepth, maxRxDepth}, {"number of QPs (-q)", c.NumQP, srqRecords}} {
		if v.v < 1 || v.v > v.hi {
			return fmt.Errorf("pingpong: %s %d: want 1 to %d", v.name, v.v, v.hi)
		}
	}
	if c.TCPPort < 0 || c.TCPPort > 0xffff {
		return fmt.Errorf("pingpong: port %d: want 0 to 65535", c.TCPPort)
	}
	if b := (c.Size + rxego.GRHLen) * (c.RxDepth + c.NumQP); b > maxBuffer {
		return fmt.Errorf("pingpong: message size %d x (rx depth %d + %d QPs) needs a %d-byte buffer (one slot per receive and per sender), over rxego's %d; lower -s or -r",
			c.Size, c.RxDepth, c.NumQP, b, maxBuffer)
	}
	return nil
}

type conn struct {
	cfg    *Config
	dev    *rxego.Device
	pd     *rxego.PD
	cq     *rxego.CQ
	srq    *rxego.SRQ
	qps    []*rxego.QP
	mr     *rxego.MR
	buf    []byte // receive slots then one send buffer per QP
	send   []byte
	slot   int
	psn    uint32
	remote []Dest
	ah     *rxego.AH
	// verification
	history  [][]byte // what we sent recently, for echo checks
	histNext int
	seq      uint64
	mismatch int
	free     []int // receive slots not posted, most recently freed last
	// rdma_cm mode
	cm    *cm.Manager
	conns []*cm.Conn
}

// Run performs one pingpong run as server or client.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.defaults(); err != nil {
		return Result{}, err
	}
	c := &conn{cfg: &cfg}
	err := c.setup()
	if cfg.Device == nil && c.dev != nil {
		defer c.dev.Close()
	}
	if err != nil {
		return Result{}, err
	}
	if cfg.RDMACM {
		err = c.connectCM(ctx)
		if err == nil {
			var res Result
			res, err = c.loop(ctx)
			return res, errors.Join(err, c.closeCM())
		}
		return Result{}, errors.Join(err, c.closeCM())
	}
	if err := c.exchange(ctx); err != nil {
		return Result{}, err
	}
	return c.loop(ctx)
}

func (c *conn) setup() error {
	cfg := c.cfg
	var err error
	c.dev = cfg.Device
	if c.dev == nil {
		if c.dev, err = rxego.Open(netip.AddrPortFrom(cfg.Local, rxego.DefaultPort).String(), nil); err != nil {
			return err
		}
	}
	c.pd, _ = c.dev.AllocPD()
	c.slot = cfg.Size
	if cfg.Kind == UD {
		c.slot = cfg.Size + rxego.GRHLen
	}
	// Each QP sends from its own buffer (the C tools share one): a QP's
	// next message must not overwrite another's still going out, or what
	// leaves is a mix and the echo cannot be checked.
	c.buf = make([]byte, c.slot*cfg.RxDepth+cfg.Size*cfg.NumQP)
	for i := range c.buf {
		c.buf[i] = fillByte
	}
	c.send = c.buf[c.slot*cfg.RxDepth:]
	for i := cfg.RxDepth - 1; i >= 0; i-- {
		c.free = append(c.free, i)
	}
	if c.mr, err = c.pd.RegMR(c.buf, rxego.AccessLocalWrite); err != nil {
		return err
	}
	if c.cq, err = c.dev.CreateCQ(cfg.RxDepth + cfg.NumQP + 16); err != nil {
		return err
	}
	typ := rxego.RC
	switch cfg.Kind {
	case UC:
		typ = rxego.UC
	case UD:
		typ = rxego.UD
	}
	if cfg.Kind == SRQ {
		if c.srq, err = c.pd.CreateSRQ(cfg.RxDepth, 1); err != nil {
			return err
		}
	}
	for i := 0; i < cfg.NumQP; i++ {
		recvWR := cfg.RxDepth
		if c.srq != nil {
			recvWR = 0
		}
		q, err := c.pd.CreateQP(rxego.QPInitAttr{Type: typ, SendCQ: c.cq, RecvCQ: c.cq, SRQ: c.srq,
			Caps: rxego.Caps{MaxSendWR: 1, MaxRecvWR: recvWR, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			return err
		}
		c.qps = append(c.qps, q)
	}
	// The C tools send from the buffer they receive into, so what comes
	// back is the fill byte or an echo of one of our recent messages.
	c.history = make([][]byte, 4*cfg.NumQP+4)
	c.psn = rand.Uint32() & 0xffffff
	for _, q := range c.qps {
		if cfg.Kind == UD {
			err = q.ActivateUD(udQKey, c.psn)
		} else {
			err = q.Init(0)
		}
		if err != nil {
			return err
		}
	}
	// Receives are posted before the exchange, as the C tools do; an
	// rdma_cm client posts them once connected (connectCM).
	if cfg.RDMACM && cfg.Server != "" {
		return nil
	}
	return c.postRecvs()
}

// postRecvs posts RxDepth receives, spread over the QPs.
func (c *conn) postRecvs() error {
	for i := 0; i < c.cfg.RxDepth; i++ {
		if err := c.postRecv(i % max(1, len(c.qps))); err != nil {
			return err
		}
	}
	return nil
}

// A receive's wr_id is recvWRID with its slot above wrKindBits: with an
// SRQ, receives complete in the order the QPs consume them, not in the
// order they were posted.
const (
	wrKindBits = 8
	wrKindMask = 1<<wrKindBits - 1
)

func (c *conn) postRecv(qi int) error {
	if len(c.free) == 0 {
		return errors.New("pingpong: no free receive slot")
	}
	i := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	wr := rxego.RecvWR{ID: uint64(i)<<wrKindBits | recvWRID, SGL: []rxego.SGE{{Addr: c.mr.IOVA() + uint64(i*c.slot), Length: uint32(c.slot), LKey: c.mr.LKey()}}}
	if c.srq != nil {
		return c.srq.PostRecv(wr)
	}
	return c.qps[qi].PostRecv(wr)
}

// gid is the GID the QPs send from: Config.GIDIndex's.
func (c *conn) gid() [16]byte {
	g, err := c.dev.QueryGID(c.cfg.GIDIndex)
	if err != nil { // checked in defaults: only a closed device
		return c.dev.GID()
	}
	return g
}

func (c *conn) localDests() []Dest {
	out := make([]Dest, len(c.qps))
	for i, q := range c.qps {
		out[i] = Dest{QPN: q.Num(), PSN: c.psn, GID: c.gid()}
	}
	return out
}

func (c *conn) exchange(ctx context.Context) error {
	cfg := c.cfg
	n := 1
	if cfg.Kind == SRQ {
		n = srqRecords
	}
	local := c.localDests()
	for _, d := range local {
		fmt.Fprintf(cfg.Out, "  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", d.LID, d.QPN, d.PSN, GIDString(d.GID))
	}
	var tc net.Conn
	var err error
	if cfg.Server != "" {
		// One attempt, as the C tools make: a server that is not
		// listening yet is an error at once, not a wait.
		d := net.Dialer{Timeout: cfg.Timeout}
		addr := net.JoinHostPort(cfg.Server, strconv.Itoa(cfg.TCPPort))
		if tc, err = d.DialContext(ctx, "tcp", addr); err != nil {
			return fmt.Errorf("pingpong: couldn't connect to %s: %w", addr, err)
		}
		defer tc.Close()
		if err := writeDests(tc, local, n); err != nil {
			return err
		}
		if c.remote, err = readDests(tc, n, len(c.qps)); err != nil {
			return err
		}
		if err := c.connect(); err != nil {
			return err
		}
		if _, err := tc.Write([]byte(doneMsg)); err != nil {
			return err
		}
	} else {
		ln := cfg.Listener
		if ln == nil {
			if ln, err = net.Listen("tcp", ":"+strconv.Itoa(cfg.TCPPort)); err != nil {
				return fmt.Errorf("pingpong: couldn't listen to port %d: %w", cfg.TCPPort, err)
			}
			defer ln.Close()
		}
		type acc struct {
			c   net.Conn
			err error
		}
		ch := make(chan acc, 1)
		go func() { a, err := ln.Accept(); ch <- acc{a, err} }()
		select {
		case a := <-ch:
			if a.err != nil {
				return a.err
			}
			tc = a.c
		case <-ctx.Done():
			ln.Close()
			return ctx.Err()
		case <-time.After(cfg.Timeout):
			ln.Close()
			return fmt.Errorf("pingpong: no client connected on port %d within the %v timeout", cfg.TCPPort, cfg.Timeout)
		}
		defer tc.Close()
		if c.remote, err = readDests(tc, n, len(c.qps)); err != nil {
			return err
		}
		if err := c.connect(); err != nil {
			return err
		}
		if err := writeDests(tc, local, n); err != nil {
			return err
		}
		done := make([]byte, len(doneMsg))
		if _, err := io.ReadFull(tc, done); err != nil {
			return fmt.Errorf("pingpong: waiting for the client's done: %w", err)
		}
	}
	for _, d := range c.remote {
		fmt.Fprintf(cfg.Out, "  remote address: LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", d.LID, d.QPN, d.PSN, GIDString(d.GID))
	}
	return nil
}

func (c *conn) connect() error {
	mtu, _ := rxego.MTUFromBytes(c.cfg.MTU)
	if c.cfg.Kind == UD {
		var err error
		c.ah, err = c.pd.CreateAHFrom(c.cfg.GIDIndex, netip.AddrPortFrom(c.remote[0].Addr(), rxego.DefaultPort))
		return err
	}
	for i, q := range c.qps {
		r := rxego.RemoteQP{Addr: netip.AddrPortFrom(c.remote[i].Addr(), rxego.DefaultPort), QPN: c.remote[i].QPN, PSN: c.remote[i].PSN,
			SGIDIndex: c.cfg.GIDIndex}
		if err := q.Connect(r, &rxego.ConnectOptions{MTU: mtu, LocalPSN: c.psn, MinRNRTimer: 12}); err != nil {
			return err
		}
	}
	return nil
}

// pattern fills b with a self-describing pattern: 8 bytes hold seq, the
// rest are derived from it, so any receiver can check a message whether
// it is an echo (from the C tools) or rxego's own. In a message of more
// than 8 bytes the first byte of every 4 KiB page is 0 and seq follows
// the first: what ibv_rc_pingpong -c (--chk) checks in the messages it
// receives (see checkedFirst). A shorter message is seq alone.
func pattern(b []byte, seq uint64) {
	var hdr [8]byte
	binary.LittleEndian.PutUint64(hdr[:], seq)
	at := 0
	if len(b) > len(hdr) {
		at = 1
	}
	n := at + copy(b[at:], hdr[:])
	x := seq*0x9e3779b97f4a7c15 + 1
	for i := n; i < len(b); i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	if at == 1 {
		for i := 0; i < len(b); i += 4 << 10 {
			b[i] = 0
		}
	}
}

// consistent reports whether b carries an intact pattern.
func consistent(b []byte) bool {
	if len(b) < 8 {
		return false
	}
	seq := binary.LittleEndian.Uint64(b)
	if len(b) > 8 {
		seq = binary.LittleEndian.Uint64(b[1:])
	}
	want := make([]byte, len(b))
	pattern(want, seq)
	return bytes.Equal(want, b)
}

func (c *conn) postSend(qi int) error {
	cfg := c.cfg
	at := qi * cfg.Size
	msg := c.send[at : at+cfg.Size]
	if cfg.Verify {
		c.seq++
		pattern(msg, c.seq)
		c.history[c.histNext] = append(c.history[c.histNext][:0], msg...)
		c.histNext = (c.histNext + 1) % len(c.history)
	}
	wr := rxego.SendWR{ID: sendWRID, Opcode: rxego.WRSend, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: c.mr.IOVA() + uint64(len(c.buf)-len(c.send)+at), Length: uint32(cfg.Size), LKey: c.mr.LKey()}}}
	if cfg.Kind == UD {
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = c.ah, c.remote[0].QPN, udQKey
	}
	return c.qps[qi].PostSend(wr)
}

// check accepts a received message that is either the tools' fill byte
// throughout (the peer's first send: 0x7b, 0 for ibv_srq_pingpong), the
// fill with the first byte of every page zeroed (the first send of
// ibv_rc_pingpong -c, see checkedFirst), or an echo of something we sent.
func (c *conn) check(got []byte) {
	if !c.cfg.Verify {
		return
	}
	fill := byte(fillByte)
	if c.cfg.Kind == SRQ {
		fill = srqFillByte
	}
	if bytes.Count(got, []byte{fill}) == len(got) || checkedFirst(got, fill) || consistent(got) {
		return
	}
	if c.cfg.Kind == SRQ {
		if !c.pieced(got, fill) {
			c.mismatch++
		}
		return
	}
	for _, h := range c.history {
		if bytes.Equal(got, h) {
			return
		}
	}
	c.mismatch++
}

// checkedFirst reports whether got is what the C tools send first with
// -c (--chk): before its first send the client stores
// i / page_size % sizeof(char), which is 0, at every page start i of its
// buffer, which otherwise holds the fill byte. Page sizes of 4, 16 and
// 64 KiB are accepted, as the peer's may be any.
func checkedFirst(got []byte, fill byte) bool {
	if len(got) == 0 || got[0] != 0 {
		return false
	}
next:
	for _, page := range []int{4 << 10, 16 << 10, 64 << 10} {
		for i, b := range got {
			want := fill
			if i%page == 0 {
				want = 0
			}
			if b != want {
				continue next
			}
		}
		return true
	}
	return false
}

// pieced reports whether got is made of runs, each the same bytes at the
// same offsets of the fill or of a message we sent recently.
// ibv_srq_pingpong receives for all its QPs into one buffer and sends
// from it, so an echo can mix two of our messages: whole packets, and,
// as the guest's kernel copies one QP's arriving packet into the buffer
// while it reads another's reply out of it, at any byte within a packet
// too. A byte no candidate has at its offset is still a mismatch.
func (c *conn) pieced(got []byte, fill byte) bool {
	for off := 0; off < len(got); {
		run := 0
		for run < len(got)-off && got[off+run] == fill {
			run++
		}
		for _, h := range c.history {
			if len(h) != len(got) {
				continue
			}
			n := 0
			for n < len(got)-off && got[off+n] == h[off+n] {
				n++
			}
			run = max(run, n)
		}
		if run == 0 {
			return false
		}
		off += run
	}
	return true
}

func (c *conn) qpIndex(num uint32) int {
	for i, q := range c.qps {
		if q.Num() == num {
			return i
		}
	}
	return -1
}

func (c *conn) loop(ctx context.Context) (Result, error) {
	cfg := c.cfg
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	pending := make([]int, len(c.qps))
	start := time.Now()
	if cfg.Server != "" {
		for i := range c.qps {
			if err := c.postSend(i); err != nil {
				return Result{}, err
			}
			pending[i] = sendWRID | recvWRID
		}
	} else {
		for i := range pending {
			pending[i] = recvWRID
		}
	}
	var scnt, rcnt int
	routs := cfg.RxDepth
	wcs := make([]rxego.WC, 16)
	for rcnt < cfg.Iters || scnt < cfg.Iters {
		var n int
		if cfg.Events {
			var err error
			if n, err = c.cq.PollWait(ctx, wcs); err != nil {
				return Result{}, c.waitError(scnt, rcnt, err)
			}
		} else {
			// rxego's engine runs on goroutines of this process: a busy
			// poll must leave it the CPU, unlike with a NIC. Spinning on
			// with runtime.Gosched starves the runtime's network poller
			// (it then polls only from sysmon, every 10 ms: 9 ms per round
			// trip was measured), so after a short spin the poll blocks.
			for spin := time.Now(); n == 0 && time.Since(spin) < pollSpin; {
				var err error
				if n, err = c.cq.Poll(wcs); err != nil {
					return Result{}, c.waitError(scnt, rcnt, err)
				} else if n == 0 {
					runtime.Gosched()
				}
			}
			if n == 0 {
				var err error
				if n, err = c.cq.PollWait(ctx, wcs); err != nil {
					return Result{}, c.waitError(scnt, rcnt, err)
				}
			}
		}
		for _, wc := range wcs[:n] {
			if rcnt >= cfg.Iters && scnt >= cfg.Iters {
				// Done: what follows in the batch is not the run's (with
				// rdma_cm, receives flushed by the peer's disconnect).
				break
			}
			if wc.Status != 0 {
				return Result{}, fmt.Errorf("pingpong: failed status %s (%d) for wr_id %d", wc.Status, wc.Status, wc.ID)
			}
			qi := c.qpIndex(wc.QPN)
			if qi < 0 {
				return Result{}, fmt.Errorf("pingpong: completion for unknown QP %d", wc.QPN)
			}
			kind := wc.ID & wrKindMask
			switch kind {
			case sendWRID:
				scnt++
			case recvWRID:
				c.checkRecv(wc)
				routs--
				if routs <= len(c.qps) {
					for routs < cfg.RxDepth {
						if err := c.postRecv(qi); err != nil {
							return Result{}, err
						}
						routs++
					}
				}
				rcnt++
			default:
				return Result{}, fmt.Errorf("pingpong: completion for unknown wr_id %d", wc.ID)
			}
			pending[qi] &^= int(kind)
			if scnt < cfg.Iters && pending[qi] == 0 {
				if err := c.postSend(qi); err != nil {
					return Result{}, err
				}
				pending[qi] = recvWRID | sendWRID
			}
		}
	}
	el := time.Since(start)
	bytesMoved := int64(cfg.Size) * int64(cfg.Iters) * 2
	fmt.Fprintf(cfg.Out, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", bytesMoved, el.Seconds(), float64(bytesMoved)*8/el.Seconds()/1e6)
	fmt.Fprintf(cfg.Out, "%d iters in %.2f seconds = %.2f usec/iter\n", cfg.Iters, el.Seconds(), float64(el.Microseconds())/float64(cfg.Iters))
	res := Result{Bytes: bytesMoved, Iters: cfg.Iters, Elapsed: el, Mismatches: c.mismatch}
	if cfg.Verify {
		fmt.Fprintf(cfg.Out, "verify: %d of %d received messages matched\n", rcnt-c.mismatch, rcnt)
		if c.mismatch > 0 {
			return res, fmt.Errorf("pingpong: %d received messages had unexpected contents", c.mismatch)
		}
	}
	return res, nil
}

// waitError says why waiting for completions ended: the timeout is named
// as such, with how far the run got.
func (c *conn) waitError(scnt, rcnt int, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("pingpong: no completion within the %v timeout after %d of %d sends and %d receives (the peer stopped answering)",
			c.cfg.Timeout, scnt, c.cfg.Iters, rcnt)
	}
	return fmt.Errorf("pingpong: after %d sends and %d receives: %w", scnt, rcnt, err)
}

// checkRecv checks the slot a receive completion names in its wr_id and
// frees the slot.
func (c *conn) checkRecv(wc rxego.WC) {
	i := int(wc.ID >> wrKindBits)
	if i >= c.cfg.RxDepth {
		c.mismatch++
		return
	}
	c.free = append(c.free, i)
	slot := c.buf[i*c.slot : (i+1)*c.slot]
	n := int(wc.ByteLen)
	if c.cfg.Kind == UD {
		slot = slot[rxego.GRHLen:]
		n -= rxego.GRHLen
	}
	if n < 0 || n > len(slot) {
		c.mismatch++
		return
	}
	c.check(slot[:n])
}
