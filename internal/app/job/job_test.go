package job

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestAllGather: every rank sees every rank's value, in rank order, and
// Launch returns each rank's result by rank.
func TestAllGather(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var res []string
	err := Launch(ctx, 4, Goroutines(func(ctx context.Context, r *Rank) (any, error) {
		var all []int
		if err := r.AllGather(r.ID*10, &all); err != nil {
			return nil, err
		}
		if err := r.Barrier(); err != nil {
			return nil, err
		}
		return fmt.Sprint(r.ID, all), nil
	}), &res)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range res {
		if want := fmt.Sprint(i, []int{0, 10, 20, 30}); s != want {
			t.Errorf("rank %d: %q, want %q", i, s, want)
		}
	}
}

// TestFailure: a rank's failure ends the job with its message, and the
// ranks waiting for it are released rather than left hanging.
func TestFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var res []string
	err := Launch(ctx, 3, Goroutines(func(ctx context.Context, r *Rank) (any, error) {
		if r.ID == 2 {
			return nil, errors.New("rank two gives up")
		}
		return nil, r.Barrier()
	}), &res)
	if err == nil || !strings.Contains(err.Error(), "rank two gives up") || ctx.Err() != nil {
		t.Fatalf("err %v (ctx %v)", err, ctx.Err())
	}
}

// TestBadRank: a rank number outside the job is refused.
func TestBadRank(t *testing.T) {
	if _, err := Join(context.Background(), "127.0.0.1:1", 3, 3); err == nil {
		t.Error("rank 3 of 3 joined")
	}
}

// TestPattern: Check passes what Fill wrote, at any 8-aligned offset and
// ragged length, and names the first byte that differs.
func TestPattern(t *testing.T) {
	b := make([]byte, 1003)
	Fill(b, 7, 64)
	if err := Check(b, 7, 64); err != nil {
		t.Fatal(err)
	}
	if err := Check(b[8:], 7, 72); err != nil {
		t.Fatal(err)
	}
	b[1001] ^= 1
	if err := Check(b, 7, 64); err == nil || !strings.Contains(err.Error(), "byte 1065") {
		t.Errorf("changed byte: %v", err)
	}
	if err := Check(b[:8], 8, 64); err == nil {
		t.Error("another seed's pattern passed")
	}
}

// TestMain lets this test binary be a rank process for TestProcesses.
func TestMain(m *testing.M) {
	if IsRank(os.Args[1:]) {
		os.Exit(RankMain(os.Args[1:], func(word string) RankFunc {
			return func(ctx context.Context, r *Rank) (any, error) {
				var all []int
				err := r.AllGather(os.Getpid(), &all)
				return fmt.Sprintf("%s %d %d", word, r.ID, len(all)), err
			}
		}))
	}
	os.Exit(m.Run())
}

// TestProcesses runs a job's ranks as processes of this binary, each
// given the configuration as JSON.
func TestProcesses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var res []string
	if err := Launch(ctx, 3, Processes(nil, "hello"), &res); err != nil {
		t.Fatal(err)
	}
	for i, s := range res {
		if want := fmt.Sprintf("hello %d 3", i); s != want {
			t.Errorf("rank %d: %q, want %q", i, s, want)
		}
	}
}
