package dcqcn

import (
	"fmt"
	"os/exec"
	"strings"

	"github.com/rxego/rxego/internal/testenv/nftcount"
)

// Marker is the bottleneck: an nftables rule in the receiver's namespace
// that sets ECN CE on ECN-capable RoCE packets (UDP port 4791) arriving
// above a packet rate, like a switch marking at a queue threshold, but
// with a token bucket instead of a queue: every packet beyond the rate and
// its burst is marked, none below it.
//
// The limit is in packets, not bytes, because of the depth of nftables'
// buckets (net/netfilter/nft_limit.c): a byte-rate limit ("limit rate over
// 25000000 bytes/second") holds one second of tokens at the rate plus the
// burst (tokens_max = unit*(rate+burst)/rate, the unit being at least a
// second), so time spent below the rate, a dip after a cut or a
// descheduled process, is credit for up to a second of unmarked traffic
// above it later, and the rule holds the rate only on average over many
// seconds. A packet-rate limit holds just its burst. With packets of one
// size (the flows write whole 4096-byte MTUs) it is a byte rate with a
// bucket of a few milliseconds. A UDP GSO datagram must be cut into its
// packets before it reaches the rule (NewTestbed turns UDP segmentation
// offload off on the sender's veth).
type Marker struct {
	ns *Netns
	on bool
}

// table is the nftables table the marker owns.
const table = "rxego_dcqcn"

// Set (re)installs the rule marking packets above perSec packets per
// second with a bucket of burst packets.
func (m *Marker) Set(perSec, burst uint64) error {
	if perSec == 0 || burst == 0 {
		return fmt.Errorf("marker: rate %d/s, burst %d: both must be > 0", perSec, burst)
	}
	return m.set(fmt.Sprintf("%d/second burst %d packets", perSec, burst))
}

func (m *Marker) set(limit string) error {
	if err := m.Off(); err != nil {
		return err
	}
	script := fmt.Sprintf(`table ip %s {
	counter seen {
	}
	counter marked {
	}
	chain bottleneck {
		type filter hook prerouting priority 0; policy accept;
		udp dport 4791 counter name "seen"
		udp dport 4791 ip ecn != not-ect limit rate over %s counter name "marked" ip ecn set ce
	}
}
`, table, limit)
	cmd := exec.Command("ip", "netns", "exec", m.ns.name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %w: %s", err, out)
	}
	m.on = true
	return nil
}

// Off removes the rule; packets pass unmarked.
func (m *Marker) Off() error {
	if !m.on {
		return nil
	}
	m.on = false
	return m.ns.Run("nft", "delete", "table", "ip", table)
}

// Counters returns how many RoCE packets the marker has seen and marked.
func (m *Marker) Counters() (seen, marked uint64, err error) {
	out, err := m.ns.Output("nft", "-j", "list", "counters", "table", "ip", table)
	if err != nil {
		return 0, 0, err
	}
	c, err := nftcount.Parse(out)
	if err != nil {
		return 0, 0, err
	}
	return c["seen"], c["marked"], nil
}
