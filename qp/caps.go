package qp

import "fmt"

// check returns an error naming the first field of c out of range, with
// the range it must lie in (ibv_create_qp's EINVAL, made readable); hasSRQ
// allows MaxRecvWR 0, as receives then come from the SRQ.
func (c Caps) check(hasSRQ bool) error {
	minRecv := 1
	if hasSRQ {
		minRecv = 0
	}
	for _, f := range []struct {
		name      string
		v, lo, hi int
		why       string
	}{
		{"MaxSendWR", c.MaxSendWR, 1, MaxWR, "the send queue's depth"},
		{"MaxRecvWR", c.MaxRecvWR, minRecv, MaxWR, "the receive queue's depth (0 only with an SRQ)"},
		{"MaxSendSGE", c.MaxSendSGE, 0, MaxSGE, "0 means 1"},
		{"MaxRecvSGE", c.MaxRecvSGE, 0, MaxSGE, "0 means 1"},
		{"MaxInlineData", c.MaxInlineData, 0, MaxInlineData, "bytes"},
	} {
		if f.v < f.lo || f.v > f.hi {
			return fmt.Errorf("qp: Caps.%s %d out of range: want %d to %d (%s)", f.name, f.v, f.lo, f.hi, f.why)
		}
	}
	return nil
}
