package qp

import (
	"slices"
	"testing"
)

// TestQPTable checks the QP table against a map over numbers that share
// pages, cross page boundaries and sit at the ends of the 24-bit space,
// with deletions that empty pages, and in the middle of a walk.
func TestQPTable(t *testing.T) {
	var tab qpTable
	want := map[uint32]*QP{}
	nums := []uint32{0, 1, 17, qpPage - 1, qpPage, qpPage + 1, 5 * qpPage, 0xffffff, 0xfffffe}
	for i := uint32(100); i < 10100; i++ {
		nums = append(nums, i)
	}
	for _, n := range nums {
		q := &QP{num: n}
		tab.set(n, q)
		want[n] = q
	}
	check := func() {
		t.Helper()
		if tab.len() != len(want) {
			t.Fatalf("len %d, want %d", tab.len(), len(want))
		}
		for _, n := range nums {
			if got := tab.get(n); got != want[n] {
				t.Fatalf("get(%d) = %p, want %p", n, got, want[n])
			}
		}
		var walked []uint32
		tab.all(func(q *QP) bool { walked = append(walked, q.num); return true })
		if !slices.IsSorted(walked) || len(walked) != len(want) {
			t.Fatalf("walk gave %d QPs (sorted %v), want %d in order", len(walked), slices.IsSorted(walked), len(want))
		}
	}
	check()
	if tab.get(1<<24) != nil || tab.get(0xffffffff) != nil {
		t.Fatal("a number beyond 24 bits found a QP")
	}
	for _, n := range []uint32{5 * qpPage, 0xffffff, 0xfffffe, 17} {
		tab.del(n)
		delete(want, n)
	}
	tab.del(5 * qpPage) // twice: nothing
	tab.del(12345678)   // never set: nothing
	check()
	if tab.pages[5] != nil || tab.pages[0xfff] != nil {
		t.Error("a page that holds no QP stayed")
	}
	// Deleting every QP during a walk, as Engine.Close destroys them.
	tab.all(func(q *QP) bool { tab.del(q.num); delete(want, q.num); return true })
	check()
	for i, p := range tab.pages {
		if p != nil {
			t.Fatalf("page %d left after every QP went", i)
		}
	}
	// The walk stops when f says so.
	tab.set(3, &QP{num: 3})
	tab.set(4, &QP{num: 4})
	calls := 0
	tab.all(func(*QP) bool { calls++; return false })
	if calls != 1 {
		t.Errorf("walk went on after f returned false: %d calls", calls)
	}
}
