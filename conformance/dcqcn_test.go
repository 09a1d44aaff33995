package conformance

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/internal/testenv/nftcount"
)

// ecnMarker marks CE, on the lab bridge, every RoCE packet from p's guest
// to p's host end, as a congested switch would (rxe sends Not-ECT packets,
// which a switch would leave alone; nftables marks them anyway), and counts
// the RoCE packets rxego sends to the guest and how many of them are
// ECT(0). Its table is per kernel, so kernels can run at once.
type ecnMarker struct {
	ns, table string
}

// newECNMarker installs the marking rule for p.
func newECNMarker(t *testing.T, p *Peer) *ecnMarker {
	t.Helper()
	host, guest := p.HostIP, p.Guest.IP()
	m := &ecnMarker{ns: p.Lab.Name(), table: "rxegodcqcn" + strings.ReplaceAll(guest, ".", "_")}
	// input: frames from the guest to the host; output: from the host.
	script := fmt.Sprintf(`add table bridge %[1]s
delete table bridge %[1]s
table bridge %[1]s {
	counter marked {
	}
	counter sent {
	}
	counter sent_ect0 {
	}
	chain input {
		type filter hook input priority 0; policy accept;
		ip saddr %[2]s ip daddr %[3]s udp dport 4791 counter name "marked" ip ecn set ce
	}
	chain output {
		type filter hook output priority 0; policy accept;
		ip saddr %[3]s ip daddr %[2]s udp dport 4791 counter name "sent"
		ip saddr %[3]s ip daddr %[2]s udp dport 4791 ip ecn ect0 counter name "sent_ect0"
	}
}
`, m.table, guest, host)
	if err := m.nft(script); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.nft(fmt.Sprintf("add table bridge %[1]s\ndelete table bridge %[1]s\n", m.table)) })
	return m
}

func (m *ecnMarker) nft(script string) error {
	cmd := exec.Command("ip", "netns", "exec", m.ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %v: %s", err, out)
	}
	return nil
}

// counters returns the packet counts of the marker's counters by name.
func (m *ecnMarker) counters() (map[string]uint64, error) {
	out, err := exec.Command("ip", "netns", "exec", m.ns, "nft", "-j", "list", "counters", "table", "bridge", m.table).Output()
	if err != nil {
		return nil, fmt.Errorf("nft list counters: %w", err)
	}
	return nftcount.Parse(out)
}

// dcqcnCounters are the rxego counters marking moves: the packets it
// received marked and the CNPs it answered them with.
var dcqcnCounters = []string{"ecn_marked_pkts_received", "cnps_sent"}

// TestDCQCNAgainstRxe runs ibv_rc_pingpong against rxego in both roles
// with every RoCE packet from rxe to rxego marked CE on the bridge. rxego
// sends its data ECT(0), as DCQCN needs, and answers the marks with CNPs
// (opcode 0x81, BECN) to rxe's QP. rxe must take neither in its stride
// wrongly: its hw_counters show no error, every message is verified byte
// for byte, and the packet counts balance with the CNPs being exactly the
// packets rxego sent that rxe did not count (rxe drops an opcode outside
// its QP's class before its rcvd_pkts counter); and every other packet
// rxego sent rxe carried ECT(0).
func TestDCQCNAgainstRxe(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, size := range []int{4096, 65536} {
			for _, server := range []bool{true, false} {
				r := ppRun{Tool: "rc", Size: size, Iters: 20, RxegoServer: server, Timeout: 2 * time.Minute}
				c := Case{Name: r.name() + " CE-marked", Role: r.role(), Expect: dcqcnCounters,
					Require: []string{"rxego:ecn_marked_pkts_received", "rxego:cnps_sent"}}
				p.Case(t, c, func(t *testing.T) Outcome { return p.dcqcnRun(t, r) })
			}
		}
	})
}

// dcqcnRun runs r behind the marker and accounts for the CNPs.
func (p *Peer) dcqcnRun(t *testing.T, r ppRun) Outcome {
	t.Helper()
	tapBefore, err := p.tapDrops()
	if err != nil {
		t.Fatal(err)
	}
	m := newECNMarker(t, p)
	out := p.pingpong(t, r)
	c, err := m.counters()
	if err != nil {
		t.Fatal(err)
	}
	tapAfter, err := p.tapDrops()
	if err != nil {
		t.Fatal(err)
	}
	cnps := out.Rxego["cnps_sent"]
	if c["marked"] == 0 || out.Rxego["ecn_marked_pkts_received"] == 0 {
		t.Errorf("the bridge marked %d packets, rxego saw %d marked", c["marked"], out.Rxego["ecn_marked_pkts_received"])
	}
	if out.Rxego["cnps_received"] != 0 {
		t.Errorf("rxego received %d CNPs from rxe, which has no DCQCN", out.Rxego["cnps_received"])
	}
	// What rxego sent the guest: its data, ACKs and CNPs. All but the
	// CNPs (DSCP 48, Not-ECT) carry ECT(0).
	if c["sent"] == 0 || c["sent_ect0"] != c["sent"]-cnps {
		t.Errorf("rxego sent %d RoCE packets to rxe, %d of them ECT(0), %d CNPs: want all but the CNPs ECT(0)",
			c["sent"], c["sent_ect0"], cnps)
	}
	over := tapAfter.minus(tapBefore)
	out.Dropped = &Drops{ToGuest: cnps}
	out.Overrun = over
	out.Note = fmt.Sprintf("%s; %d packets from rxe marked CE, %d CNPs to rxe (ignored by it), %d of %d data/ACK packets to rxe ECT(0)",
		out.Note, c["marked"], cnps, c["sent_ect0"], c["sent"]-cnps)
	if over != (Drops{}) {
		out.Note += fmt.Sprintf("; guest overran: tap dropped %d to rxe, %d from rxe", over.ToGuest, over.FromGuest)
	}
	return out
}
