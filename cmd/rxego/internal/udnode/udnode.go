// Package udnode is the per-connection resources of the rdma_cm UD tools
// (udaddy, mckey): one UD QP with its CQ and a buffer of receive slots,
// as their C originals' struct cmatest_node.
package udnode

import (
	"context"
	"fmt"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
)

// Node is one UD QP, activated with Q_Key cm.UDPQKey, with Count receives
// posted: one slot of Size plus the GRH per message, so that a slot is
// never written while it is read, and one more slot to send from.
type Node struct {
	Tool string // names the tool in errors
	PD   *rxego.PD
	CQ   *rxego.CQ
	QP   *rxego.QP
	MR   *rxego.MR
	AH   *rxego.AH // where Send goes
	QPN  uint32    // the destination QP of Send
	slot int       // receive slot size: Size + the GRH
	buf  []byte
}

// New makes a node on dev for count messages of size bytes.
func New(dev *rxego.Device, tool string, count, size int) (*Node, error) {
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	slot := size + rxego.GRHLen
	n := &Node{Tool: tool, PD: pd, slot: slot, buf: make([]byte, (count+1)*slot)}
	if n.CQ, err = dev.CreateCQ(2 * count); err != nil {
		return nil, err
	}
	if n.QP, err = pd.CreateQP(rxego.QPInitAttr{Type: rxego.UD, SendCQ: n.CQ, RecvCQ: n.CQ,
		Caps: rxego.Caps{MaxSendWR: count, MaxRecvWR: count, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return nil, err
	}
	if n.MR, err = pd.RegMR(n.buf, rxego.AccessLocalWrite); err != nil {
		return nil, err
	}
	if err := n.QP.ActivateUD(cm.UDPQKey, 0); err != nil {
		return nil, err
	}
	for i := range count {
		if err := n.QP.PostRecv(rxego.RecvWR{ID: uint64(i), SGL: []rxego.SGE{{Addr: n.MR.IOVA() + uint64(i*slot), Length: uint32(slot), LKey: n.MR.LKey()}}}); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// At returns receive slot i, or the send slot for i = count.
func (n *Node) At(i int) []byte { return n.buf[i*n.slot : (i+1)*n.slot] }

// Send posts count SEND with Immediate messages of size bytes from slot
// from to n.AH and n.QPN, the immediate being n's own QPN (as the C tools
// send it), the last one signaled so that one completion says all went.
func (n *Node) Send(from, count, size int) error {
	for i := range count {
		wr := rxego.SendWR{Opcode: rxego.WRSendImm, Imm: n.QP.Num(), AH: n.AH, RemoteQPN: n.QPN, RemoteQKey: cm.UDPQKey,
			SGL: []rxego.SGE{{Addr: n.MR.IOVA() + uint64(from*n.slot), Length: uint32(size), LKey: n.MR.LKey()}}}
		if i == count-1 {
			wr.Flags = rxego.SendSignaled
		}
		if err := n.QP.PostSend(wr); err != nil {
			return err
		}
	}
	return nil
}

// Poll waits for count successful completions of kind op; check sees
// each. Any other status fails.
func (n *Node) Poll(ctx context.Context, count int, op rxego.WCOpcode, check func(rxego.WC) error) error {
	wcs := make([]rxego.WC, 8)
	for done := 0; done < count; {
		k, err := n.CQ.PollWait(ctx, wcs[:min(len(wcs), count-done)])
		if err != nil {
			return err
		}
		for _, wc := range wcs[:k] {
			if wc.Status != rxego.WCSuccess {
				return fmt.Errorf("%s: completion %v: %v", n.Tool, wc.Opcode, wc.Status)
			}
			if wc.Opcode != op {
				continue
			}
			if err := check(wc); err != nil {
				return err
			}
			done++
		}
	}
	return nil
}

// Close destroys the node's QP and CQ and frees its MR and PD.
func (n *Node) Close() {
	n.QP.Destroy()
	n.CQ.Close()
	n.MR.Deregister()
	n.PD.Dealloc()
}
