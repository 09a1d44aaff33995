package harness

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParsePin(t *testing.T) {
	for _, c := range []struct{ in, server, client, err string }{
		{"", "", "", ""},
		{"1", "1", "1", ""},
		{"0/1", "0", "1", ""},
		{"0-3/4-7", "0-3", "4-7", ""},
		{"0,2/1", "0,2", "1", ""},
		{"x", "", "", `"x" is not a CPU number or range`},
		{"1/", "", "", "an empty CPU list"},
		{"3-1", "", "", `"3-1" is not a CPU number or range`},
	} {
		s, cl, err := ParsePin(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParsePin(%q) = %v, want an error with %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || s != c.server || cl != c.client {
			t.Errorf("ParsePin(%q) = %q, %q, %v; want %q, %q", c.in, s, cl, err, c.server, c.client)
		}
	}
	if got := (Sched{Nice: -20, Server: "0", Client: "1"}).String(); got != "nice -20, server on CPU 0, client on CPU 1" {
		t.Errorf("String: %q", got)
	}
	if got := (Sched{Server: "1", Client: "1"}).String(); got != "both peers on CPU 1" {
		t.Errorf("String: %q", got)
	}
	if got := (Sched{Nice: -20, ZeroCopy: true}).String(); got != "nice -20, rxego devices sending from registered memory (ZeroCopy)" {
		t.Errorf("String: %q", got)
	}
}

// TestParseShards checks -shards: one count for both devices or the
// server's and the client's, each at least 1, and how the report names it.
func TestParseShards(t *testing.T) {
	for _, c := range []struct {
		in             string
		server, client int
		ok             bool
	}{
		{"", 0, 0, true},
		{"1", 1, 1, true},
		{"4/1", 4, 1, true},
		{"0", 0, 0, false},
		{"2/", 0, 0, false},
		{"x/1", 0, 0, false},
		{"-1/2", 0, 0, false},
	} {
		s, cl, err := ParseShards(c.in)
		if (err == nil) != c.ok || s != c.server || cl != c.client {
			t.Errorf("ParseShards(%q) = %d, %d, %v; want %d, %d, ok %v", c.in, s, cl, err, c.server, c.client, c.ok)
		}
	}
	if got := (Sched{Nice: -20, ServerShards: 4, ClientShards: 1}).String(); got != "nice -20, rxego devices of 4 (server) and 1 (client) shards" {
		t.Errorf("String: %q", got)
	}
}

// TestApplySchedEveryThread runs applySched in a child process with
// several busy threads and checks that every thread, those started
// before and after, runs on the asked CPU (and at the asked nice value
// where the process may raise its priority).
func TestApplySchedEveryThread(t *testing.T) {
	if os.Getenv("RXEGO_TEST_SCHED_CHILD") != "" {
		schedChild()
		return
	}
	if runtime.GOOS != "linux" {
		t.Skip("Linux thread scheduling")
	}
	nice := 0
	if unix.Setpriority(unix.PRIO_PROCESS, 0, 0) == nil && os.Geteuid() == 0 {
		nice = -5
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestApplySchedEveryThread$")
	cmd.Env = append(os.Environ(), "RXEGO_TEST_SCHED_CHILD=1", "RXEGO_TEST_SCHED_NICE="+strconv.Itoa(nice))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "threads ok") {
		t.Fatalf("child did not check its threads:\n%s", out)
	}
}

func schedChild() {
	fail := func(f string, a ...any) {
		os.Stdout.WriteString("FAIL: " + strings.TrimSpace(fmt.Sprintf(f, a...)) + "\n")
		os.Exit(1)
	}
	nice, _ := strconv.Atoi(os.Getenv("RXEGO_TEST_SCHED_NICE"))
	// Locked goroutines each hold a thread until stop.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	threads := func(n int) {
		started := make(chan struct{})
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				started <- struct{}{}
				<-stop
			}()
		}
		for range n {
			<-started
		}
	}
	threads(4) // before
	if err := applySched(Sched{Nice: nice, Server: "0", Client: "0"}, true); err != nil {
		fail("applySched: %v", err)
	}
	threads(4) // after
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		fail("%v", err)
	}
	if len(ents) < 9 {
		fail("only %d threads", len(ents))
	}
	for _, e := range ents {
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/status")
		if err != nil {
			continue // gone
		}
		if !strings.Contains(string(b), "Cpus_allowed_list:\t0\n") {
			fail("thread %s may run elsewhere: %s", e.Name(), b)
		}
		tid, _ := strconv.Atoi(e.Name())
		p, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
		// The raw system call returns 20 - nice.
		if err == nil && 20-p != nice {
			fail("thread %s at nice %d, want %d", e.Name(), 20-p, nice)
		}
	}
	close(stop)
	wg.Wait()
	os.Stdout.WriteString("threads ok\n")
	os.Exit(0)
}
