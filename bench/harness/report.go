package harness

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Summary is a one-line account of a result, for progress output.
func (r Result) Summary() string {
	if r.Err != "" {
		return "error: " + r.Err
	}
	var parts []string
	if r.Bytes > 0 {
		parts = append(parts, fmt.Sprintf("%.2f Gbit/s", r.Gbps()))
	}
	if r.Msgs > 0 {
		parts = append(parts, fmt.Sprintf("%.3f M/s", r.Rate()/1e6))
	}
	if r.Samples > 0 {
		parts = append(parts, fmt.Sprintf("p50 %s p99 %s", us(r.P50), us(r.P99)))
	}
	if r.CPU > 0 && r.Bytes > 0 {
		parts = append(parts, fmt.Sprintf("%.2f cores", r.Cores()))
	}
	if r.MemPerQP > 0 {
		parts = append(parts, fmt.Sprintf("%.0f B/QP", r.MemPerQP))
	}
	if r.Packets > 0 {
		parts = append(parts, fmt.Sprintf("%.3f allocs/pkt", r.AllocsPerPkt))
	}
	if n := r.Counters["client.retransmits"] + r.Counters["server.retransmits"]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d retransmits", n))
	}
	return strings.Join(parts, ", ")
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f us", float64(d)/1e3) }

// results indexes a run's results.
type results []Result

func (rs results) find(f func(c Case) bool) (Result, bool) {
	for _, r := range rs {
		if f(r.Case) && r.Err == "" {
			return r, true
		}
	}
	return Result{}, false
}

func (rs results) udpBW(mode string, size int) (Result, bool) {
	return rs.udpBWN(mode, size, 1)
}

// udpBWN is the UDP result of n flows at once.
func (rs results) udpBWN(mode string, size, n int) (Result, bool) {
	return rs.find(func(c Case) bool { return c.Kind == UDPBW && c.Mode == mode && c.Size == size && max(c.QPs, 1) == n })
}

// kind finds the one-flow (one-QP) case of kind k; the scale case by its
// kind alone.
func (rs results) kind(k Kind) (Result, bool) {
	return rs.find(func(c Case) bool { return c.Kind == k && (k == RxegoScale || c.QPs <= 1) })
}

// tcpN is the result of n TCP streams at once.
func (rs results) tcpN(n int) (Result, bool) {
	return rs.find(func(c Case) bool { return c.Kind == TCPBW && max(c.QPs, 1) == n })
}

// rxBWN is the rxego bandwidth result of n QPs at once.
func (rs results) rxBWN(op string, size, mtu, n int) (Result, bool) {
	return rs.find(func(c Case) bool {
		return c.Kind == RxegoBW && c.Op == op && c.Size == size && c.MTU == mtu && max(c.QPs, 1) == n
	})
}

func (rs results) udpPing(busy bool) (Result, bool) {
	return rs.find(func(c Case) bool { return c.Kind == UDPPing && c.Busy == busy })
}

func (rs results) rxBW(op string, size, mtu int) (Result, bool) {
	return rs.rxBWN(op, size, mtu, 1)
}

// rxRate returns the message-rate result in a wait mode with the highest
// rate over the post-list sizes measured.
func (rs results) rxRate(busy bool) (Result, bool) {
	var best Result
	found := false
	for _, r := range rs {
		if r.Case.Kind == RxegoRate && r.Case.QPs <= 1 && r.Case.Busy == busy && r.Err == "" && (!found || r.Rate() > best.Rate()) {
			best, found = r, true
		}
	}
	return best, found
}

func (rs results) rxLat(op string, busy bool) (Result, bool) {
	return rs.find(func(c Case) bool { return c.Kind == RxegoLat && c.Op == op && c.Busy == busy })
}

// ratio formats a/b as "1.23x", or "–" when either is missing.
func ratio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

func gbps(r Result, ok bool) string {
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%.2f", r.Gbps())
}

func cores(r Result) string {
	if r.CPU <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", r.Cores())
}

// clientCores is how many CPUs the client process kept busy: in the UDP,
// TCP, WRITE and SEND bandwidth cases, the sender.
func clientCores(r Result) string {
	if r.ClientCPU <= 0 || r.Elapsed <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", r.ClientCPU.Seconds()/r.Elapsed.Seconds())
}

// perCore is throughput per busy CPU: steadier than throughput alone when
// other work shares the machine.
func perCore(r Result) string {
	if r.CPU <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", r.Gbps()/r.Cores())
}

func wait(busy bool) string {
	if busy {
		return "busy-poll"
	}
	return "blocking"
}

// WriteReport prints the markdown report of a run.
// sched is where and at what priority the peers ran (-nice, -pin); each
// result is the median of repeat runs.
func WriteReport(w io.Writer, list []Result, sched Sched, repeat int) {
	rs := results(list)
	host, _ := os.Hostname()
	fmt.Fprintf(w, "# rxego-bench, %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	prio := ""
	if d := sched.String(); d != "" {
		prio = " (" + d + ")"
	}
	fmt.Fprintf(w, "%s, %s/%s, %d CPUs, %s; two processes on loopback%s, one case at a time; each figure the median of %d runs; load average at the end %s.\n\n",
		host, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), kernel(), prio, repeat, loadAvg())

	fmt.Fprintln(w, "## Yardsticks")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| measurement | Gbit/s | M datagrams/s | CPUs busy | sender's CPUs | Gbit/s per CPU | p50 | p99 |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		switch r.Case.Kind {
		case TCPBW, TCPPing, UDPBW, UDPPing, RsocketBW, RsocketPP:
		default:
			continue
		}
		if r.Case.QPs > 1 {
			continue // in the multi-QP table
		}
		row := []string{r.Case.Name(), "", "", "", "", "", "", ""}
		if r.Err != "" {
			row[1] = "error"
		}
		if r.Bytes > 0 {
			row[1] = fmt.Sprintf("%.2f", r.Gbps())
			row[3], row[4], row[5] = cores(r), clientCores(r), perCore(r)
		}
		if r.Msgs > 0 {
			row[2] = fmt.Sprintf("%.3f", r.Rate()/1e6)
		}
		if r.Samples > 0 {
			row[6], row[7] = us(r.P50), us(r.P99)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "UDP: a CRC-32 over every datagram (GSO: every segment) on send and receive, as rxego's ICRC and with its CRC kernel (icrc.ChecksumIEEE); received rate. single = one datagram per system call, mmsg = sendmmsg/recvmmsg of 64, gso = 64 KiB GSO sends with GRO on receive, gso-runs = gso with the datagrams cut as a 64 KiB WRITE's at MTU 4096 must be (per 16 segments one alone and one of 15: a WRITE's FIRST packet carries a RETH and cannot share a GSO datagram with the rest).")
	fmt.Fprintln(w)

	tcp, tcpOK := rs.kind(TCPBW)
	fmt.Fprintln(w, "## rxego bandwidth (RC, one QP)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| operation | message | MTU | Gbit/s | vs UDP GSO/GRO at the MTU | vs TCP | CPUs busy | client's CPUs | Gbit/s per CPU | allocs/packet | retransmits |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rs {
		c := r.Case
		if c.Kind != RxegoBW || c.QPs > 1 {
			continue
		}
		if r.Err != "" {
			fmt.Fprintf(w, "| %s | %s | %d | error | | | | | | | |\n", strings.ToUpper(c.Op), sizeName(c.Size), c.MTU)
			continue
		}
		u, _ := rs.udpBW(UDPGSO, c.MTU)
		retr := r.Counters["client.retransmits"] + r.Counters["server.retransmits"]
		fmt.Fprintf(w, "| %s | %s | %d | %.2f | %s | %s | %s | %s | %s | %.3f | %d |\n", strings.ToUpper(c.Op), sizeName(c.Size), c.MTU,
			r.Gbps(), ratio(r.Gbps(), u.Gbps()), ratio(r.Gbps(), tcp.Gbps()), cores(r), clientCores(r), perCore(r), r.AllocsPerPkt, retr)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "The client sends the data of WRITE and SEND and receives that of READ.")
	fmt.Fprintln(w)

	fmt.Fprintln(w, "## rxego latency (64 bytes, round trip)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| operation | wait | p50 | p99 | UDP ping-pong p50 (same wait) | p50 vs UDP |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|")
	for _, r := range rs {
		c := r.Case
		if c.Kind != RxegoLat {
			continue
		}
		if r.Err != "" {
			fmt.Fprintf(w, "| %s | %s | error | | | |\n", strings.ToUpper(c.Op), wait(c.Busy))
			continue
		}
		u, _ := rs.udpPing(c.Busy)
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", strings.ToUpper(c.Op), wait(c.Busy), us(r.P50), us(r.P99),
			us(u.P50), ratio(float64(r.P50), float64(u.P50)))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "SEND: ping-pong (the server sends each message back); WRITE, READ, atomic (fetch-and-add): post to completion.")
	fmt.Fprintln(w)

	if _, ok := rs.kind(RxegoRate); ok {
		u, _ := rs.udpBW(UDPMmsg, 64)
		fmt.Fprintln(w, "## rxego message rate")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| measurement | per post | wait | M messages/s | UDP mmsg 64 B datagrams/s | ratio | CPUs busy | allocs/packet |")
		fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|---:|---:|")
		for _, r := range rs {
			if r.Case.Kind != RxegoRate || r.Case.QPs > 1 || r.Err != "" {
				continue
			}
			fmt.Fprintf(w, "| WRITE 64 B, depth %d | %d | %s | %.3f | %.3f M | %s | %s | %.3f |\n", r.Case.Depth, r.Case.rateBatch(),
				wait(r.Case.Busy), r.Rate()/1e6, u.Rate()/1e6, ratio(r.Rate(), u.Rate()), cores(r), r.AllocsPerPkt)
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "WRITEs posted as post lists of 32 or 64, the last of each signaled (perftest's completion moderation, -Q): four or two lists in flight at depth 128. Blocking waits in CQ.PollWait; busy-poll spins on CQ.Poll with Options.BusyPoll, as perftest's ib_write_bw polls its CQ unless given -e.")
		fmt.Fprintln(w)
	}
	writeMulti(w, rs)
	if r, ok := rs.kind(RxegoScale); ok {
		fmt.Fprintln(w, "## rxego scale")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| QPs | heap per idle QP | heap for all | WRITE throughput | messages/s | QPs that carried no traffic |")
		fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|")
		fmt.Fprintf(w, "| %d | %.0f B | %.1f MiB | %.2f Gbit/s | %.0f | %d |\n\n", r.Case.QPs, r.MemPerQP,
			float64(r.MemTotal)/(1<<20), r.Gbps(), r.Rate(), r.Counters["client.qps_without_traffic"])
	}

	fmt.Fprintln(w, "## Targets")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | measured | met |")
	fmt.Fprintln(w, "|---|---:|---|")
	// row prints a target's row: the median figure, the runs' ranges and
	// whether the median meets the target (below want when atMost).
	row := func(name string, val, want float64, unit, ranges string, atMost, ok bool) {
		if !ok || val <= 0 {
			fmt.Fprintf(w, "| %s | – | not measured |\n", name)
			return
		}
		met := "yes"
		if (!atMost && val < want) || (atMost && val > want) {
			met = "**no**"
		}
		fmt.Fprintf(w, "| %s | %.2f%s (runs: %s) | %s |\n", name, val, unit, ranges, met)
	}
	vs := func(a Result, b Result, what, unit string) string {
		return fmt.Sprintf("rxego %s, %s %s %s", a.span(1, "%.1f"), what, b.span(1, "%.1f"), unit)
	}
	w4, ok4 := rs.rxBW("write", 64<<10, 4096)
	w1, ok1 := rs.rxBW("write", 64<<10, 1024)
	g4, okg := rs.udpBW(UDPGSO, 4096)
	row("WRITE 64 KiB, MTU 4096, vs TCP (>= 1.5x)", w4.Gbps()/tcp.Gbps(), 1.5, "x", vs(w4, tcp, "TCP", "Gbit/s"), false, ok4 && tcpOK)
	row("WRITE 64 KiB, MTU 4096, vs UDP GSO/GRO 4 KiB (>= 0.6x)", w4.Gbps()/g4.Gbps(), 0.6, "x", vs(w4, g4, "UDP", "Gbit/s"), false, ok4 && okg)
	row("WRITE 64 KiB, MTU 1024, vs TCP (>= 1x)", w1.Gbps()/tcp.Gbps(), 1, "x", vs(w1, tcp, "TCP", "Gbit/s"), false, ok1 && tcpOK)
	for _, busy := range []bool{false, true} {
		s, ok := rs.rxLat("send", busy)
		u, uok := rs.udpPing(busy)
		row(fmt.Sprintf("SEND 64 B ping-pong p50 vs UDP, %s (<= 1.3x)", wait(busy)), float64(s.P50)/float64(u.P50), 1.3, "x",
			vs(s, u, "UDP", "us"), true, ok && uok)
	}
	for _, busy := range []bool{false, true} {
		rate, rok := rs.rxRate(busy)
		row(fmt.Sprintf("WRITE 64 B message rate, depth 128, %s (best post list: %d) (>= 2 M/s)", wait(busy), rate.Case.rateBatch()),
			rate.Rate()/1e6, 2, " M/s", rate.span(1e6, "%.2f")+" M/s", false, rok)
	}
	if sc, ok := rs.kind(RxegoScale); ok && sc.Case.QPs > 0 {
		mib := sc.MemPerQP * 10000 / (1 << 20)
		met := "yes"
		if mib > 40 {
			met = "**no**"
		}
		fmt.Fprintf(w, "| 10,000 idle RC QPs under 40 MiB | %.1f MiB | %s |\n", mib, met)
	}
	defer writeCeiling(w, rs, tcp, tcpOK)
	var worst float64
	for _, r := range rs {
		if r.Packets > 0 && r.AllocsPerPkt > worst {
			worst = r.AllocsPerPkt
		}
	}
	fmt.Fprintf(w, "| zero allocations per packet (largest seen in a bandwidth or rate run) | %.4f | %s |\n", worst,
		map[bool]string{true: "yes (exact per-path checks: go test -run NoAllocs ./qp ./transport ./bench)", false: "**no**"}[worst < 0.01])
}

// writeCeiling bounds what a stack over UDP sockets could reach against
// TCP on this machine, from raw UDP GSO/GRO's own figures. Such a stack
// makes at least raw UDP's system calls for every byte, so it moves at
// most raw UDP's Gbit/s per busy CPU on every CPU of the machine; and one
// flow's datagrams leave in order from one thread at a time, so a
// one-QP stream whose sender keeps to about one CPU moves about raw UDP's
// Gbit/s per CPU of its sending process (whose sendmmsg also pays for
// loopback delivery). When these are below a target ratio to TCP, the
// machine, not the stack, rules it out.
func writeCeiling(w io.Writer, rs results, tcp Result, tcpOK bool) {
	if !tcpOK || tcp.Gbps() <= 0 {
		return
	}
	var lines []string
	for _, size := range []int{4096, 1024} {
		u, ok := rs.udpBW(UDPGSO, size)
		if !ok || u.CPU <= 0 || u.ClientCPU <= 0 {
			continue
		}
		all := u.Gbps() / u.Cores() * float64(runtime.NumCPU())
		sender := u.Gbps() / (u.ClientCPU.Seconds() / u.Elapsed.Seconds())
		lines = append(lines, fmt.Sprintf("with %s segments, %.1f Gbit/s per CPU of the sending process (%.2fx TCP) and %.1f Gbit/s on all %d CPUs (%.2fx)",
			sizeName(size), sender, sender/tcp.Gbps(), all, runtime.NumCPU(), all/tcp.Gbps()))
	}
	if len(lines) > 0 {
		fmt.Fprintf(w, "\nCeiling for a stack over UDP sockets, at raw UDP GSO/GRO's efficiency (it makes at least those system calls for each byte, and one flow's sendmmsg calls, which carry loopback delivery, run one at a time): %s; TCP %.1f Gbit/s.\n",
			strings.Join(lines, "; "), tcp.Gbps())
	}
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return runtime.GOOS
	}
	return "Linux " + strings.TrimSpace(string(b))
}

// multiCounts are the QP counts of the bandwidth results, one included
// when several are there, in rising order.
func multiCounts(rs results) []int {
	var ns []int
	for _, r := range rs {
		if n := max(r.Case.QPs, 1); r.Case.Kind == RxegoBW && !slices.Contains(ns, n) {
			ns = append(ns, n)
		}
	}
	slices.Sort(ns)
	return ns
}

// writeMulti prints the multi-QP rows: for each QP count, N TCP streams,
// N UDP GSO/GRO flows and rxego's operations over N QPs of one device
// pair, with the ratios of the same sitting and the CPUs each row kept
// busy; then the message rate over several QPs.
func writeMulti(w io.Writer, rs results) {
	if _, ok := rs.find(func(c Case) bool { return c.Kind == RxegoBW && c.QPs > 1 }); !ok {
		return
	}
	fmt.Fprintln(w, "## rxego over several QPs (64 KiB messages, one device pair)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| QPs (streams, flows) | TCP Gbit/s (CPUs) | UDP GSO/GRO 4 KiB Gbit/s (CPUs) | operation | MTU | rxego Gbit/s | CPUs busy | vs TCP | vs UDP |")
	fmt.Fprintln(w, "|---:|---:|---:|---|---:|---:|---:|---:|---:|")
	for _, n := range multiCounts(rs) {
		t, tok := rs.tcpN(n)
		u, uok := rs.udpBWN(UDPGSO, 4096, n)
		ts, us := "–", "–"
		if tok {
			ts = fmt.Sprintf("%.2f (%s)", t.Gbps(), cores(t))
		}
		if uok {
			us = fmt.Sprintf("%.2f (%s)", u.Gbps(), cores(u))
		}
		for _, op := range []string{"write", "read", "send"} {
			for _, mtu := range []int{4096, 1024} {
				r, ok := rs.rxBWN(op, 64<<10, mtu, n)
				if !ok {
					continue
				}
				fmt.Fprintf(w, "| %d | %s | %s | %s | %d | %.2f | %s | %s | %s |\n", n, ts, us, strings.ToUpper(op), mtu,
					r.Gbps(), cores(r), ratio(r.Gbps(), t.Gbps()), ratio(r.Gbps(), u.Gbps()))
			}
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Each QP keeps max(2, 64/N) messages in flight on its own memory; all complete on one CQ. The devices have the default shards (one per CPU, but one on two CPUs or fewer) and source ports.")
	fmt.Fprintln(w)
	for _, r := range rs {
		if r.Case.Kind == RxegoRate && r.Case.QPs > 1 && r.Err == "" {
			fmt.Fprintf(w, "WRITE 64 B message rate over %d QPs (depth %d each, post lists of %d, %s): %.3f M/s, %s CPUs busy.\n\n",
				r.Case.QPs, r.Case.Depth, r.Case.rateBatch(), wait(r.Case.Busy), r.Rate()/1e6, cores(r))
		}
	}
}
