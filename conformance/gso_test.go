package conformance

import (
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/rxego/rxego/icrc"
	"github.com/rxego/rxego/internal/capfile"
)

// TestGSO proves rxego's UDP GSO sends against rxe: a 64 KiB message at
// path MTU 1024 is 64 packets, which rxego hands the kernel as runs of up
// to 63 segments in one datagram each, with every segment's ICRC computed
// for the IP ID the kernel gives it (0, 1, 2, ... within a datagram).
//
// Three checks, each enough to catch a wrong ICRC in any segment:
//   - Case's packet balance: rxe counts rcvd_pkts only after its ICRC
//     check, and it must equal the packets rxego sent (segments counted
//     one by one), with rxe's error counters at 0;
//   - every message rxego gets back verifies (the C tool echoes it);
//   - a capture of the lab bridge (a sample: tcpdump drops frames when
//     the emulated guests load the host): every RoCE packet from rxego in
//     it checks against the IP and UDP headers it really travelled under,
//     and the segments of GSO datagrams arrived with IDs above 0.
//
// And that GSO was in use: nearly all of rxego's packets went out as
// segments of GSO runs (only each message's first packet, which carries
// a RETH and so differs in length, and the ACKs go alone).
func TestGSO(t *testing.T) {
	forEachKernel(t, func(t *testing.T, p *Peer) {
		for _, server := range []bool{true, false} {
			r := ppRun{Tool: "rc", Size: 65536, Iters: 20, RxegoServer: server}
			c := Case{Name: r.name() + " gso", Role: r.role(), Require: []string{"rxego:udp_gso_segments"}}
			p.Case(t, c, func(t *testing.T) Outcome {
				capt, err := p.Lab.Capture(filepath.Join(t.TempDir(), "gso.pcap"))
				if err != nil {
					t.Fatal(err)
				}
				out := p.pingpong(t, r)
				if err := capt.Stop(); err != nil {
					t.Fatal(err)
				}
				sent, segs := out.Rxego["udp_sent_packets"], out.Rxego["udp_gso_segments"]
				// Per message: 1 FIRST alone, 63 in a run; ACKs alone.
				if segs*64 < sent*60 {
					t.Errorf("only %d of %d packets sent as GSO segments", segs, sent)
				}
				checkCapturedICRCs(t, capt.Path(), netip.MustParseAddr(p.HostIP), sent)
				return out
			})
		}
	})
}

// checkCapturedICRCs checks the ICRC of every RoCE packet from host in the
// capture against its real IP and UDP headers, and that some carried a
// non-zero IP ID (the later segments of GSO datagrams).
func checkCapturedICRCs(t *testing.T, path string, host netip.Addr, sent uint64) {
	t.Helper()
	var n, bad, nonzeroID uint64
	err := capfile.Each(path, func(f capfile.Frame) error {
		if len(f.IP) < 20 || f.IP[0]>>4 != 4 {
			return nil
		}
		if src := netip.AddrFrom4([4]byte(f.IP[12:16])); src != host {
			return nil
		}
		n++
		crc, ok := icrc.FromHeaders(f.IP, f.UDP, f.RoCE)
		if !ok || crc != icrc.Get(f.RoCE) {
			bad++
			if bad <= 3 {
				t.Errorf("frame %d (IP ID %d, %d bytes): ICRC %#x, headers give %#x", f.Number,
					uint16(f.IP[4])<<8|uint16(f.IP[5]), len(f.RoCE), icrc.Get(f.RoCE), crc)
			}
		}
		if f.IP[4] != 0 || f.IP[5] != 0 {
			nonzeroID++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// tcpdump on the emulated lab drops frames under load, so the capture
	// holds a sample: every packet in it must check, and there must be some.
	t.Logf("capture: %d RoCE packets from rxego (it sent %d), %d with a non-zero IP ID, %d bad ICRCs", n, sent, nonzeroID, bad)
	if n == 0 || n > sent {
		t.Errorf("captured %d of rxego's packets, it sent %d", n, sent)
	}
	if nonzeroID == 0 {
		t.Error("no packet from rxego carried a non-zero IP ID: GSO segments never reached the wire")
	}
}
