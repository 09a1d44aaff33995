package harness

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Sched is where and at what priority a case's two peers run. Each peer
// applies it to every one of its threads as it starts (applySched), so a
// whole process runs as asked: Linux keeps nice values and CPU affinity
// per thread, and a child inherits only those of the thread that forked
// it. (Until this existed, -nice reniced one thread of the orchestrator,
// and a peer ran at nice -20 or 0 depending on which thread the runtime
// forked it from; with one peer at -20 and the other at 0 the scheduler
// placed them differently, and round trips on two CPUs came out at 20 or
// 50 µs from one run to the next.)
type Sched struct {
	// Nice is the peers' nice value (0: unchanged).
	Nice int `json:",omitempty"`
	// Server and Client are the CPUs each peer may run on, as Linux lists
	// them ("1", "0-7", "0,2"); empty: any.
	Server, Client string `json:",omitempty"`
	// ServerShards and ClientShards are the shards of each peer's rxego
	// device (rxego.Options.Shards; 0: the default, one per CPU but one
	// on two CPUs or fewer), so a sitting can measure peers whose shard
	// layouts differ (-shards).
	ServerShards, ClientShards int `json:",omitempty"`
	// ZeroCopy sends from registered memory on both peers' rxego devices
	// (rxego.Options.ZeroCopy; -zerocopy), so a sitting can weigh it.
	ZeroCopy bool `json:",omitempty"`
}

// ParseShards reads -shards: one shard count for both peers' devices
// ("1"), or the server's and the client's separated by a slash ("4/1").
func ParseShards(s string) (server, client int, err error) {
	if s == "" {
		return 0, 0, nil
	}
	a, b, split := strings.Cut(s, "/")
	if !split {
		b = a
	}
	if server, err = strconv.Atoi(a); err == nil {
		client, err = strconv.Atoi(b)
	}
	if err != nil || server < 1 || client < 1 {
		return 0, 0, fmt.Errorf("-shards %q: want N or SERVER/CLIENT, each at least 1", s)
	}
	return server, client, nil
}

// ParsePin reads -pin: one CPU list for both peers ("1": both on CPU 1),
// or the server's and the client's separated by a slash ("0/1").
func ParsePin(s string) (server, client string, err error) {
	if s == "" {
		return "", "", nil
	}
	server, client, split := strings.Cut(s, "/")
	if !split {
		client = server
	}
	for _, l := range []string{server, client} {
		if _, err := parseCPUList(l); err != nil {
			return "", "", fmt.Errorf("-pin %q: %w", s, err)
		}
	}
	return server, client, nil
}

// String describes s for the report ("" when it changes nothing).
func (s Sched) String() string {
	var parts []string
	if s.Nice != 0 {
		parts = append(parts, fmt.Sprintf("nice %d", s.Nice))
	}
	switch {
	case s.Server == "" && s.Client == "":
	case s.Server == s.Client:
		parts = append(parts, "both peers on CPU "+s.Server)
	default:
		parts = append(parts, fmt.Sprintf("server on CPU %s, client on CPU %s", orAny(s.Server), orAny(s.Client)))
	}
	if s.ServerShards != 0 || s.ClientShards != 0 {
		parts = append(parts, fmt.Sprintf("rxego devices of %d (server) and %d (client) shards", s.ServerShards, s.ClientShards))
	}
	if s.ZeroCopy {
		parts = append(parts, "rxego devices sending from registered memory (ZeroCopy)")
	}
	return strings.Join(parts, ", ")
}

func orAny(l string) string {
	if l == "" {
		return "any"
	}
	return l
}

// parseCPUList reads a Linux CPU list: numbers and ranges separated by
// commas.
func parseCPUList(l string) (unix.CPUSet, error) {
	var set unix.CPUSet
	if l == "" {
		return set, fmt.Errorf("an empty CPU list")
	}
	for _, f := range strings.Split(l, ",") {
		lo, hi, isRange := strings.Cut(f, "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b < a || b >= 1024 {
			return set, fmt.Errorf("%q is not a CPU number or range", f)
		}
		for c := a; c <= b; c++ {
			set.Set(c)
		}
	}
	return set, nil
}

// Renice gives every thread of this process nice value n (a process the
// harness does not start as a peer, such as a rank of "rxego-bench
// workloads", applies -nice with it). It needs root for a negative n.
func Renice(n int) error { return applySched(Sched{Nice: n}, false) }

// applySched gives every thread of this process the nice value and the
// CPUs s asks of role. It goes over the threads until a pass finds no new
// one: a thread the runtime starts meanwhile inherits the settings of the
// thread that started it, or is found by the next pass.
func applySched(s Sched, server bool) error {
	cpus := s.Client
	if server {
		cpus = s.Server
	}
	if s.Nice == 0 && cpus == "" {
		return nil
	}
	var set unix.CPUSet
	if cpus != "" {
		var err error
		if set, err = parseCPUList(cpus); err != nil {
			return err
		}
	}
	done := map[int]bool{}
	for pass := 0; pass < 100; pass++ {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		fresh := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			fresh++
			done[tid] = true
			if s.Nice != 0 {
				if err := unix.Setpriority(unix.PRIO_PROCESS, tid, s.Nice); err != nil && err != unix.ESRCH {
					return fmt.Errorf("nice %d: %w", s.Nice, err)
				}
			}
			if cpus != "" {
				if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
					return fmt.Errorf("CPUs %s: %w", cpus, err)
				}
			}
		}
		if fresh == 0 {
			return nil
		}
	}
	return fmt.Errorf("threads kept appearing while setting nice and CPUs")
}
