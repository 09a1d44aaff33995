package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"github.com/rxego/rxego/cmd/rxego/internal/progress"
	"github.com/rxego/rxego/internal/app/ladder"
	"github.com/rxego/rxego/internal/app/trace"
)

// runTraceFlags reads the capture (a file, or live on f.iface), prints
// what the flags ask for, and draws the ladders and page at the end.
func runTraceFlags(w *bufio.Writer, f *traceFlags, path string) error {
	print := packetPrinter(w, f)
	var b *ladder.Builder
	if f.ladder || f.summary || f.html != "" {
		b = ladder.NewBuilder()
	}
	each := func(r trace.Record) error {
		if print != nil {
			if err := print(r); err != nil {
				return err
			}
		}
		if b != nil {
			return b.Add(r)
		}
		return nil
	}
	var err error
	if f.iface != "" {
		err = traceLive(w, f, each)
	} else {
		err = traceFile(path, f.progress, each)
	}
	if err != nil || b == nil {
		return err
	}
	t := b.Finish()
	if f.ladder || f.summary {
		o := ladder.TextOptions{SummaryOnly: f.summary && !f.ladder, Width: f.width, Color: f.colorOn}
		o.Expand = f.expand
		if !f.all {
			o.MaxRows = f.maxRows
		}
		if err := ladder.WriteText(w, t, o); err != nil {
			return err
		}
	}
	if f.html != "" {
		if err := writeHTMLFile(f.html, t); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "rxego trace: wrote %s\n", f.html)
	}
	return nil
}

// writeHTMLFile writes the trace's page to path.
func writeHTMLFile(path string, t *ladder.Trace) error {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	err = ladder.WriteHTML(fh, t, ladder.HTMLOptions{Title: path})
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	return err
}

// traceFile reads a capture file, reporting progress on stderr (how much
// of the file was read) when it is a terminal or when forced.
func traceFile(path string, forceProgress bool, each func(trace.Record) error) error {
	fh, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return err
	}
	cr := &countingReader{r: fh}
	var n atomic.Int64
	rep := progress.Start(os.Stderr, progress.Wanted(os.Stderr, forceProgress), func() string {
		pct := 100.0
		if st.Size() > 0 {
			pct = 100 * float64(cr.n.Load()) / float64(st.Size())
		}
		return fmt.Sprintf("rxego trace: %s: %.0f%%, %d RoCE packets", path, pct, n.Load())
	})
	defer rep.Stop()
	cs, err := trace.ReadStats(cr, func(r trace.Record) error {
		n.Add(1)
		return each(r)
	})
	if cs.Dropped > 0 {
		fmt.Fprintf(os.Stderr, "rxego trace: %s: its capture dropped %d frames (the file's interface statistics): losses the trace shows may be the capture's\n", path, cs.Dropped)
	}
	var fe *trace.FileError
	if errors.As(err, &fe) {
		return fmt.Errorf("%s: %w", path, err)
	}
	return err
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}
