package lab

import (
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
)

// lossKey is one direction of traffic: from and to are addresses or the
// zero Addr for "any"; keepACKs exempts RC Acknowledge packets.
type lossKey struct {
	from, to netip.Addr
	keepACKs bool
}

// nftTable is the nftables table (bridge family) holding the loss rules.
const nftTable = "rxegolab"

// SetLoss drops percent % of the RoCEv2 packets (UDP port 4791) sent from
// address from to address to, chosen at random per packet. Either address
// may be "" for any; both must be the same family. Rules apply on the bridge
// to frames between guests and to and from the host. Percent 0 removes the
// rule; a second call for the same pair replaces it. Close removes all.
func (l *Lab) SetLoss(from, to string, percent int) error {
	return l.setLoss(from, to, percent, false)
}

// SetLossKeepACKs is SetLoss for every RoCEv2 packet but RC Acknowledge
// packets (BTH opcode 0x11: ACKs and NAKs), which always pass. It replaces
// a SetLoss rule for the same pair and the other way round. Tests whose
// tools exit right after their last message use it: a lost final ACK
// leaves the peer resending to a QP that no longer exists.
func (l *Lab) SetLossKeepACKs(from, to string, percent int) error {
	return l.setLoss(from, to, percent, true)
}

func (l *Lab) setLoss(from, to string, percent int, keepACKs bool) error {
	if percent < 0 || percent > 100 {
		return fmt.Errorf("loss percent %d: want 0 to 100", percent)
	}
	k := lossKey{keepACKs: keepACKs}
	var err error
	if k.from, err = parseOptAddr(from); err != nil {
		return err
	}
	if k.to, err = parseOptAddr(to); err != nil {
		return err
	}
	if k.from.IsValid() && k.to.IsValid() && k.from.Is4() != k.to.Is4() {
		return fmt.Errorf("loss %s -> %s: mixed address families", from, to)
	}
	other := k
	other.keepACKs = !keepACKs
	l.mu.Lock()
	defer l.mu.Unlock()
	old, had := l.loss[k]
	oldOther, hadOther := l.loss[other]
	delete(l.loss, other)
	if percent == 0 {
		delete(l.loss, k)
	} else {
		l.loss[k] = percent
	}
	if err := l.applyLoss(); err != nil {
		// Leave the table as it was described before the failed call.
		if had {
			l.loss[k] = old
		} else {
			delete(l.loss, k)
		}
		if hadOther {
			l.loss[other] = oldOther
		}
		return err
	}
	return nil
}

// ClearLoss removes every loss rule.
func (l *Lab) ClearLoss() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.loss)
	return l.applyLoss()
}

func parseOptAddr(s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return a, fmt.Errorf("loss rule address %q: %w", s, err)
	}
	return a.Unmap(), nil
}

// applyLoss replaces the nftables table with one describing l.loss, in one
// nft transaction; l.mu must be held.
func (l *Lab) applyLoss() error {
	var b strings.Builder
	// "add" then "delete" makes the delete succeed whether or not the table
	// existed.
	fmt.Fprintf(&b, "add table bridge %s\ndelete table bridge %s\n", nftTable, nftTable)
	if len(l.loss) > 0 {
		fmt.Fprintf(&b, "table bridge %s {\n", nftTable)
		// input: guest -> host; output: host -> guest; forward: guest -> guest.
		for _, hook := range []string{"input", "output", "forward"} {
			fmt.Fprintf(&b, "\tchain %s {\n\t\ttype filter hook %s priority 0; policy accept;\n", hook, hook)
			for _, r := range l.lossRules() {
				fmt.Fprintf(&b, "\t\t%s\n", r)
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	cmd := exec.Command("ip", "netns", "exec", l.name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %v: %s\nruleset:\n%s", err, strings.TrimSpace(string(out)), b.String())
	}
	return nil
}

// lossRules renders l.loss as nft rule bodies in a stable order.
func (l *Lab) lossRules() []string {
	var rules []string
	for k, pct := range l.loss {
		fam := "ip"
		if (k.from.IsValid() && k.from.Is6()) || (k.to.IsValid() && k.to.Is6()) {
			fam = "ip6"
		}
		match := "udp dport 4791 "
		if k.keepACKs {
			// The BTH opcode is the first byte after the UDP header.
			match += "@th,64,8 != 0x11 "
		}
		var m strings.Builder
		if !k.from.IsValid() && !k.to.IsValid() {
			// Any address: IPv4 and IPv6 alike.
			rules = append(rules, match+lossVerdict(pct))
			continue
		}
		if k.from.IsValid() {
			fmt.Fprintf(&m, "%s saddr %s ", fam, k.from)
		}
		if k.to.IsValid() {
			fmt.Fprintf(&m, "%s daddr %s ", fam, k.to)
		}
		m.WriteString(match)
		m.WriteString(lossVerdict(pct))
		rules = append(rules, m.String())
	}
	slices.Sort(rules)
	return rules
}

// LossRuleset returns the lab's current nftables ruleset with counters, for
// logs and reports.
func (l *Lab) LossRuleset() (string, error) {
	out, err := exec.Command("ip", "netns", "exec", l.name, "nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("nft list ruleset: %v: %s", err, out)
	}
	return string(out), nil
}

// lossVerdict is the tail of a rule dropping pct % at random; numgen's
// values are 0 to 99, so 100 % is a plain drop.
func lossVerdict(pct int) string {
	if pct >= 100 {
		return "counter drop"
	}
	return fmt.Sprintf("numgen random mod 100 < %d counter drop", pct)
}
