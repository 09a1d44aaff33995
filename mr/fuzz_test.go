package mr

import (
	"math"
	"math/bits"
	"testing"
	"unsafe"
)

// FuzzRemote checks Remote against a model: it succeeds exactly when the
// key names a valid MR of the PD with the access, and the range lies
// inside the MR without wrapping; and whatever it returns is exactly the
// addressed part of that MR's buffer, never a byte outside it.
func FuzzRemote(f *testing.F) {
	tab := NewTable()
	pd, other := tab.AllocPD(), tab.AllocPD()
	backing := make([]byte, 512)
	mrs := []*MR{
		mustRegister(f, pd, backing[:100], rwAll),
		mustRegister(f, pd, backing[100:164], RemoteRead, WithIOVA(math.MaxUint64-64)),
		mustRegister(f, pd, backing[164:300], LocalWrite|RemoteWrite|ZeroBased),
		mustRegister(f, pd, backing[300:300], RemoteRead, WithIOVA(1<<63)),
		mustRegister(f, other, backing[300:], rwAll, WithIOVA(0x1000)),
	}
	for i, m := range mrs {
		f.Add(uint8(i), uint32(0), m.IOVA(), uint32(m.Len()), uint8(RemoteRead))
		f.Add(uint8(i), uint32(0), m.IOVA()+uint64(m.Len()), uint32(0), uint8(RemoteWrite))
	}
	f.Add(uint8(1), uint32(0), uint64(math.MaxUint64), uint32(1), uint8(RemoteRead))
	f.Add(uint8(255), uint32(0x100), uint64(0), uint32(0), uint8(RemoteRead))

	f.Fuzz(func(t *testing.T, sel uint8, rawKey uint32, va uint64, length uint32, need uint8) {
		// sel picks an MR's key (maybe damaged by rawKey) or rawKey itself.
		key := rawKey
		if int(sel) < 2*len(mrs) {
			key = mrs[int(sel)%len(mrs)].RKey() ^ rawKey
		}
		got, err := tab.Remote(key, pd, va, length, Access(need))

		var m *MR
		for _, c := range mrs {
			if c.RKey() == key {
				m = c
			}
		}
		end, carry := bits.Add64(va, uint64(length), 0)
		want := m != nil && m.PD() == pd &&
			Access(need) != 0 && Access(need)&^remoteAccess == 0 &&
			Access(need)&^m.Access() == 0 &&
			va >= m.IOVA() && carry == 0 && end <= m.IOVA()+uint64(m.Len())
		if (err == nil) != want {
			t.Fatalf("Remote(%#x, va %#x, len %d, %v) err = %v, model says ok=%v", key, va, length, Access(need), err, want)
		}
		if err != nil {
			return
		}
		if uint64(len(got)) != uint64(length) || uint64(cap(got)) != uint64(length) {
			t.Fatalf("len %d cap %d, want %d", len(got), cap(got), length)
		}
		if length == 0 {
			return
		}
		buf := m.Buffer()
		off := uintptr(unsafe.Pointer(&got[0])) - uintptr(unsafe.Pointer(&buf[0]))
		if uint64(off) != va-m.IOVA() || uint64(off)+uint64(length) > uint64(len(buf)) {
			t.Fatalf("slice at offset %d len %d, want offset %d inside %d bytes", off, length, va-m.IOVA(), len(buf))
		}
	})
}
