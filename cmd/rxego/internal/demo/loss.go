package demo

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/rxego/rxego"
)

// lossSize is the loss scenario's WRITE: five packets at MTU 1024.
const lossSize = 4600

// loss drops the second packet of a five-packet WRITE on its way to Bob
// and shows Go-back-N recovering it: Bob sees a PSN gap and NAKs, Alice
// resends from the lost packet on.
func (t *Tour) loss() error {
	a, b := t.a, t.b
	for i := range lossSize {
		a.buf[i] = byte('a' + i%26)
	}
	ea, eb := a.dev.Stats(), b.dev.Stats()
	retx0, seq0, nak0 := ea.Retransmits, ea.RcvdSeqErr, eb.NAKsSent
	t.say("%s WRITEs %d bytes: five packets with consecutive PSNs. The network on %s's side will lose the second one.", a.name, lossSize, b.name)
	t.lossy.dropNth(2)
	if err := a.qp.PostSend(writeWR(a, b, 8, 0, 10000, lossSize)); err != nil {
		return err
	}
	wc, err := wait(a)
	if err != nil {
		return err
	}
	b.dev.Sync()
	if !bytes.Equal(b.buf[10000:10000+lossSize], a.buf[:lossSize]) {
		return errors.New("the bytes did not land intact")
	}
	if t.lossy.dropped.Load() != 1 {
		return fmt.Errorf("%d packets dropped, want 1", t.lossy.dropped.Load())
	}
	ea, eb = a.dev.Stats(), b.dev.Stats()
	retx, seq, nak := ea.Retransmits-retx0, ea.RcvdSeqErr-seq0, eb.NAKsSent-nak0
	if retx == 0 || seq == 0 || nak == 0 {
		return fmt.Errorf("no recovery seen: %d retransmitted, %d sequence NAKs received, %d NAKs sent", retx, seq, nak)
	}
	t.say("%s's responder saw the third packet where it expected the second: a PSN gap. It sent one NAK", b.name)
	t.say("(PSN sequence error, naming the PSN it expected) and ignored what followed until that PSN came.")
	t.say("%s went back to the lost PSN and sent it and everything after it again (Go-back-N): %d packets resent.", a.name, retx)
	t.say("%s's completion: %s; %s's memory holds all %d bytes, in order.", a.name, wcString(wc), b.name, lossSize)
	return nil
}

// writeWR is a signaled RDMA WRITE of n bytes from a's buffer at off to
// b's at remoteOff.
func writeWR(a, b *end, id uint64, off, remoteOff, n int) rxego.SendWR {
	return rxego.SendWR{ID: id, Opcode: rxego.WRWrite, Flags: rxego.SendSignaled, SGL: a.sge(off, n),
		RemoteAddr: b.mr.IOVA() + uint64(remoteOff), RKey: b.mr.RKey()}
}
