// Command rxego-plot renders line charts from a CSV file as SVG, with no
// dependencies beyond the standard library. It is how the DCQCN figures in
// docs/ are made from the time series the e2e/dcqcn tests and the
// congestion/sim simulator write.
//
// The CSV has a header row; every other row is numbers (a column used
// with -by may hold any text). Each -panel is one chart, stacked on a
// shared x axis, listing the columns it draws; -by splits rows into one
// line per value of a column (one per flow, say):
//
//	rxego-plot -x t_ms -xscale 0.001 -xlabel "time (s)" -by flow \
//	    -panel "rx_mbps=delivered,rate_mbps=RC:Mbit/s" -panel "alpha:alpha" \
//	    -hline "0:200:marking rate" -title "DCQCN, 2 flows" -o fig.svg run.csv
//
// A panel is "COLUMNS:YLABEL[:YMAX[:YMIN]]" where COLUMNS is a comma list
// of NAME or NAME=LEGEND; YMAX (and YMIN, default 0) fix the y axis. Within a panel, lines of one group share a colour
// and the second and later columns are dashed. An -hline is
// "PANEL:Y:LABEL", PANEL counting from 0.
package main

import (
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rxego-plot:", err)
		os.Exit(1)
	}
}

// listFlag collects a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

// maxRows bounds the input, so a wrong file fails instead of filling memory.
const maxRows = 5_000_000

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("rxego-plot", flag.ContinueOnError)
	var (
		xcol   = fs.String("x", "t_ms", "column of the x values")
		xscale = fs.Float64("xscale", 1, "multiply x values by this (0.001: ms to s)")
		by     = fs.String("by", "", "column whose values split the rows into separate lines")
		title  = fs.String("title", "", "chart title")
		xlabel = fs.String("xlabel", "", "x axis label (default: the x column)")
		out    = fs.String("o", "", "output file (default standard output)")
		width  = fs.Int("width", 900, "width in pixels")
		every  = fs.Int("every", 1, "keep every n-th point of each line")
		xmin   = fs.Float64("xmin", math.Inf(-1), "leave out points with a smaller (scaled) x")
		xmax   = fs.Float64("xmax", math.Inf(1), "leave out points with a larger (scaled) x")
		panels listFlag
		hlines listFlag
	)
	fs.Var(&panels, "panel", `a chart: "COL[=LEGEND],...:YLABEL[:YMAX[:YMIN]]" (repeatable)`)
	fs.Var(&hlines, "hline", `a reference line: "PANEL:Y:LABEL" (repeatable)`)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("need exactly one CSV file (- for standard input)")
	}
	if len(panels) == 0 {
		return errors.New("need at least one -panel")
	}
	if *every < 1 {
		return errors.New("-every must be >= 1")
	}
	var in io.Reader = os.Stdin
	if name := fs.Arg(0); name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	tab, err := readCSV(in)
	if err != nil {
		return err
	}
	c := &Chart{Title: *title, XLabel: *xlabel, Width: *width}
	if c.XLabel == "" {
		c.XLabel = *xcol
	}
	for _, spec := range panels {
		p, err := buildPanel(tab, spec, *xcol, *xscale, *by, *every, *xmin, *xmax)
		if err != nil {
			return err
		}
		c.Panels = append(c.Panels, p)
	}
	for _, spec := range hlines {
		parts := strings.SplitN(spec, ":", 3)
		if len(parts) != 3 {
			return fmt.Errorf("-hline %q: want PANEL:Y:LABEL", spec)
		}
		i, err1 := strconv.Atoi(parts[0])
		y, err2 := strconv.ParseFloat(parts[1], 64)
		if err1 != nil || err2 != nil || i < 0 || i >= len(c.Panels) {
			return fmt.Errorf("-hline %q: bad panel or value", spec)
		}
		c.Panels[i].HLines = append(c.Panels[i].HLines, HLine{Y: y, Label: parts[2]})
	}
	w := stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	return c.WriteSVG(w)
}

// table is a parsed CSV file.
type table struct {
	cols map[string]int
	rows [][]string
}

func readCSV(r io.Reader) (*table, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = false
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("reading the header: %w", err)
	}
	t := &table{cols: map[string]int{}}
	for i, h := range head {
		t.cols[strings.TrimSpace(h)] = i
	}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return t, nil
		}
		if err != nil {
			return nil, err
		}
		if len(t.rows) == maxRows {
			return nil, fmt.Errorf("more than %d rows", maxRows)
		}
		t.rows = append(t.rows, rec)
	}
}

func (t *table) col(name string) (int, error) {
	i, ok := t.cols[name]
	if !ok {
		return 0, fmt.Errorf("no column %q", name)
	}
	return i, nil
}

// buildPanel makes the lines of one -panel spec.
func buildPanel(t *table, spec, xcol string, xscale float64, by string, every int, xmin, xmax float64) (Panel, error) {
	parts := strings.Split(spec, ":")
	if len(parts) < 2 || len(parts) > 4 || parts[0] == "" {
		return Panel{}, fmt.Errorf("-panel %q: want COLUMNS:YLABEL[:YMAX[:YMIN]]", spec)
	}
	p := Panel{YLabel: parts[1]}
	if len(parts) >= 3 {
		v, err := strconv.ParseFloat(parts[2], 64)
		if err != nil || v <= 0 {
			return Panel{}, fmt.Errorf("-panel %q: bad YMAX", spec)
		}
		p.YMax = v
	}
	if len(parts) == 4 {
		v, err := strconv.ParseFloat(parts[3], 64)
		if err != nil || v >= p.YMax {
			return Panel{}, fmt.Errorf("-panel %q: bad YMIN (must be below YMAX)", spec)
		}
		p.YMin = v
	}
	xi, err := t.col(xcol)
	if err != nil {
		return Panel{}, err
	}
	bi := -1
	if by != "" {
		if bi, err = t.col(by); err != nil {
			return Panel{}, err
		}
	}
	// Groups in order of first appearance.
	var groups []string
	gindex := map[string]int{}
	for _, r := range t.rows {
		g := ""
		if bi >= 0 && bi < len(r) {
			g = r[bi]
		}
		if _, ok := gindex[g]; !ok {
			gindex[g] = len(groups)
			groups = append(groups, g)
		}
	}
	cols := strings.Split(parts[0], ",")
	for ci, c := range cols {
		name, legend, _ := strings.Cut(c, "=")
		if legend == "" {
			legend = name
		}
		yi, err := t.col(name)
		if err != nil {
			return Panel{}, err
		}
		for gi, g := range groups {
			s := Series{Name: legend, Color: gi, Dashed: ci > 0}
			if len(groups) == 1 {
				s.Color = ci
			} else {
				s.Name = fmt.Sprintf("%s %s %s", by, g, legend)
			}
			n := 0
			for ri, r := range t.rows {
				if bi >= 0 && (bi >= len(r) || r[bi] != g) {
					continue
				}
				if xi >= len(r) || yi >= len(r) {
					return Panel{}, fmt.Errorf("row %d: too few fields", ri+2)
				}
				x, err1 := strconv.ParseFloat(r[xi], 64)
				y, err2 := strconv.ParseFloat(r[yi], 64)
				if err1 != nil || err2 != nil {
					return Panel{}, fmt.Errorf("row %d: %q or %q is not a number", ri+2, r[xi], r[yi])
				}
				if x *= xscale; x < xmin || x > xmax {
					continue
				}
				if n++; (n-1)%every == 0 {
					s.Points = append(s.Points, Point{x, y})
				}
			}
			p.Series = append(p.Series, s)
		}
	}
	return p, nil
}
