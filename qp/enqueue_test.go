package qp

import (
	"reflect"
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
		want := sendWQE{wr: wr, sgl: slot.sgl, inline: slot.inline, signaled: wr.Flags&SendSignaled != 0}
		want.wr.SGL, want.wr.Inline = slot.sgl, slot.inline
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
