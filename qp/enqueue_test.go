package qp

import (
	"bytes"
	"reflect"
	"slices"
	"testing"
	"unsafe"
)

// TestEnqueueResetsWQE checks that posting leaves nothing behind of the
// WQE a send queue slot held before. Every scalar field of the slot,
// found by reflection (so a field added to sendWQE later is covered
// too), is dirtied first; the posted WQE must then equal one built from
// the request alone.
func TestEnqueueResetsWQE(t *testing.T) {
	p := newAllocPair(t, MTU1024)
	q := p.a.qp
	for _, wr := range []SendWR{
		{Opcode: WRWrite, Flags: SendSignaled, SGL: sge(p.amr, 0, 64), RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()},
		{Opcode: WRSend, Flags: SendInline, Inline: make([]byte, 32), Imm: 9},
		{Opcode: WRFetchAdd, SGL: sge(p.amr, 0, 8), RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey(), CompareAdd: 1},
	} {
		q.growSQ(int(q.sqTail-q.sqHead) + 1) // the queue is made at the first post
		slot := &q.sq[q.sqTail%uint64(len(q.sq))]
		dirtyScalars(reflect.ValueOf(slot).Elem())
		q.enqueueSend(&wr)
		// The slot's buffers (sge1, sgls, inline) may hold what earlier
		// posts left; what the WQE says must be the request's.
		if !slices.Equal(slot.sgl, wr.SGL) || !bytes.Equal(slot.wr.Inline, wr.Inline) {
			t.Errorf("%v: posted SGL %v, inline %v; want %v, %v", wr.Opcode, slot.sgl, slot.wr.Inline, wr.SGL, wr.Inline)
		}
		want := sendWQE{wr: wr, sgl: slot.sgl, sge1: slot.sge1, sgls: slot.sgls, inline: slot.inline, signaled: wr.Flags&SendSignaled != 0}
		want.wr.SGL, want.wr.Inline = slot.sgl, nil
		if wr.Flags&SendInline != 0 {
			want.wr.Inline = slot.inline
		}
		switch {
		case wr.Opcode == WRFetchAdd:
			want.length = 8
		case wr.Flags&SendInline != 0:
			want.length = uint32(len(wr.Inline))
		default:
			want.length = wr.SGL[0].Length
		}
		if !reflect.DeepEqual(*slot, want) {
			t.Errorf("%v: posted WQE\n%+v\nwant\n%+v", wr.Opcode, *slot, want)
		}
		q.sqTail-- // the slot was only a test's; nothing runs it
	}
}

// dirtyScalars sets every boolean and number in v, exported or not, to a
// non-zero value; pointers, slices, maps and interfaces stay valid as
// they are.
func dirtyScalars(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			dirtyScalars(v.Field(i))
		}
	case reflect.Array:
		for i := range v.Len() {
			dirtyScalars(v.Index(i))
		}
	case reflect.Bool:
		settable(v).SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		settable(v).SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		settable(v).SetUint(7)
	case reflect.Float32, reflect.Float64:
		settable(v).SetFloat(7)
	}
}

// settable returns v, addressable, as a value that may be set even when
// it is an unexported field.
func settable(v reflect.Value) reflect.Value {
	return reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem()
}

// TestGrowSQKeepsSGEs checks that WQEs in flight when the send ring grows
// keep their scatter/gather lists, each a list of the WQE's own (a
// single SGE lives in the WQE: it must not stay pointing into the old
// ring), and that a list of several SGEs keeps its buffer for the slot's
// next post.
func TestGrowSQKeepsSGEs(t *testing.T) {
	p := newAllocPair(t, MTU1024)
	q := p.a.qp
	q.growSQ(4)
	wrs := []SendWR{
		{Opcode: WRWrite, SGL: sge(p.amr, 0, 64), RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()},
		{Opcode: WRWrite, SGL: append(sge(p.amr, 64, 8), sge(p.amr, 128, 16)...), RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()},
		{Opcode: WRWrite, SGL: sge(p.amr, 256, 32), RemoteAddr: p.bmr.IOVA(), RKey: p.bmr.RKey()},
	}
	head := q.sqTail
	for i := range wrs {
		q.enqueueSend(&wrs[i])
	}
	q.growSQ(8)
	for i := range wrs {
		w := &q.sq[(head+uint64(i))%uint64(len(q.sq))]
		if !slices.Equal(w.sgl, wrs[i].SGL) || !slices.Equal(w.wr.SGL, wrs[i].SGL) {
			t.Errorf("WQE %d after the ring grew: SGL %v (wr %v), want %v", i, w.sgl, w.wr.SGL, wrs[i].SGL)
		}
		if len(w.sgl) == 1 && (&w.sgl[0] != &w.sge1[0] || &w.wr.SGL[0] != &w.sge1[0]) {
			t.Errorf("WQE %d's single SGE lies outside the WQE", i)
		}
		if want := uint32(0); len(w.sgl) > 0 {
			for _, s := range wrs[i].SGL {
				want += s.Length
			}
			if w.length != want {
				t.Errorf("WQE %d: length %d, want %d", i, w.length, want)
			}
		}
	}
	// The two-SGE slot's buffer is kept: a later post of two there
	// reuses it.
	w := &q.sq[(head+1)%uint64(len(q.sq))]
	buf := &w.sgls[0]
	q.sqTail = head + 1
	q.enqueueSend(&wrs[1])
	if &w.sgl[0] != buf {
		t.Error("a post of two SGEs did not reuse its slot's buffer")
	}
}

// TestSQRingSizedByUse checks that the send ring is as long as the
// requests in flight need: a QP that has one request in flight at a time
// keeps a ring of one WQE, and one that posts several grows it and
// completes them all, in order, with their bytes placed.
func TestSQRingSizedByUse(t *testing.T) {
	p := newAllocPair(t, MTU1024)
	q := p.a.qp
	const size = 64
	src := func(off int) []byte { return p.amr.Buffer()[off : off+size] }
	dst := func(off int) []byte { return p.bmr.Buffer()[off : off+size] }
	write := func(id uint64, off int) SendWR {
		fill(src(off), id)
		return SendWR{ID: id, Opcode: WRWrite, Flags: SendSignaled, SGL: sge(p.amr, off, size),
			RemoteAddr: p.bmr.IOVA() + uint64(off), RKey: p.bmr.RKey()}
	}
	for i := range uint64(3) {
		if err := q.PostSend(write(i, 0)); err != nil {
			t.Fatal(err)
		}
		p.exchange(t)
		if wcs := pollAllCheck(t, p.a.scq); len(wcs) != 1 || wcs[0].ID != i {
			t.Fatalf("post %d: completions %+v, want one of ID %d", i, wcs, i)
		}
		if n := len(q.sq); n != 1 {
			t.Fatalf("post %d: a ring of %d WQEs for one request in flight, want 1", i, n)
		}
		if !bytes.Equal(dst(0), src(0)) {
			t.Fatalf("post %d: the WRITE's bytes were not placed", i)
		}
	}
	const burst = 5
	var wrs []SendWR
	for i := range burst {
		wrs = append(wrs, write(uint64(10+i), size*(i+1)))
	}
	if err := q.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	if n := len(q.sq); n < burst {
		t.Fatalf("a ring of %d WQEs for %d requests in flight", n, burst)
	}
	p.exchange(t)
	wcs := pollAllCheck(t, p.a.scq)
	if len(wcs) != burst {
		t.Fatalf("%d completions, want %d", len(wcs), burst)
	}
	for i, wc := range wcs {
		if wc.ID != uint64(10+i) {
			t.Errorf("completion %d: ID %d, want %d", i, wc.ID, 10+i)
		}
		if off := size * (i + 1); !bytes.Equal(dst(off), src(off)) {
			t.Errorf("WRITE %d: its bytes were not placed", i)
		}
	}
}
