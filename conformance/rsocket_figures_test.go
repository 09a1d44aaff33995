package conformance

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxego/rxego/conformance/lab"
)

// rstreamPerfRe matches the row of a custom rstream test and captures its
// seconds, Gb/sec and usec/xfer.
var rstreamPerfRe = regexp.MustCompile(`(?m)^custom\s+\S+\s+\S+\s+\S+\s+\S+\s+([\d.]+)s\s+([\d.]+)\s+([\d.]+)$`)

// rstreamFigure is one measurement of TestRsocketFigures: rstream's custom
// test with these options (verification off: it would measure the
// emulated CPU's byte loop).
type rstreamFigure struct {
	name string
	args []string
	// gbps: the figure is the row's Gb/sec; else the round trip, twice
	// the row's usec/xfer (a transfer is one way).
	gbps bool
}

var rstreamFigures = []rstreamFigure{
	{"throughput, 100 kB transfers (Gb/s)", []string{"-S", "100000", "-C", "20"}, true},
	{"64 B round trip (µs)", []string{"-S", "64", "-C", "1", "-I", "200"}, false},
}

// rstreamEnd is one side of a measured run: C rstream in a guest, or
// rxego rstream on the host end of the lab bridge.
type rstreamEnd struct {
	guest *Peer // nil: rxego on the host, facing peer
	peer  *Peer // for rxego: the guest it faces (its HostIP is rxego's)
}

func (e rstreamEnd) ip() string {
	if e.guest != nil {
		return e.guest.Guest.IP()
	}
	return e.peer.HostIP
}

func (e rstreamEnd) String() string {
	if e.guest != nil {
		return "rstream, " + e.guest.Kernel + " guest"
	}
	return "rxego rstream, host"
}

// figureReps is how many times each figure is measured; the median is
// reported.
const figureReps = 3

// TestRsocketFigures measures rsocket against TCP in the lab, for
// docs/rsocket.md: rstream's throughput and 64-byte round trips between
// the two guests over rxe (C to C, the baseline), the same between them
// over TCP (rstream -T s), and C rstream in a guest against rxego rstream
// on the host in both roles, over rsocket and over TCP. It asserts only
// that every run completes; the figures go to the log as a markdown
// table. The guests are emulated without KVM, so the figures say how the
// paths compare in the lab, not what the stacks can do. It runs only with
// RXEGO_RSOCKET_FIGURES=1 and needs both kernels' guests.
func TestRsocketFigures(t *testing.T) {
	if os.Getenv("RXEGO_RSOCKET_FIGURES") != "1" {
		t.Skip("lab measurements, not a check; set RXEGO_RSOCKET_FIGURES=1 to run them")
	}
	requireLab(t)
	if ks := kernels(); !slices.Contains(ks, "6.1") || !slices.Contains(ks, "6.12") {
		t.Skip("needs both kernels' guests")
	}
	g61, g612 := lease(t, "6.1"), lease(t, "6.12")
	pairs := []struct{ client, server rstreamEnd }{
		{rstreamEnd{guest: g61}, rstreamEnd{guest: g612}},
		{rstreamEnd{guest: g612}, rstreamEnd{peer: g612}},
		{rstreamEnd{peer: g612}, rstreamEnd{guest: g612}},
	}
	var table strings.Builder
	fmt.Fprintf(&table, "| client → server | transport | %s | %s |\n|---|---|---|---|\n", rstreamFigures[0].name, rstreamFigures[1].name)
	for _, pair := range pairs {
		for _, tcp := range []bool{false, true} {
			transport := map[bool]string{false: "rsocket over RoCE", true: "TCP (-T s)"}[tcp]
			cells := []string{pair.client.String() + " → " + pair.server.String(), transport}
			for _, f := range rstreamFigures {
				var vals []float64
				var err error
				for range figureReps {
					var v float64
					if v, err = rstreamMeasure(t, pair.client, pair.server, f, tcp); err != nil {
						break
					}
					vals = append(vals, v)
				}
				if err != nil {
					// One pair failing leaves the others worth measuring.
					t.Error(err)
					cells = append(cells, "failed")
					continue
				}
				slices.Sort(vals)
				prec := map[bool]int{true: 2, false: 0}[f.gbps]
				cells = append(cells, fmt.Sprintf("%.*f (%.*f to %.*f)", prec, vals[len(vals)/2], prec, vals[0], prec, vals[len(vals)-1]))
			}
			fmt.Fprintf(&table, "| %s |\n", strings.Join(cells, " | "))
		}
	}
	t.Logf("median (min to max) of %d runs each, the client's row:\n%s", figureReps, table.String())
}

// rstreamMeasure runs one rstream test between client and server and
// returns the client's figure, or why there is none.
func rstreamMeasure(t *testing.T, client, server rstreamEnd, f rstreamFigure, tcp bool) (float64, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmTimeout)
	defer cancel()
	args := slices.Clone(f.args)
	if tcp {
		args = append(args, "-T", "s")
	}
	rx := append([]string{"rstream", "-timeout", (cmTimeout - 10*time.Second).String()}, args...)
	var srvOut func() ([]byte, error)
	if server.guest != nil {
		proc := startGuestServer(ctx, t, server.guest.Guest, "rstream", server.ip(), args)
		defer proc.Kill()
		srvOut = func() ([]byte, error) {
			res, err := proc.Wait(ctx)
			return append(res.Stdout, res.Stderr...), err
		}
	} else {
		h := server.peer.startRxego(t, ctx, append(rx, "-b", server.ip())...)
		var err error
		if tcp {
			err = h.waitListen(ctx, 7471)
		} else {
			err = h.waitOutput(ctx, cmListening)
		}
		if err != nil {
			t.Fatalf("rxego server: %v\n%s", err, h.output())
		}
		srvOut = func() ([]byte, error) { err := h.wait(ctx); return []byte(h.output()), err }
	}
	var out []byte
	var err error
	if client.guest != nil {
		var res lab.Result
		res, err = client.guest.Guest.Run(ctx, append([]string{"rstream", "-s", server.ip()}, args...)...)
		out = append(res.Stdout, res.Stderr...)
	} else {
		h := client.peer.startRxego(t, ctx, append(rx, "-s", server.ip(), "-b", client.ip())...)
		err = h.wait(ctx)
		out = h.stdout.Bytes()
		if err != nil {
			out = []byte(h.output())
		}
	}
	sout, serr := srvOut()
	if err != nil || serr != nil {
		return 0, fmt.Errorf("%s %v: client %s: %v\n%s\nserver %s: %v\n%s", f.name, args, client, err, out, server, serr, sout)
	}
	m := rstreamPerfRe.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("%s: no custom row from the client %s:\n%s", f.name, client, out)
	}
	if f.gbps {
		return strconv.ParseFloat(string(m[2]), 64)
	}
	v, err := strconv.ParseFloat(string(m[3]), 64)
	return 2 * v, err
}
