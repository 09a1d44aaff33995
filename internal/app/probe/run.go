package probe

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/reth"
)

// DefaultWait is how long the probe waits for each expected response, and
// how long "expect none" listens for silence.
const DefaultWait = 300 * time.Millisecond

// qpRun is one scenario running on one of the peer's QPs.
type qpRun struct {
	s     *Scenario
	w     *wire
	ctx   context.Context
	myQPN uint32 // the QP number the probe announced (where responses go)
	peer  peerQP
	base  uint32 // the start PSN
	next  int    // the next PSN, relative to base
	mtu   int
	wait  time.Duration
	// uc: the peer's QP is unreliable connected (ibv_uc_pingpong): its
	// own messages are not acknowledged, UC has no ACKs.
	uc bool
	// peerMsg: nextArrival hands back the last packet of the peer's own
	// message instead of only recording it ("expect peer-send").
	peerMsg bool
	vars    map[string]uint64
	got     []string // the peer's packets, summarised
	detail  string
}

// peerQP is what the handshake told the probe about one of the peer's QPs.
type peerQP struct {
	QPN   uint32
	PSN   uint32
	RKey  uint32
	VAddr uint64
}

// errStep is a step whose expectation failed.
type errStep struct {
	step *Step
	msg  string
}

func (e *errStep) Error() string { return e.msg }

// run executes the scenario's steps and returns its verdict.
func (q *qpRun) run() (Verdict, error) {
	q.vars = map[string]uint64{}
	for i := range q.s.Steps {
		st := &q.s.Steps[i]
		var err error
		switch st.Kind {
		case StepSend:
			err = q.send(st)
		case StepExpect:
			err = q.expect(st)
		case StepWait:
			err = q.pause(st.Wait)
		}
		var es *errStep
		if errors.As(err, &es) {
			q.detail = fmt.Sprintf("line %d: %s", st.Line, es.msg)
			q.drain(min(q.wait, 200*time.Millisecond))
			switch {
			case st.Pre:
				return Inconclusive, nil
			case q.s.Optional:
				return NotApplicable, nil
			}
			return Deviates, nil
		}
		if err != nil {
			return Inconclusive, err
		}
	}
	// Whatever else the peer sends right after is shown, not judged.
	q.drain(min(q.wait, 100*time.Millisecond))
	return Conforms, nil
}

func (q *qpRun) pause(d time.Duration) error {
	select {
	case <-q.ctx.Done():
		return q.ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// send builds and sends one scripted packet.
func (q *qpRun) send(st *Step) error {
	rel := q.next
	if st.PSN != nil {
		rel = *st.PSN
	}
	psn := bth.PSN(uint32(int(q.base)+rel) & bth.PSNMask)
	h := bth.Header{Opcode: st.Op, PKey: bth.DefaultPKey, DestQP: q.peer.QPN, PSN: psn, AckReq: st.AckReq, TVer: st.TVer}
	if st.PKey != nil {
		h.PKey = *st.PKey
	}
	rkey := q.peer.RKey
	switch st.RKey {
	case RKeyPeer:
	case RKeyBad:
		rkey ^= 0x5a // the key byte: a region that was never registered so
	default:
		v, err := strconv.ParseUint(st.RKey, 0, 32)
		if err != nil {
			return fmt.Errorf("probe: scenario %s line %d: rkey %q: %w", q.s.Name, st.Line, st.RKey, err)
		}
		rkey = uint32(v)
	}
	va := q.peer.VAddr + uint64(st.VAOff)
	if st.Addr != nil {
		va = *st.Addr
	}
	info, _ := bth.Lookup(st.Op)
	var payload []byte
	packets := 1
	switch info.Op {
	case bth.OpReadRequest:
		h.RETH = bth.RETHFields{VA: va, RKey: rkey, DMALen: uint32(st.Len)}
		packets = max(1, (st.Len+q.mtu-1)/q.mtu)
	case bth.OpCompareSwap, bth.OpFetchAdd:
		h.Atomic = bth.AtomicFields{VA: va, RKey: rkey, SwapAdd: st.Add, Compare: st.Compare}
	case bth.OpAck:
		h.AETH = bth.AETHFields{Syndrome: reth.ACKSyndrome(reth.CreditsInvalid)}
	default:
		payload = make([]byte, st.Len)
		for i := range payload {
			payload[i] = byte(int(psn) + i)
		}
		dma := uint32(st.Len)
		if st.DMALen != nil {
			dma = uint32(*st.DMALen)
		}
		h.RETH = bth.RETHFields{VA: va, RKey: rkey, DMALen: dma}
	}
	buf := make([]byte, bth.PacketLen(st.Op, len(payload)))
	n, err := h.Encode(buf, payload)
	if err != nil {
		return fmt.Errorf("probe: scenario %s line %d: %w", q.s.Name, st.Line, err)
	}
	pkt := buf[:n]
	if st.RawOp != nil {
		pkt[0] = *st.RawOp
	}
	q.w.fillICRC(pkt)
	if st.BadICRC {
		pkt[len(pkt)-1] ^= 0x80
	}
	var tos uint8
	if st.CE {
		tos = 0x03 // ECN CE
	}
	send := q.w.send
	if st.BadUDP {
		if st.CE {
			return fmt.Errorf("probe: scenario %s line %d: udpcsum=bad and ce together are not supported", q.s.Name, st.Line)
		}
		send = func(ctx context.Context, pkt []byte, _ uint8) (time.Time, error) {
			return q.w.sendBadUDPChecksum(ctx, pkt)
		}
	}
	if _, err := send(q.ctx, pkt, tos); err != nil {
		return err
	}
	q.next = rel + packets
	return nil
}

// nextArrival returns the next packet the peer sent to this scenario's
// QP, or false when none came within d.
func (q *qpRun) nextArrival(d time.Duration) (arrival, bool, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-q.ctx.Done():
			return arrival{}, false, q.ctx.Err()
		case <-timer.C:
			return arrival{}, false, nil
		case a, ok := <-q.w.in:
			if !ok {
				return arrival{}, false, errors.New("probe: the wire closed")
			}
			if a.hdr.DestQP != q.myQPN {
				continue // late news of an earlier scenario: in the pcap, not judged here
			}
			q.got = append(q.got, q.describe(a.hdr))
			if in, _ := bth.Lookup(a.hdr.Opcode); in != nil && in.Has(bth.Request) && a.hdr.Opcode != bth.RCReadRequest {
				// The peer's own request (ibv_*_pingpong's server
				// answers each message with one): acknowledged (on
				// RC) so its QP stays well, shown, judged only by
				// "expect peer-send".
				if !q.uc {
					if err := q.ackPeer(a.hdr, in); err != nil {
						return arrival{}, false, err
					}
				}
				if q.peerMsg && in.Has(bth.Last) {
					return a, true, nil
				}
				continue
			}
			return a, true, nil
		}
	}
}

// ackPeer acknowledges the peer's request packet h (of opcode info in)
// when it asks for an ACK or ends its message.
func (q *qpRun) ackPeer(h bth.Header, in *bth.Info) error {
	if !h.AckReq && !in.Has(bth.Last) {
		return nil
	}
	ack := bth.Header{Opcode: bth.RCAck, PKey: bth.DefaultPKey, DestQP: q.peer.QPN, PSN: h.PSN,
		AETH: bth.AETHFields{Syndrome: reth.ACKSyndrome(reth.CreditsInvalid)}}
	buf := make([]byte, bth.PacketLen(bth.RCAck, 0))
	n, err := ack.Encode(buf, nil)
	if err != nil {
		return err
	}
	q.w.fillICRC(buf[:n])
	_, err = q.w.send(q.ctx, buf[:n], 0)
	return err
}

// drain records what else arrives within d.
func (q *qpRun) drain(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if _, ok, err := q.nextArrival(time.Until(end)); !ok || err != nil {
			return
		}
	}
}

// rel is psn relative to the start PSN, in -2^23..2^23-1.
func (q *qpRun) rel(psn bth.PSN) int {
	d := (uint32(psn) - q.base) & bth.PSNMask
	if d >= 1<<23 {
		return int(d) - 1<<24
	}
	return int(d)
}

// kind names a response the way expectations do.
func kind(h bth.Header) string {
	switch h.Opcode {
	case bth.RCAck:
		s := h.AETH.Syndrome
		switch s.Kind() {
		case reth.KindACK:
			return "ack"
		case reth.KindRNR:
			return "rnr"
		case reth.KindNAK:
			switch s.Value() {
			case reth.NAKPSNSeqError:
				return "nak-seq"
			case reth.NAKInvalidRequest:
				return "nak-inv"
			case reth.NAKRemoteAccess:
				return "nak-rae"
			case reth.NAKRemoteOp:
				return "nak-rop"
			}
		}
		return "aeth-reserved"
	case bth.RCAtomicAck:
		return "atomic-ack"
	case bth.RCReadResponseFirst, bth.RCReadResponseMiddle, bth.RCReadResponseLast, bth.RCReadResponseOnly:
		return "read-resp"
	case bth.CNPOpcode:
		return "cnp"
	}
	return h.Opcode.String()
}

// describe summarises a packet from the peer, PSN relative.
func (q *qpRun) describe(h bth.Header) string {
	if h.Opcode == bth.CNPOpcode {
		return "CNP" // its PSN means nothing
	}
	if in, _ := bth.Lookup(h.Opcode); in != nil && in.Has(bth.Request) {
		if q.uc {
			return fmt.Sprintf("%s (the peer's own request, in its PSN space)", h.Opcode)
		}
		return fmt.Sprintf("%s (the peer's own request, in its PSN space; acknowledged)", h.Opcode)
	}
	s := fmt.Sprintf("%s psn=%+d", h.Opcode, q.rel(h.PSN))
	switch h.Opcode {
	case bth.RCAck, bth.RCAtomicAck, bth.RCReadResponseFirst, bth.RCReadResponseLast, bth.RCReadResponseOnly:
		s += " " + h.AETH.Syndrome.String()
	}
	if h.Opcode == bth.RCAtomicAck {
		s += fmt.Sprintf(" orig=%#x", h.AtomicAck)
	}
	return s
}

// expect takes the peer's next packet and checks it against st.
func (q *qpRun) expect(st *Step) error {
	want := st.Expect
	switch want {
	case "peer-send", "no-peer-send":
		return q.expectPeerSend(st)
	}
	if want == "none" {
		a, ok, err := q.nextArrival(q.wait)
		if err != nil {
			return err
		}
		if ok {
			return &errStep{st, fmt.Sprintf("expected silence, got %s", q.describe(a.hdr))}
		}
		return nil
	}
	for {
		a, ok, err := q.nextArrival(q.wait)
		if err != nil {
			return err
		}
		if !ok {
			return &errStep{st, fmt.Sprintf("expected %s, got nothing within %v", stepText(st), q.wait)}
		}
		h := a.hdr
		got := kind(h)
		rel := q.rel(h.PSN)
		if st.Coalesce && got == "ack" && (want != "ack" || st.PSN != nil && rel < *st.PSN) {
			continue
		}
		if got == "read-resp" && want != got && strings.HasPrefix(want, "read-") {
			got = readPosition(h.Opcode)
		}
		if want == "nak-fatal" && fatalNAKs[got] {
			got = want
		}
		if got != want {
			return &errStep{st, fmt.Sprintf("expected %s, got %s", stepText(st), q.describe(h))}
		}
		if st.PSN != nil {
			lo, hi := *st.PSN, *st.PSN
			if st.PSNHi != nil {
				hi = *st.PSNHi
			}
			if rel < lo || rel > hi {
				return &errStep{st, fmt.Sprintf("expected %s, got %s", stepText(st), q.describe(h))}
			}
		}
		if st.Timer != nil && int(h.AETH.Syndrome.Value()) != *st.Timer {
			return &errStep{st, fmt.Sprintf("expected %s, got %s", stepText(st), q.describe(h))}
		}
		if st.Orig != "" {
			v, ok := q.vars[st.Orig]
			if !ok {
				return fmt.Errorf("probe: scenario %s line %d: orig=%s before save=%s", q.s.Name, st.Line, st.Orig, st.Orig)
			}
			if h.AtomicAck != v+st.OrigPlus {
				return &errStep{st, fmt.Sprintf("expected original value %#x, got %s", v+st.OrigPlus, q.describe(h))}
			}
		}
		if st.Save != "" {
			q.vars[st.Save] = h.AtomicAck
		}
		return nil
	}
}

// expectPeerSend checks that the peer sent a message of its own within
// the wait (peer-send: ibv_*_pingpong's server answers each message it
// received, so its answer proves delivery) or did not (no-peer-send: a
// message dropped). Responses to the probe's packets that come meanwhile
// are shown; on UC, which has none, any is a deviation.
func (q *qpRun) expectPeerSend(st *Step) error {
	q.peerMsg = true
	defer func() { q.peerMsg = false }()
	end := time.Now().Add(q.wait)
	for {
		a, ok, err := q.nextArrival(time.Until(end))
		if err != nil {
			return err
		}
		in, _ := bth.Lookup(a.hdr.Opcode)
		switch {
		case !ok && st.Expect == "peer-send":
			return &errStep{st, fmt.Sprintf("expected the peer's own message (its answer to a delivered one), got none within %v", q.wait)}
		case !ok:
			return nil
		case in != nil && in.Has(bth.Request):
			if st.Expect == "no-peer-send" {
				return &errStep{st, fmt.Sprintf("expected no message of the peer's (nothing delivered), got %s", q.describe(a.hdr))}
			}
			return nil
		case q.uc:
			return &errStep{st, fmt.Sprintf("expected no response on UC, got %s", q.describe(a.hdr))}
		}
	}
}

// fatalNAKs are the NAKs that end a request in error (and move the
// responder's QP to the error state): "expect nak-fatal" takes any.
var fatalNAKs = map[string]bool{"nak-inv": true, "nak-rae": true, "nak-rop": true}

// readPosition names a READ response opcode as the read-first, -middle,
// -last and -only expectations do.
func readPosition(op bth.Opcode) string {
	switch op {
	case bth.RCReadResponseFirst:
		return "read-first"
	case bth.RCReadResponseMiddle:
		return "read-middle"
	case bth.RCReadResponseLast:
		return "read-last"
	}
	return "read-only"
}

// stepText writes an expectation back as the format has it.
func stepText(st *Step) string {
	s := st.Expect
	if st.PSN != nil {
		s += fmt.Sprintf(" psn=%+d", *st.PSN)
		if st.PSNHi != nil {
			s += fmt.Sprintf("..%+d", *st.PSNHi)
		}
	}
	if st.Timer != nil {
		s += fmt.Sprintf(" timer=%d", *st.Timer)
	}
	return s
}
