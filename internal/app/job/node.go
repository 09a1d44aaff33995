package job

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"syscall"
	"time"

	"github.com/rxego/rxego"
)

// NodeConfig describes one rank's RDMA resources.
type NodeConfig struct {
	// Addr is the device's address; empty picks a free random loopback
	// address in 127.0.0.0/8 (outside 127.0.0.0/24).
	Addr string
	// Buf is registered with Access as the node's one MR.
	Buf    []byte
	Access rxego.Access
	// QPs is how many RC QPs to create, each with SendDepth send and
	// RecvDepth receive WRs; their send completions go to one CQ and
	// their receive completions to another, each of CQDepth entries.
	QPs, SendDepth, RecvDepth, CQDepth int
	// Window is the PSNs each QP may leave unacknowledged; 0 means 1,024
	// (4 MiB at MTU 4096). Several QPs sending into one peer device
	// should share that: see DefaultWindow.
	Window int
	// Options configure the device (a Tap); nil: the defaults. A zero
	// Options.Window is replaced by Window.
	Options *rxego.Options
}

// Node is one rank's device, protection domain, CQs, registered buffer
// and RC QPs.
type Node struct {
	Dev            *rxego.Device
	PD             *rxego.PD
	SendCQ, RecvCQ *rxego.CQ
	MR             *rxego.MR
	Buf            []byte
	QPs            []*rxego.QP
}

// Endpoint is what a peer must know of a node to connect to its QPs and
// to address its buffer: the out-of-band record.
type Endpoint struct {
	Addr netip.AddrPort
	QPNs []uint32
	PSN  uint32
	VA   uint64
	RKey uint32
	Len  int
}

// startPSN is every node's first send PSN (any value works; peers learn it).
const startPSN = 0x1000

// DefaultWindow is the unacknowledged PSNs a node's QPs may have in
// flight towards one peer device, all together: 1,024 PSNs are 4 MiB at
// MTU 4096, the receive buffer of the peer's UDP socket
// (transport's default, and net.core.rmem_max on the development VM).
// QPs that each keep a full 1,024 overflow that buffer: the kernel drops
// datagrams, and Go-back-N resends cost far more than the deeper window
// gains (a 244 MiB transfer over 4 QPs sent 2.4 times its packets and
// ran 5 times slower).
const DefaultWindow = 1024

// OpenNode opens a device and creates the node's resources.
func OpenNode(c NodeConfig) (*Node, error) {
	var o rxego.Options
	if c.Options != nil {
		o = *c.Options
	}
	if o.Window == 0 {
		o.Window = cmp.Or(c.Window, DefaultWindow)
	}
	dev, err := openDevice(c.Addr, &o)
	if err != nil {
		return nil, err
	}
	n := &Node{Dev: dev, Buf: c.Buf}
	if err := n.setup(c); err != nil {
		dev.Close()
		return nil, err
	}
	return n, nil
}

func (n *Node) setup(c NodeConfig) (err error) {
	if n.PD, err = n.Dev.AllocPD(); err != nil {
		return err
	}
	if n.SendCQ, err = n.Dev.CreateCQ(max(c.CQDepth, 1)); err != nil {
		return err
	}
	if n.RecvCQ, err = n.Dev.CreateCQ(max(c.CQDepth, 1)); err != nil {
		return err
	}
	if n.MR, err = n.PD.RegMR(c.Buf, c.Access|rxego.AccessLocalWrite); err != nil {
		return err
	}
	for range c.QPs {
		q, err := n.PD.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: n.SendCQ, RecvCQ: n.RecvCQ,
			Caps: rxego.Caps{MaxSendWR: max(c.SendDepth, 1), MaxRecvWR: max(c.RecvDepth, 1), MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			return err
		}
		if err := q.Init(0); err != nil {
			return err
		}
		n.QPs = append(n.QPs, q)
	}
	return nil
}

// openDevice opens a device on addr, or on a free random loopback
// address when addr is empty.
func openDevice(addr string, o *rxego.Options) (*rxego.Device, error) {
	if addr != "" {
		return rxego.Open(addr, o)
	}
	var err error
	for range 50 {
		a := netip.AddrFrom4([4]byte{127, byte(1 + rand.IntN(254)), byte(rand.IntN(256)), byte(1 + rand.IntN(254))})
		var d *rxego.Device
		if d, err = rxego.Open(a.String(), o); err == nil {
			return d, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, fmt.Errorf("job: no free loopback address: %w", err)
}

// Endpoint returns the node's out-of-band record.
func (n *Node) Endpoint() Endpoint {
	e := Endpoint{Addr: n.Dev.Addr(), PSN: startPSN, VA: n.MR.IOVA(), RKey: n.MR.RKey(), Len: len(n.Buf)}
	for _, q := range n.QPs {
		e.QPNs = append(e.QPNs, q.Num())
	}
	return e
}

// Connect joins local QP i to the peer's QP j (RC, MTU 4096, up to 16
// READs outstanding each way).
func (n *Node) Connect(i int, peer Endpoint, j int) error {
	if i < 0 || i >= len(n.QPs) || j < 0 || j >= len(peer.QPNs) {
		return fmt.Errorf("job: no QP pair %d-%d (have %d local, %d remote)", i, j, len(n.QPs), len(peer.QPNs))
	}
	return n.QPs[i].Connect(rxego.RemoteQP{Addr: peer.Addr, QPN: peer.QPNs[j], PSN: peer.PSN},
		&rxego.ConnectOptions{MTU: 5, LocalPSN: startPSN, MaxRdAtomic: 16, MinRNRTimer: 1})

}

// SGE is the SGE of n bytes of the node's buffer at off.
func (n *Node) SGE(off, length int) []rxego.SGE {
	return []rxego.SGE{{Addr: n.MR.IOVA() + uint64(off), Length: uint32(length), LKey: n.MR.LKey()}}
}

// Close stops the device.
func (n *Node) Close() error { return n.Dev.Close() }

// Poll waits for completions of cq into wcs until ctx ends, and fails on
// the first unsuccessful one.
func Poll(ctx context.Context, cq *rxego.CQ, wcs []rxego.WC) (int, error) {
	k, err := cq.PollWait(ctx, wcs)
	if err != nil {
		return 0, err
	}
	for _, wc := range wcs[:k] {
		if wc.Status != 0 {
			return 0, fmt.Errorf("completion of WR %d on QP %d: %v", wc.ID, wc.QPN, wc.Status)
		}
	}
	return k, nil
}

// CPU is the CPU time (user and system) this process has used so far,
// from getrusage(RUSAGE_SELF): every thread, the device's included.
func CPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// DeviceOptions is devices(rank), or nil when devices is nil: the
// examples' hook for giving each rank's device its options in-process.
func DeviceOptions(devices func(rank int) *rxego.Options, rank int) *rxego.Options {
	if devices == nil {
		return nil
	}
	return devices(rank)
}

// Drops is how many datagrams the node's socket dropped or refused so
// far (receive-buffer overflows above all): a run with drops paid for
// Go-back-N recovery.
func (n *Node) Drops() uint64 { return n.Dev.Transport().Stats().Dropped() }

// Link names the peer of one of a node's QPs: local QP Local joins QP
// QP of rank Rank.
type Link struct{ Local, Rank, QP int }

// OpenLinked opens rank r's node, all-gathers every rank's Endpoint and
// connects the node's QPs as links say: the set-up every example's
// ranks share. It returns the node and every rank's Endpoint.
func OpenLinked(r *Rank, c NodeConfig, links []Link) (*Node, []Endpoint, error) {
	n, err := OpenNode(c)
	if err != nil {
		return nil, nil, err
	}
	var eps []Endpoint
	err = r.AllGather(n.Endpoint(), &eps)
	for _, l := range links {
		if err != nil {
			break
		}
		if l.Rank < 0 || l.Rank >= len(eps) {
			err = fmt.Errorf("job: no rank %d to link to", l.Rank)
			break
		}
		err = n.Connect(l.Local, eps[l.Rank], l.QP)
	}
	if err != nil {
		n.Close()
		return nil, nil, err
	}
	return n, eps, nil
}
