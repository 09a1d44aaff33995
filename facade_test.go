package rxego

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/rxego/rxego/mr"
	"github.com/rxego/rxego/qp"
)

// TestStatsMirrorsCounters: every engine counter has a Stats field of the
// same name, and Stats.add carries each one's value (a counter added to
// the engine and forgotten here fails).
func TestStatsMirrorsCounters(t *testing.T) {
	var c qp.Counters
	cv := reflect.ValueOf(&c).Elem()
	n := uint64(1)
	for i := range cv.NumField() {
		f := cv.Field(i)
		switch f.Kind() {
		case reflect.Array:
			for j := range f.Len() {
				f.Index(j).Addr().Interface().(interface{ Add(uint64) uint64 }).Add(n)
				n++
			}
		default:
			f.Addr().Interface().(interface{ Add(uint64) uint64 }).Add(n)
			n++
		}
	}
	var s Stats
	s.add(&c)
	s.add(&c) // sums, as over two shards
	sv := reflect.ValueOf(s)
	if sv.NumField() != cv.NumField() {
		t.Errorf("Stats has %d fields, qp.Counters %d", sv.NumField(), cv.NumField())
	}
	for i := range cv.NumField() {
		name := cv.Type().Field(i).Name
		f := sv.FieldByName(name)
		if !f.IsValid() {
			t.Errorf("Stats has no field %s", name)
			continue
		}
		cf := cv.Field(i)
		if cf.Kind() == reflect.Array {
			for j := range cf.Len() {
				if got, want := f.Index(j).Uint(), 2*cf.Index(j).Addr().Interface().(interface{ Load() uint64 }).Load(); got != want {
					t.Errorf("Stats.%s[%d] = %d, want %d", name, j, got, want)
				}
			}
			continue
		}
		if got, want := f.Uint(), 2*cf.Addr().Interface().(interface{ Load() uint64 }).Load(); got != want {
			t.Errorf("Stats.%s = %d, want %d", name, got, want)
		}
	}
}

// TestAPIErrors: an error of a layer below reads "rxego: ..." with the
// layer's name gone, and errors.Is finds both the root's error and the
// layer's.
func TestAPIErrors(t *testing.T) {
	for _, c := range []struct {
		err       error
		msg       string
		root, low error
	}{
		{fmt.Errorf("%w: 5 WRs, 3 free", qp.ErrQueueFull), "rxego: work queue full: 5 WRs, 3 free", ErrQueueFull, qp.ErrQueueFull},
		{fmt.Errorf("rxego: connect QP 17: %w", fmt.Errorf("%w: RESET to RTS", qp.ErrInvalidModify)),
			"rxego: connect QP 17: invalid modify: RESET to RTS", ErrInvalidModify, qp.ErrInvalidModify},
		{fmt.Errorf("mr: lkey 0x1234: %w", mr.ErrInvalidArgument), "rxego: lkey 0x1234: invalid argument", ErrInvalidArgument, mr.ErrInvalidArgument},
		{errors.New("qp: CQ depth must be 1..4194304"), "rxego: CQ depth must be 1..4194304", nil, nil},
	} {
		got := apiErr(c.err)
		if got.Error() != c.msg {
			t.Errorf("%q reads %q, want %q", c.err, got, c.msg)
		}
		if c.root != nil && (!errors.Is(got, c.root) || !errors.Is(got, c.low)) {
			t.Errorf("%q: errors.Is misses %v or %v", got, c.root, c.low)
		}
		if !errors.Is(got, c.err) {
			t.Errorf("%q lost the original error from its chain", got)
		}
		if again := apiErr(got); again != got {
			t.Errorf("apiErr of %q changed it again", got)
		}
	}
	if apiErr(nil) != nil {
		t.Error("apiErr(nil) is not nil")
	}
	same := errors.New("rxego: already ours")
	if apiErr(same) != same {
		t.Error("apiErr wrapped an error that needed nothing")
	}
}
