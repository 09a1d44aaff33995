package reth_test

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/internal/capfile"
	"github.com/rxego/rxego/reth"
)

// FuzzViews parses arbitrary bytes with bth.Parse and, for every extended
// header the opcode carries, reads each field through its view and writes
// it back through the setter into a copy: the header bytes must come out
// unchanged (the DETH's reserved byte excepted, which Set zeroes), and
// nothing may read or write outside the view.
func FuzzViews(f *testing.F) {
	files, _ := filepath.Glob("../testdata/pcaps/*.pcap*")
	seen := map[byte]bool{}
	for _, file := range files {
		_ = capfile.Each(file, func(fr capfile.Frame) error {
			if len(fr.RoCE) > 0 && !seen[fr.RoCE[0]] {
				seen[fr.RoCE[0]] = true
				f.Add(bytes.Clone(fr.RoCE))
				f.Add(bytes.Clone(fr.RoCE[:len(fr.RoCE)/2]))
			}
			return nil
		})
	}
	f.Add([]byte{0x1c, 0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0x21,
		0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 7, 0, 0, 0, 64, 0, 0, 0, 0}) // FLUSH
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := bth.Parse(data)
		if err != nil {
			return
		}
		if r := p.RETH(); r != nil {
			check(t, "RETH", r, func(b []byte) { reth.RETH(b).Set(r.VA(), r.RKey(), r.DMALen()) })
		}
		if a := p.AETH(); a != nil {
			check(t, "AETH", a, func(b []byte) { reth.AETH(b).Set(a.Syndrome(), a.MSN()) })
			s := a.Syndrome()
			if uint8(s) != uint8(s.Kind())<<5|s.Value()|uint8(s)&0x80 || s.String() == "" {
				t.Fatalf("syndrome %#x: kind %d value %d", uint8(s), s.Kind(), s.Value())
			}
		}
		if a := p.AtomicETH(); a != nil {
			check(t, "AtomicETH", a, func(b []byte) { reth.AtomicETH(b).Set(a.VA(), a.RKey(), a.SwapAdd(), a.Compare()) })
		}
		if a := p.AtomicAckETH(); a != nil {
			check(t, "AtomicAckETH", a, func(b []byte) { reth.AtomicAckETH(b).SetOrig(a.Orig()) })
		}
		if i := p.ImmDt(); i != nil {
			check(t, "ImmDt", i, func(b []byte) { reth.ImmDt(b).SetImm(i.Imm()) })
		}
		if i := p.IETH(); i != nil {
			check(t, "IETH", i, func(b []byte) { reth.IETH(b).SetRKey(i.RKey()) })
		}
		if d := p.DETH(); d != nil {
			want := bytes.Clone(d)
			want[4] = 0
			got := bytes.Clone(d)
			reth.DETH(got).Set(d.QKey(), d.SrcQP())
			if !bytes.Equal(got, want) {
				t.Fatalf("DETH % x rewritten as % x", []byte(d), got)
			}
		}
		if fe := p.FETH(); fe != nil {
			if fe.SelectivityLevel() != uint8(fe.Raw()>>4&3) || fe.PlacementType() != uint8(fe.Raw()&0xf) {
				t.Fatalf("FETH % x", []byte(fe))
			}
		}
		if r := p.RDETH(); r != nil && r.EECnxt() > 0xffffff {
			t.Fatalf("RDETH % x", []byte(r))
		}
		if c := p.CNP(); c != nil && len(c) != reth.CNPLen {
			t.Fatalf("CNP view of %d bytes", len(c))
		}
	})
}

// check rewrites a copy of view v (with guard bytes around it) through
// set and requires identical bytes and untouched guards.
func check(t *testing.T, name string, v []byte, set func([]byte)) {
	t.Helper()
	buf := make([]byte, len(v)+2)
	buf[0], buf[len(buf)-1] = 0xa5, 0x5a
	set(buf[1 : 1+len(v) : 1+len(v)])
	if !bytes.Equal(buf[1:1+len(v)], v) || buf[0] != 0xa5 || buf[len(buf)-1] != 0x5a {
		t.Fatalf("%s % x rewritten as % x", name, v, buf)
	}
}
