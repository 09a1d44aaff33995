package dcqcn

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rxego/rxego"
)

// Addresses of the two ends. The /24 holds nothing else and nothing routes
// out of the namespaces.
const (
	SenderAddr   = "198.18.2.1"
	ReceiverAddr = "198.18.2.2"
	prefix       = "/24"
)

// MTU is the flows' path MTU: every packet of a MsgSize WRITE carries
// this many payload bytes.
const MTU = 4096

// vethMTU leaves room for MTU-byte RoCE payloads plus headers.
const vethMTU = 9000

// Testbed is a sender device and a receiver device, each in its own
// network namespace, joined by a veth pair; the marker sits in the
// receiver's namespace.
type Testbed struct {
	SendNS, RecvNS *Netns
	Sender         *rxego.Device
	Receiver       *rxego.Device
	Marker         *Marker

	mu    sync.Mutex
	flows []*Flow
}

// NewTestbed builds the namespaces and the link and opens one device per
// side with opts (the same options on both ends: the sender needs the
// reaction point, the receiver the notification point).
func NewTestbed(opts *rxego.Options) (tb *Testbed, err error) {
	Cleanup()
	tb = &Testbed{}
	defer func() {
		if err != nil {
			tb.Close()
		}
	}()
	if tb.SendNS, err = NewNetns("s"); err != nil {
		return nil, err
	}
	if tb.RecvNS, err = NewNetns("r"); err != nil {
		return nil, err
	}
	if err = Veth(tb.SendNS, tb.RecvNS, SenderAddr+prefix, ReceiverAddr+prefix, vethMTU); err != nil {
		return nil, err
	}
	// The marker counts packets, and a UDP GSO datagram (up to 64 packets)
	// would cross veth whole and count as one. Without UDP segmentation
	// offload on the sender's end the kernel cuts it into its packets as
	// it leaves: rxego still sends a run in one system call, and every
	// packet meets the marker on its own.
	if err = tb.SendNS.Run("ethtool", "-K", "veth0", "tx-udp-segmentation", "off"); err != nil {
		return nil, err
	}
	if err = tb.SendNS.Do(func() (err error) { tb.Sender, err = rxego.Open(SenderAddr, opts); return }); err != nil {
		return nil, err
	}
	if err = tb.RecvNS.Do(func() (err error) { tb.Receiver, err = rxego.Open(ReceiverAddr, opts); return }); err != nil {
		return nil, err
	}
	tb.Marker = &Marker{ns: tb.RecvNS}
	return tb, nil
}

// Flows returns the flows started so far, in start order.
func (tb *Testbed) Flows() []*Flow {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return append([]*Flow(nil), tb.flows...)
}

// Close stops the flows, closes the devices and deletes the namespaces.
func (tb *Testbed) Close() error {
	for _, f := range tb.Flows() {
		f.Stop()
	}
	var errs []error
	for _, d := range []*rxego.Device{tb.Sender, tb.Receiver} {
		if d != nil {
			errs = append(errs, d.Close())
		}
	}
	for _, n := range []*Netns{tb.SendNS, tb.RecvNS} {
		if n != nil {
			errs = append(errs, n.Close())
		}
	}
	return errors.Join(errs...)
}

// Flow settings.
const (
	// MsgSize is the size of each RDMA WRITE with immediate a flow posts:
	// small enough that the receiver's completions measure the rate finely.
	MsgSize = 32 << 10
	// depth is how many WRITEs a flow keeps posted: enough to keep the
	// window (256 packets of 4 KiB) full, so the flow is always backlogged.
	depth = 64
)

// Flow is one backlogged RC connection from the sender device to the
// receiver device, writing MsgSize-byte messages with immediate data as
// fast as its QP lets it. The receiver counts the bytes it completes.
type Flow struct {
	Send, Recv *rxego.QP

	rcvd   atomic.Uint64 // bytes completed at the receiver
	failed atomic.Value  // error, the first failure of either loop

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// StartFlow connects a new QP pair and starts its sender and receiver
// loops.
func (tb *Testbed) StartFlow() (*Flow, error) {
	f := &Flow{}
	side := func(d *rxego.Device) (*rxego.QP, *rxego.CQ, *rxego.MR, error) {
		pd, err := d.AllocPD()
		if err != nil {
			return nil, nil, nil, err
		}
		m, err := pd.RegMR(make([]byte, MsgSize), rxego.AccessLocalWrite|rxego.AccessRemoteWrite)
		if err != nil {
			return nil, nil, nil, err
		}
		cq, err := d.CreateCQ(4 * depth)
		if err != nil {
			return nil, nil, nil, err
		}
		q, err := pd.CreateQP(rxego.QPInitAttr{Type: rxego.RC, SendCQ: cq, RecvCQ: cq,
			Caps: rxego.Caps{MaxSendWR: 2 * depth, MaxRecvWR: 2 * depth, MaxSendSGE: 1, MaxRecvSGE: 1}})
		return q, cq, m, err
	}
	sq, scq, smr, err := side(tb.Sender)
	if err != nil {
		return nil, err
	}
	rq, rcq, rmr, err := side(tb.Receiver)
	if err != nil {
		return nil, err
	}
	f.Send, f.Recv = sq, rq
	if err := rq.Init(0); err != nil {
		return nil, err
	}
	for i := 0; i < 2*depth; i++ {
		if err := rq.PostRecv(rxego.RecvWR{ID: uint64(i)}); err != nil {
			return nil, err
		}
	}
	// Timeout 16 (268 ms): the machine may be busy, and a retransmission
	// timer firing because the receiver was not scheduled would only add
	// duplicate traffic; veth loses nothing.
	o := &rxego.ConnectOptions{MTU: rxego.MTU4096, Timeout: 16}
	if err := sq.Connect(rxego.RemoteQP{Addr: tb.Receiver.Addr(), QPN: rq.Num()}, o); err != nil {
		return nil, err
	}
	if err := rq.Connect(rxego.RemoteQP{Addr: tb.Sender.Addr(), QPN: sq.Num()}, o); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	wr := rxego.SendWR{Opcode: rxego.WRWriteImm, Flags: rxego.SendSignaled,
		SGL: []rxego.SGE{{Addr: smr.IOVA(), Length: MsgSize, LKey: smr.LKey()}}, RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}
	f.wg.Add(2)
	go func() { defer f.wg.Done(); f.sendLoop(ctx, scq, wr) }()
	go func() { defer f.wg.Done(); f.recvLoop(ctx, rcq) }()
	tb.mu.Lock()
	tb.flows = append(tb.flows, f)
	tb.mu.Unlock()
	return f, nil
}

// sendLoop keeps depth WRITEs posted until ctx is done.
func (f *Flow) sendLoop(ctx context.Context, cq *rxego.CQ, wr rxego.SendWR) {
	for i := 0; i < depth; i++ {
		if err := f.Send.PostSend(wr); err != nil {
			f.fail(err)
			return
		}
	}
	wcs := make([]rxego.WC, depth)
	for {
		n, err := cq.PollWait(ctx, wcs)
		if err != nil {
			return // ctx done
		}
		for _, wc := range wcs[:n] {
			if wc.Status != rxego.WCSuccess {
				f.fail(fmt.Errorf("send completion %v", wc.Status))
				return
			}
			if err := f.Send.PostSend(wr); err != nil {
				f.fail(err)
				return
			}
		}
	}
}

// recvLoop counts the bytes of each completed WRITE with immediate and
// posts a new receive for it.
func (f *Flow) recvLoop(ctx context.Context, cq *rxego.CQ) {
	wcs := make([]rxego.WC, depth)
	for {
		n, err := cq.PollWait(ctx, wcs)
		if err != nil {
			return
		}
		for _, wc := range wcs[:n] {
			if wc.Status != rxego.WCSuccess || wc.Opcode != rxego.WCRecvRDMAImm {
				f.fail(fmt.Errorf("receive completion %v opcode %v", wc.Status, wc.Opcode))
				return
			}
			f.rcvd.Add(uint64(wc.ByteLen))
			if err := f.Recv.PostRecv(rxego.RecvWR{ID: wc.ID}); err != nil {
				f.fail(err)
				return
			}
		}
	}
}

func (f *Flow) fail(err error) { f.failed.CompareAndSwap(nil, err) }

// Err returns the first error either loop met, or nil.
func (f *Flow) Err() error {
	if err, ok := f.failed.Load().(error); ok {
		return err
	}
	return nil
}

// Received returns the bytes the receiver has completed so far.
func (f *Flow) Received() uint64 { return f.rcvd.Load() }

// Stop ends the flow's loops (the QPs stay until the devices close).
func (f *Flow) Stop() {
	if f.cancel != nil {
		f.cancel()
		f.wg.Wait()
	}
}
