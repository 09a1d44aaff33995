package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/rxego/rxego/cmd/rxego/internal/demo"
	"github.com/rxego/rxego/cmd/rxego/internal/progress"
	"github.com/rxego/rxego/internal/app/ladder"
)

func init() {
	register("demo", "a guided tour of RDMA between two loopback endpoints, with the ladder of what went over the wire", runDemo)
}

func runDemo(args []string) error { return demoTo(os.Stdout, args) }

// demoTo is runDemo writing the tour to out.
func demoTo(out io.Writer, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: rxego demo [scenario ...] [flags]

A guided tour on loopback addresses (127.0.0.1 and up): two rxego devices
run each verbs scenario, and the workload scenarios (kvcache, prefix,
allreduce) run their examples at a small size with as many devices as
they need, while the tour explains each; then it draws the ladder of what
went over the wire, from a pcapng capture of the sending device, one file
per scenario.

scenarios (all by default): %s

flags:
`, strings.Join(demo.Names(), ", "))
		printFlags(fs)
	}
	dir := fs.String("pcap-dir", "", "write one capture per scenario here (default: a new temporary directory)")
	noCapture := fs.Bool("no-capture", false, "record nothing and draw no ladders")
	all := fs.Bool("all", false, "draw every row of each ladder (by default long ladders are folded)")
	width := fs.Int("width", 0, "ladder: columns between the two sides (default 64)")
	color := fs.String("color", "auto", "ladder colors: auto (on a terminal), always or never")
	addrs := fs.String("addrs", strings.Join(demo.DefaultAddrs, ","), "loopback addresses to try for the two devices, in order")
	obs := addObserveFlags(fs)
	scenarios, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	for _, n := range scenarios {
		if !contains(demo.Names(), n) {
			return usageErrorf("unknown scenario %q (have %s)", n, strings.Join(demo.Names(), ", "))
		}
	}
	if *color != "auto" && *color != "always" && *color != "never" {
		return usageErrorf("--color %q: want auto, always or never", *color)
	}
	o := demo.Options{Ladder: ladder.TextOptions{Width: *width,
		Color: *color == "always" || *color == "auto" && out == io.Writer(os.Stdout) && progress.IsTerminal(os.Stdout)}}
	if *all {
		o.Ladder.MaxRows = -1
	}
	if progress.Wanted(os.Stderr, obs.progress) {
		o.Progress = os.Stderr
	}
	if !*noCapture {
		o.PcapDir = *dir
		if o.PcapDir == "" {
			d, err := os.MkdirTemp("", "rxego-demo-")
			if err != nil {
				return err
			}
			o.PcapDir = d
		} else if err := os.MkdirAll(o.PcapDir, 0o755); err != nil {
			return err
		}
		fmt.Fprintf(out, "Captures go to %s\n", o.PcapDir)
	}
	if err := obs.start(); err != nil {
		return err
	}
	o.Tap = obs.tap()
	t, err := demo.OpenWith(out, o, strings.Split(*addrs, ",")...)
	if err != nil {
		return errors.Join(err, obs.close())
	}
	defer t.Close()
	for _, d := range t.Devices() {
		obs.export(d)
	}
	err = t.Run(scenarios...)
	return errors.Join(err, obs.close())
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
