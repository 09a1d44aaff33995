package perftest

import (
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Perftest's table layout (perftest_parameters.h), so scripts that parse
// perftest's output parse rxego's.
const (
	resultLine   = "---------------------------------------------------------------------------------------\n"
	resultFmtBW  = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
	resultFmtLat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n"
	reportFmtBW  = " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n"
	reportFmtLat = " %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n"
	// latTail is LAT_MEASURE_TAIL: the largest samples perftest drops.
	latTail = 2
	mb      = 1 << 20
)

// LatStats is one line of a latency test's table, in microseconds.
type LatStats struct {
	Size                        int
	Iters                       int
	Min, Max, Typical, Avg, Std float64
	Pct99, Pct999               float64
}

// printer writes perftest's report format; gbits prints bandwidth in
// Gb/s (--report_gbits).
type printer struct {
	w     io.Writer
	gbits bool
}

func (p *printer) f(format string, a ...any) { fmt.Fprintf(p.w, format, a...) }

func (p *printer) s(text string) { io.WriteString(p.w, text) }

// printHeader prints the test title and settings block.
func (s *session) printHeader() {
	c := &s.cfg
	p := s.out
	p.s(resultLine)
	title := verbNames[c.Test.verb()] + " "
	if c.Test.verb() == atomic {
		title += string(c.Atomic) + " "
	}
	if c.Bidirectional {
		title += "Bidirectional "
	}
	if c.Test.Lat() {
		title += "Latency "
	} else {
		title += "BW "
	}
	p.f("                    %sTest\n", title)
	p.f(" Dual-port       : OFF\t\tDevice         : rxego\n")
	p.f(" Number of qps   : %d\t\tTransport type : IB\n", c.NumQPs)
	p.f(" Connection type : RC\t\tUsing SRQ      : OFF\n")
	if s.client || c.Test.Lat() {
		p.f(" TX depth        : %d\n", s.txDepth())
	}
	if c.Test.verb() == send && (!s.client || c.Test.Lat()) {
		p.f(" RX depth        : %d\n", c.RxDepth)
	}
	if !c.Test.Lat() {
		p.f(" CQ Moderation   : %d\n", c.cqMod)
	}
	p.f(" Mtu             : %d[B]\n", c.mtu.Bytes())
	p.f(" Link type       : Ethernet\n")
	p.f(" GID address     : %s\n", netip.AddrFrom16(s.gid()).Unmap())
	if v := c.Test.verb(); v == read || v == atomic {
		p.f(" Outstand reads  : %d\n", c.OutReads)
	} else {
		p.f(" Max inline data : 0[B]\n")
	}
	if c.RDMACM {
		p.f(" rdma_cm QPs\t : ON\n")
		p.f(" Data ex. method : rdma_cm\n")
	} else {
		p.f(" rdma_cm QPs\t : OFF\n")
		p.f(" Data ex. method : Ethernet\n")
	}
	p.s(resultLine)
}

// printDests prints both sides' records as ctx_print_pingpong_data does.
func (s *session) printDests() error {
	for _, d := range s.my {
		s.printDest("local", d)
	}
	return nil
}

// printRemote prints the peer's records.
func (s *session) printRemote() {
	for _, d := range s.rem {
		s.printDest("remote", d)
	}
}

func (s *session) printDest(side string, d Dest) {
	p := s.out
	p.f(" %s address: LID %s QPN %s PSN %s", side, cAltHex(uint64(d.LID), 4), cAltHex(uint64(d.QPN), 6), cAltHex(uint64(d.PSN), 6))
	switch s.cfg.Test.verb() {
	case read:
		p.f(" OUT %s", cAltHex(uint64(d.OutReads), 4))
		fallthrough
	case write:
		p.f(" RKey %s VAddr %s", cAltHex(uint64(d.RKey), 8), cAltHex(d.VAddr, 16))
	}
	p.f("\n GID: ")
	for i, g := range d.GID {
		if i > 0 {
			p.f(":")
		}
		p.f("%02d", g)
	}
	p.f("\n")
}

// cAltHex formats v as C's printf("%#0*x", width, v): zero-padded to
// width including the "0x" prefix, which C leaves off for 0.
func cAltHex(v uint64, width int) string {
	if v == 0 {
		return strings.Repeat("0", max(width, 1))
	}
	h := fmt.Sprintf("%x", v)
	if pad := width - 2 - len(h); pad > 0 {
		h = strings.Repeat("0", pad) + h
	}
	return "0x" + h
}

// bwReport computes perftest's BW figures (print_report_bw) from the post
// and completion times of the work requests of size bytes, in post order
// and completion order; cqMod is the signalling interval the peak is
// computed over.
func bwReport(size int, posted, completed []time.Duration, cqMod int) Report {
	n := len(posted)
	r := Report{Size: uint64(size), Iters: uint64(n)}
	if n == 0 || len(completed) != n {
		return r
	}
	r = avgReport(size, n, completed[n-1]-posted[0])
	opt := completed[0] - posted[0]
	for i := 0; i < n; i++ {
		for j := (i+1+cqMod-1)/cqMod*cqMod - 1; j < n; j += cqMod {
			if t := (completed[j] - posted[i]) / time.Duration(j-i+1); t < opt {
				opt = t
			}
		}
		if n%cqMod != 0 {
			j := n - 1
			if t := (completed[j] - posted[i]) / time.Duration(j-i+1); t < opt {
				opt = t
			}
		}
	}
	if opt <= 0 {
		opt = 1
	}
	r.BWPeak = float64(size) / opt.Seconds() / mb
	return r
}

// avgReport is a report without the peak: n messages of size in span.
func avgReport(size, n int, span time.Duration) Report {
	total := max(span.Seconds(), 1e-9)
	return Report{Size: uint64(size), Iters: uint64(n), BWAvg: float64(size) * float64(n) / total / mb,
		MsgRate: float64(n) / total / 1e6}
}

// gbitsPerMB converts MB/s (2^20 bytes) to Gb/s (10^9 bits), perftest's
// two report formats (--report_gbits).
const gbitsPerMB = mb * 8 / 1e9

// bwHeader prints the BW table's column titles.
func (p *printer) bwHeader() {
	if p.gbits {
		p.s(strings.ReplaceAll(resultFmtBW, "MB/sec", "Gb/sec"))
		return
	}
	p.s(resultFmtBW)
}

// printBW prints one line of the BW table.
func (p *printer) printBW(r Report) {
	f := 1.0
	if p.gbits {
		f = gbitsPerMB
	}
	p.f(reportFmtBW, r.Size, r.Iters, r.BWPeak*f, r.BWAvg*f, r.MsgRate)
}

// latStats computes a latency line (print_report_lat) from the times of
// the iters posts: the deltas between successive posts, halved for
// round trips (SEND and WRITE ping-pong), sorted, the two largest dropped.
func latStats(size int, posted []time.Duration, roundTrip bool) LatStats {
	st := LatStats{Size: size, Iters: len(posted)}
	if len(posted) < latTail+2 {
		return st
	}
	factor := 1.0
	if roundTrip {
		factor = 2
	}
	d := make([]float64, len(posted)-1)
	for i := range d {
		d[i] = float64(posted[i+1]-posted[i]) / float64(time.Microsecond) / factor
	}
	slices.Sort(d)
	m := len(d) - latTail
	if (m-1)%2 != 0 {
		st.Typical = (d[m/2] + d[m/2-1]) / 2
	} else {
		st.Typical = d[m/2]
	}
	var sum float64
	for _, v := range d[:m] {
		sum += v
	}
	st.Avg = sum / float64(m)
	var vs float64
	for _, v := range d[:m] {
		// perftest squares an int-truncated difference; keep its figure.
		dv := math.Trunc(st.Avg - v)
		vs += dv * dv
	}
	st.Std = math.Sqrt(vs / float64(m))
	st.Min, st.Max = d[0], d[m]
	st.Pct99 = d[int(math.Ceil(float64(m)*0.99))]
	st.Pct999 = d[int(math.Ceil(float64(m)*0.999))]
	return st
}

// printLat prints one line of the latency table.
func (p *printer) printLat(st LatStats) {
	p.f(reportFmtLat, st.Size, st.Iters, st.Min, st.Max, st.Typical, st.Avg, st.Std, st.Pct99, st.Pct999)
}
