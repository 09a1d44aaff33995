package dcqcn

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/bth"
	"github.com/rxego/rxego/congestion"
	"github.com/rxego/rxego/internal/app/trace"
	"github.com/rxego/rxego/qp"
)

// capture is a tcpdump running in a namespace.
type capture struct {
	cmd  *exec.Cmd
	done chan error
}

// startCapture runs tcpdump on veth0 in n, writing RoCE frames to path,
// and returns once it captures.
func startCapture(t *testing.T, n *Netns, path string) *capture {
	t.Helper()
	if _, err := exec.LookPath("tcpdump"); err != nil {
		t.Skip("tcpdump not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	// A small snap length and a large buffer: in immediate mode libpcap
	// gives every frame a slot of the snap length, and with the default
	// (256 KiB) a 2 MiB ring holds a handful of frames, so a busy tcpdump
	// drops a burst of 4 KiB packets.
	cmd := n.Command(ctx, "tcpdump", "-i", "veth0", "-n", "-s", "9100", "-B", "16384", "-U", "--immediate-mode", "-w", path, "udp", "port", "4791")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "listening on") {
				ready <- true
				break
			}
		}
		for sc.Scan() { // drain, so tcpdump never blocks on its stderr
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("tcpdump exited before capturing")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("tcpdump did not start capturing within 10 s")
	}
	c := &capture{cmd: cmd, done: make(chan error, 1)}
	go func() { c.done <- cmd.Wait() }()
	return c
}

// stop ends the capture once the file holds want frames (tcpdump may lag
// behind the link on a busy machine, and what it has not read when it stops
// is lost), or after 10 s.
func (c *capture) stop(t *testing.T, path string, want int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		n := 0
		err := trace.ReadFile(path, func(trace.Record) error { n++; return nil })
		if err == nil && n >= want {
			break
		}
	}
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatal("tcpdump did not stop")
	}
}

// TestCNPOnTheWire captures what crosses the link while the marker marks
// every packet: rxego's data packets leave ECN-capable (ECT(0)), the
// receiver answers CE marks with CNPs, and each CNP is a RoCEv2 packet of
// opcode 0x81 with BECN set, 16 reserved zero bytes and a valid ICRC,
// addressed to the sending QP, carrying DSCP 48, as both rxego's own trace
// decoder and tshark read it. tshark 4.0 (Debian 12) has no name for
// opcode 129 and shows BTH byte 4, where FECN and BECN live, as one
// reserved byte, and the CNP body and ICRC as vendor data (its last
// occurrence is all 20 bytes); the test reads those fields.
func TestCNPOnTheWire(t *testing.T) {
	cc := MarkerParams(LineRate)
	tb := newTestbed(t, &rxego.Options{Congestion: &cc}) // no GSO: one frame per packet
	if err := tb.Marker.Set(1, 1); err != nil {          // marks all but a trickle
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "cnp.pcap")
	p := newPair(t, tb, 4096)
	sent := func() uint64 {
		return tb.Sender.Transport().Stats().SentPackets + tb.Receiver.Transport().Stats().SentPackets
	}
	c := startCapture(t, tb.SendNS, path)
	before := sent()
	for range 4 {
		p.write(t, 16, 10*time.Second)
	}
	c.stop(t, path, int(sent()-before))
	st, _ := p.send.CongestionStats()
	rs, _ := p.recv.CongestionStats()
	if st.CNPsRcvd == 0 || rs.CNPsSent != st.CNPsRcvd {
		t.Fatalf("CNPs: receiver sent %d, sender handled %d", rs.CNPsSent, st.CNPsRcvd)
	}

	// rxego's decoder: every packet, with the ICRC checked.
	var cnps, data int
	err := trace.ReadFile(path, func(r trace.Record) error {
		if r.RoCE == nil {
			t.Errorf("frame %d: %s", r.Frame, r.Error)
			return nil
		}
		if !r.ICRCOK {
			t.Errorf("frame %d (opcode %#x): ICRC does not check", r.Frame, r.Opcode)
		}
		switch {
		case r.Opcode == bth.CNPOpcode:
			cnps++
			if r.Src.String() != ReceiverAddr || r.Dst.String() != SenderAddr || r.DestQP != p.send.Num() ||
				!r.BECN || r.FECN || r.DSCP != congestion.NVIDIANPParams().CNPDSCP || r.ECN != 0 {
				t.Errorf("frame %d: CNP %+v %+v", r.Frame, r, *r.RoCE)
			}
		case r.Src.String() == SenderAddr:
			data++
			if r.ECN != qp.ECT0 {
				t.Errorf("frame %d: data packet with ECN %d, want ECT(0)", r.Frame, r.ECN)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if uint64(cnps) != st.CNPsRcvd || data < 64 {
		t.Fatalf("captured %d CNPs (sender handled %d) and %d data packets", cnps, st.CNPsRcvd, data)
	}

	// tshark.
	if _, err := exec.LookPath("tshark"); err != nil {
		t.Skip("tshark not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "tshark", "-n", "-r", path, "-d", "udp.port==4791,infiniband",
		"-Y", "infiniband.bth.opcode == 129", "-T", "fields", "-E", "occurrence=l", "-E", "separator=,",
		"-e", "ip.src", "-e", "ip.dsfield.dscp", "-e", "udp.length", "-e", "infiniband.bth.opcode",
		"-e", "infiniband.bth.destqp", "-e", "infiniband.reserved", "-e", "infiniband.vendor").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	lines := strings.Fields(string(out))
	if len(lines) != cnps {
		t.Fatalf("tshark shows %d CNPs, rxego's decoder %d:\n%s", len(lines), cnps, out)
	}
	for _, l := range lines {
		f := strings.Split(l, ",")
		if len(f) != 7 {
			t.Fatalf("tshark line %q", l)
		}
		wantQP := fmt.Sprintf("0x%06x", p.send.Num())
		// BTH byte 4 is 0x40: BECN set, FECN clear. The body is 16 zero
		// bytes, then the 4-byte ICRC.
		if f[0] != ReceiverAddr || f[1] != "48" || f[2] != "40" || f[3] != "129" || f[4] != wantQP || f[5] != "40" ||
			len(f[6]) != 40 || f[6][:32] != strings.Repeat("0", 32) {
			t.Errorf("tshark: CNP %q; want from %s, DSCP 48, UDP length 40, opcode 129, QP %s, BTH byte 4 = 40, 16 zero bytes", l, ReceiverAddr, wantQP)
		}
	}
	t.Logf("%d CNPs and %d data packets (all ECT(0)) captured; tshark: %s", cnps, data, lines[0])
}
