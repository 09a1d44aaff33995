package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rxego/rxego/cmd/rxego/internal/livecap"
	"github.com/rxego/rxego/cmd/rxego/internal/progress"
	"github.com/rxego/rxego/internal/app/trace"
)

func init() {
	register("trace", "read or capture RoCEv2 packets: per-packet lines, JSON, ladder diagrams, HTML", runTrace)
}

// runTrace prints one line (or one JSON object) per RoCEv2 packet, or a
// ladder of each QP pair.
func runTrace(args []string) error { return traceTo(os.Stdout, args) }

// traceFlags are the flags of `rxego trace`.
type traceFlags struct {
	json, ladder, summary, packets, all, expand, progress bool
	colorOn                                               bool // colors decided from --color and the output
	html, write, iface, color, host                       string
	maxRows, width, count, bufferKiB                      int
	duration                                              time.Duration
}

// traceTo is runTrace writing to out.
func traceTo(out io.Writer, args []string) error {
	fs := flag.NewFlagSet("trace", flag.ContinueOnError)
	var f traceFlags
	fs.BoolVar(&f.json, "json", false, "print one JSON object per packet")
	fs.BoolVar(&f.ladder, "ladder", false, "draw a ladder diagram of each QP pair, with its statistics")
	fs.BoolVar(&f.summary, "summary", false, "print each QP pair's statistics only")
	fs.StringVar(&f.html, "html", "", "write a self-contained HTML page with the ladders (SVG) and a timeline to this file")
	fs.BoolVar(&f.packets, "packets", false, "with --ladder, --summary or --html: print the packet lines too")
	fs.BoolVar(&f.all, "all", false, "ladder: draw every row (by default long ladders are folded, keeping what went wrong)")
	fs.BoolVar(&f.expand, "expand", false, "ladder: one row per packet (by default runs of alike packets share a row)")
	fs.IntVar(&f.maxRows, "max-rows", 400, "ladder: rows per QP pair before folding")
	fs.IntVar(&f.width, "width", 0, "ladder: columns between the two sides (default 64)")
	fs.StringVar(&f.color, "color", "auto", "ladder colors: auto (on a terminal), always or never")
	fs.BoolVar(&f.progress, "progress", false, "report progress on stderr even when it is not a terminal")
	fs.StringVar(&f.iface, "i", "", "capture live on this network interface (AF_PACKET, needs root) instead of reading a file")
	fs.StringVar(&f.write, "w", "", "live capture: also write the captured frames to this pcapng file")
	fs.IntVar(&f.count, "count", 0, "live capture: stop after this many RoCEv2 packets")
	fs.DurationVar(&f.duration, "duration", 0, "live capture: stop after this long (default: until interrupted)")
	fs.StringVar(&f.host, "host", "", "live capture: only packets to or from this IP address (filtered in the kernel)")
	fs.IntVar(&f.bufferKiB, "B", livecap.DefaultBuffer>>10, "live capture: the socket's receive buffer in KiB, as tcpdump -B (beyond net.core.rmem_max as root)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: rxego trace [flags] FILE
       rxego trace -i IFACE [flags]

Reads a pcap or pcapng file (or captures live on an interface) and prints
its RoCEv2 packets, one line or JSON object each, or with --ladder a
ladder diagram of each QP pair: requester and responder columns, message
boundaries, PSNs, ACKs, and what went wrong marked where it happened.

  rxego trace --ladder capture.pcapng
  rxego trace --html page.html capture.pcapng
  rxego trace -i lo --count 100 --ladder          # as root

flags:
`)
		printFlags(fs)
	}
	files, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if (f.iface == "") != (len(files) == 1) || len(files) > 1 {
		return usageErrorf("need exactly one capture file, or -i IFACE")
	}
	if f.iface == "" && (f.write != "" || f.count != 0 || f.duration != 0 || f.host != "" || f.bufferKiB != livecap.DefaultBuffer>>10) {
		return errors.New("-w, --count, --duration, --host and -B are for live capture (-i)")
	}
	if f.json && (f.ladder || f.summary) {
		return errors.New("--json and --ladder/--summary conflict: JSON lines and a text ladder would share stdout (use --json with --html for both)")
	}
	if f.color != "auto" && f.color != "always" && f.color != "never" {
		return fmt.Errorf("--color %q: want auto, always or never", f.color)
	}
	f.colorOn = f.color == "always" || f.color == "auto" && out == io.Writer(os.Stdout) && progress.IsTerminal(os.Stdout)
	w := bufio.NewWriter(out)
	err = runTraceFlags(w, &f, append(files, "")[0])
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	return err
}

// packetPrinter returns the per-packet output: text lines or JSON
// objects, or nil when the packets are not printed.
func packetPrinter(w *bufio.Writer, f *traceFlags) func(trace.Record) error {
	if !f.printsPackets() {
		return nil
	}
	if f.json {
		enc := json.NewEncoder(w)
		return func(r trace.Record) error { return enc.Encode(r) }
	}
	return func(r trace.Record) error {
		_, err := fmt.Fprintln(w, r.String())
		return err
	}
}

// printsPackets reports whether the packets are printed one by one: by
// default, with --json, or with --packets next to a ladder or page.
func (f *traceFlags) printsPackets() bool {
	return f.json || f.packets || !f.ladder && !f.summary && f.html == ""
}
