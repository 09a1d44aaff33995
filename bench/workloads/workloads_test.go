package workloads

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
)

// TestTableBeside checks a row's cell carries the median of the row it
// names beside it (the prefix cache's owner CPU beside its Gbit/s), and
// the ratio to its comparison row.
func TestTableBeside(t *testing.T) {
	var px table
	px.title = "Shared prefix"
	for _, v := range []struct{ rdma, tcp, cpu, tcpCPU float64 }{{30, 20, 0.1, 0.2}, {10, 10, 0.3, 0.4}, {20, 16, 0.2, 0.3}} {
		px.add("rdma Gbit/s", "Gbit/s", v.rdma, "tcp Gbit/s", false)
		px.add("rdma owner CPU", "s", v.cpu, "tcp owner CPU", true)
		px.add("tcp Gbit/s", "Gbit/s", v.tcp, "tcp Gbit/s", false)
		px.add("tcp owner CPU", "s", v.tcpCPU, "tcp owner CPU", true)
		px.besides("rdma Gbit/s", "rdma owner CPU")
		px.besides("tcp Gbit/s", "tcp owner CPU")
	}
	var b bytes.Buffer
	px.write(&b)
	for _, want := range []string{
		"| rdma Gbit/s (Gbit/s) | 20 (rdma owner CPU 0.2 s) | 10-30 | 1.25x tcp Gbit/s |",
		"| tcp Gbit/s (Gbit/s) | 16 (tcp owner CPU 0.3 s) | 10-20 | 1.00x tcp Gbit/s |",
		"| rdma owner CPU (s) | 0.2 | 0.1-0.3 | 0.67x tcp owner CPU |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestNiceRank checks that a rank started with -nice ("nice-rank N NAME
// ...") sets nice value N on every thread of its process before it runs
// the rank (here an unknown workload, which then fails as such).
func TestNiceRank(t *testing.T) {
	var stderr bytes.Buffer
	if code := Main([]string{"nice-rank", "7", "no-such-workload"}, io.Discard, &stderr); code != 2 {
		t.Fatalf("exit %d, want 2 (unknown workload); stderr: %s", code, stderr.String())
	}
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skip(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/stat")
		if err != nil {
			continue // the thread ended
		}
		// Field 19 is the nice value; the command name (field 2) may
		// hold spaces, so count from its closing parenthesis.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 17 {
			t.Errorf("thread %s: stat %q has no nice field", e.Name(), b)
		} else if f[16] != "7" {
			t.Errorf("thread %s: nice %s, want 7", e.Name(), f[16])
		}
	}
	if code := Main([]string{"nice-rank", "x", "prefix"}, io.Discard, &stderr); code != 1 || !strings.Contains(stderr.String(), "rank at nice x") {
		t.Errorf("a bad nice value: exit %d, %s", code, stderr.String())
	}
}
