package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/rxego/rxego/internal/trace"
)

func init() {
	register("trace", "print the RoCEv2 packets of a pcap or pcapng file", runTrace)
}

// runTrace prints one line (or one JSON object) per RoCEv2 packet.
func runTrace(args []string) error { return traceTo(os.Stdout, args) }

// traceTo is runTrace writing to out.
func traceTo(out io.Writer, args []string) error {
	fs := flag.NewFlagSet("trace", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print one JSON object per packet")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: rxego trace [--json] FILE")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("need exactly one capture file")
	}
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	err := trace.ReadFile(fs.Arg(0), func(r trace.Record) error {
		if *asJSON {
			return enc.Encode(r)
		}
		_, err := fmt.Fprintln(w, r.String())
		return err
	})
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	return err
}
