package conformance

import (
	"testing"
	"time"
)

// TestPerftest runs every perftest tool against rxego in both roles over
// the IPv4 GIDs, on every kernel: sizes 1, one more than the path MTU (two
// packets) and 64 KiB, plus 1 MiB for write_bw and read_bw, and both
// atomic operations.
func TestPerftest(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, r := range perftestMatrix() {
			p.perfBothRoles(t, r)
		}
	})
}

// perftestMatrix lists the IPv4 runs of one role.
func perftestMatrix() []perfRun {
	var runs []perfRun
	for _, test := range []string{"send_bw", "write_bw", "read_bw", "send_lat", "write_lat", "read_lat"} {
		sizes := []int{1, 1025, 65536}
		if test == "write_bw" || test == "read_bw" {
			sizes = append(sizes, 1<<20)
		}
		for _, s := range sizes {
			runs = append(runs, perfRun{Test: test, Size: s, Iters: itersFor(s)})
		}
	}
	for _, test := range []string{"atomic_bw", "atomic_lat"} {
		for _, op := range []string{"FETCH_AND_ADD", "CMP_AND_SWAP"} {
			runs = append(runs, perfRun{Test: test, Atomic: op, Iters: 20})
		}
	}
	return runs
}

// itersFor keeps runs short on the TCG guests: fewer iterations for the
// large messages.
func itersFor(size int) int {
	switch {
	case size >= 1<<20:
		return 5
	case size >= 65536:
		return 10
	}
	return 20
}

// TestPerftestIPv6 is a smoke set over the IPv6 GIDs: every tool once per
// role at a multi-packet size.
func TestPerftestIPv6(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, test := range []string{"send_bw", "write_bw", "read_bw", "atomic_bw", "send_lat", "write_lat", "read_lat", "atomic_lat"} {
			r := perfRun{Test: test, Size: 4096, Iters: 10, IPv6: true}
			if test == "atomic_bw" || test == "atomic_lat" {
				r.Size, r.Atomic = 0, "FETCH_AND_ADD"
			}
			p.perfBothRoles(t, r)
		}
	})
}

// TestPerftestFlags runs the BW tests with several QPs, a smaller tx
// depth, a path MTU rxego asks to lower (perftest takes the smaller of
// both sides'), a traffic class (--tclass 104: DSCP 26) and write_bw and read_bw over every size (-a: 2 B to 8
// MiB), in both roles. read_bw -a as the rxego client is the case that
// drew READ retry storms from rxe 6.1 before the completer kept to one
// retry at a time (docs/perftest.md).
func TestPerftestFlags(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		runs := []perfRun{
			{Test: "send_bw", Size: 1025, Iters: 10, QPs: 3},
			{Test: "write_bw", Size: 1025, Iters: 10, QPs: 3},
			{Test: "read_bw", Size: 1025, Iters: 10, QPs: 3},
			{Test: "atomic_bw", Atomic: "FETCH_AND_ADD", Iters: 10, QPs: 2},
			{Test: "write_bw", Size: 4096, Iters: 20, Args: []string{"-t", "2"}},
			{Test: "send_bw", Size: 2000, Iters: 10, RxegoArgs: []string{"-m", "512"}},
			{Test: "write_bw", Size: 4096, Iters: 10, Args: []string{"--tclass", "104"}},
			{Test: "write_bw", All: true, Iters: 5, Timeout: 4 * time.Minute},
			{Test: "read_bw", All: true, Iters: 5, Timeout: 4 * time.Minute, MaxResent: maxResent},
		}
		for _, r := range runs {
			p.perfBothRoles(t, r)
		}
	})
}

// TestPerftestModes runs perftest's CQ moderation (-Q), post lists (-l)
// and QP timeout (-u), given to both sides, in both roles: rxego signals
// and posts as perftest does and the tables and data checks hold.
func TestPerftestModes(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		runs := []perfRun{
			{Test: "write_bw", Size: 64, Iters: 100, Args: []string{"-Q", "10", "-l", "10"}},
			{Test: "read_bw", Size: 1025, Iters: 20, Args: []string{"-Q", "5"}},
			{Test: "atomic_bw", Atomic: "FETCH_AND_ADD", Iters: 20, Args: []string{"-Q", "4"}},
			{Test: "write_bw", Size: 4096, Iters: 20, Args: []string{"-u", "18"}},
		}
		for _, r := range runs {
			p.perfBothRoles(t, r)
		}
	})
}

// TestPerftestRDMACM runs perftest's -R mode against rxego in both roles:
// perftest's exchange over an rdma_cm-connected QP (SENDs of its binary
// records), every data QP its own rdma_cm connection on the same port
// (the client retrying while the server does not listen yet), and the
// disconnects at the end. send_bw, write_bw and read_bw at two sizes and
// with two QPs, and every other tool once.
func TestPerftestRDMACM(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		runs := []perfRun{
			{Test: "send_bw", Size: 1025, Iters: 20}, {Test: "send_bw", Size: 65536, Iters: 10},
			{Test: "write_bw", Size: 1025, Iters: 20}, {Test: "write_bw", Size: 65536, Iters: 10},
			{Test: "read_bw", Size: 1025, Iters: 20}, {Test: "read_bw", Size: 65536, Iters: 10},
			{Test: "send_bw", Size: 4096, Iters: 10, QPs: 2}, {Test: "write_bw", Size: 4096, Iters: 10, QPs: 2},
			{Test: "read_bw", Size: 4096, Iters: 10, QPs: 2},
			{Test: "atomic_bw", Atomic: "FETCH_AND_ADD", Iters: 20},
			{Test: "write_bw", Size: 4096, Iters: 10, Args: []string{"-T", "104"}},
			{Test: "send_lat", Size: 64, Iters: 20}, {Test: "write_lat", Size: 64, Iters: 20},
			{Test: "read_lat", Size: 64, Iters: 20}, {Test: "atomic_lat", Atomic: "CMP_AND_SWAP", Iters: 20},
		}
		for _, r := range runs {
			r.RDMACM = true
			p.perfBothRoles(t, r)
		}
	})
}

// perfBothRoles runs r as a case with rxego as the server, then as the
// client.
func (p *Peer) perfBothRoles(t *testing.T, r perfRun) {
	t.Helper()
	for _, server := range []bool{true, false} {
		r.RxegoServer = server
		p.perfCase(t, r)
	}
}

// perfCase runs r as one case in the role r names, on a loaded host or
// under loss when r asks.
func (p *Peer) perfCase(t *testing.T, r perfRun) {
	t.Helper()
	c := Case{Name: r.name(), Role: r.role(), Expect: r.expect(), MaxResent: r.MaxResent}
	body := func(t *testing.T) Outcome {
		if r.Hog {
			defer hogCPUs(2 * time.Minute)()
		}
		return p.perf(t, r)
	}
	if r.Loss > 0 {
		c.Expect, c.Lossy = append(c.Expect, lossRetries...), true
		lossMu.Lock() // held around the whole case, as TestLoss does
		defer lossMu.Unlock()
		perf := body
		body = func(t *testing.T) Outcome {
			return p.underLoss(t, r.IPv6, r.Loss, false, func() Outcome { return perf(t) })
		}
	}
	p.Case(t, c, body)
}
