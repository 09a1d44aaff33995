package kvcache

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/app/job"
)

// small is a shape the tests move in a blink: 7 layers of 24 KiB in
// blocks of 3 KiB (8 blocks a layer).
var small = Shape{Layers: 7, Tokens: 48, Width: 256, DTypeBytes: 2, BlockTokens: 6}

// TestTransfer moves the small cache over RDMA (layers over 3 QPs) and
// over TCP (1 and 3 connections), each in-process, with the decode side
// checking every layer byte for byte as its signal arrives.
func TestTransfer(t *testing.T) {
	for _, c := range []Config{
		{Shape: small, Lanes: 3, Verify: true},
		{Shape: small, Lanes: 1, Verify: true},
		{Shape: small, TCP: true, Lanes: 1, Verify: true},
		{Shape: small, TCP: true, Lanes: 3, Verify: true},
		{Shape: small, Lanes: 3, Verify: true, Warm: true},
		{Shape: small, TCP: true, Lanes: 2, Verify: true, Warm: true},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		res, err := Run(ctx, c, job.Goroutines(Rank(c)))
		cancel()
		if err != nil {
			t.Fatalf("tcp=%v lanes=%d: %v", c.TCP, c.Lanes, err)
		}
		if !res.Verified || res.Bytes != small.Bytes() || len(res.Order) != small.Layers || res.First > res.Total || res.Gbps <= 0 {
			t.Errorf("tcp=%v lanes=%d: %+v", c.TCP, c.Lanes, res)
		}
		// Warm: both passes moved every layer (the timed one checked
		// each byte), the first timed apart.
		if (res.Cold > 0) != c.Warm {
			t.Errorf("tcp=%v lanes=%d warm=%v: untimed first pass %v s", c.TCP, c.Lanes, c.Warm, res.Cold)
		}
		// On one QP or connection the layers arrive in order.
		if c.Lanes == 1 {
			for i, l := range res.Order {
				if l != i {
					t.Errorf("tcp=%v: layers arrived in order %v", c.TCP, res.Order)
					break
				}
			}
		}
	}
}

// TestBadConfig: a bad shape or lane count is refused before anything
// starts.
func TestBadConfig(t *testing.T) {
	for _, c := range []Config{
		{Shape: Shape{Layers: 0, Tokens: 1, Width: 1, DTypeBytes: 1, BlockTokens: 1}, Lanes: 1},
		{Shape: small, Lanes: 0},
		{Shape: Shape{Layers: 1, Tokens: 1 << 20, Width: 1 << 12, DTypeBytes: 2, BlockTokens: 1}, Lanes: 1},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := Run(ctx, c, job.Goroutines(Rank(c)))
		cancel()
		if err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

// TestMain lets this test binary be a rank process for TestProcesses.
func TestMain(m *testing.M) {
	if job.IsRank(os.Args[1:]) {
		os.Exit(job.RankMain(os.Args[1:], Rank))
	}
	os.Exit(m.Run())
}

// TestProcesses runs Compare as the program does: prefill and decode in
// processes of their own, over RDMA (3 QPs and 1) and TCP (1 and 2
// connections), every layer checked byte for byte.
func TestProcesses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rs, err := Compare(ctx, small, 3, 2, true, false, func(c Config) job.Starter { return job.Processes(nil, c) })
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 4 {
		t.Fatalf("%d results", len(rs))
	}
	for _, r := range rs {
		if !r.Verified || len(r.Order) != small.Layers || r.SendCPU <= 0 && r.CPU <= 0 {
			t.Errorf("%+v", r)
		}
	}
	var b strings.Builder
	Table(&b, small, rs)
	if !strings.Contains(b.String(), "RDMA WRITE + WRITE_IMM, 3 QPs") || !strings.Contains(b.String(), "TCP, 2 connection(s)") {
		t.Errorf("table:\n%s", b.String())
	}
}
