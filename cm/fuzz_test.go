package cm

import (
	"reflect"
	"testing"

	"github.com/rxego/rxego/bth"
)

// FuzzUnmarshal feeds arbitrary MADs to the decoder: it must never panic,
// and whatever it accepts must encode again and decode to the same
// message (reserved bits aside, which encoding zeroes).
func FuzzUnmarshal(f *testing.F) {
	frames, err := readRpingFrames()
	if err != nil {
		f.Fatal(err)
	}
	for _, fr := range frames {
		if fr.pkt.Info.Opcode == bth.UDSendOnly {
			f.Add(fr.pkt.Payload())
		}
	}
	for _, m := range []Message{&MRA{ServiceTimeout: 24}, &REJ{Reason: 8, ARI: []byte{1, 2}}} {
		b, _ := Marshal(7, m)
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, m, err := Unmarshal(b)
		if req, ok := m.(*REQ); ok {
			ParseIPHeader(req.PrivateData)
		}
		if err != nil {
			return
		}
		out, err := Marshal(h.TID, m)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		_, m2, err := Unmarshal(out[:])
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip: %+v\n-> %+v (%v)", m, m2, err)
		}
	})
}
