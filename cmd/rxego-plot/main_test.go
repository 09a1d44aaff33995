package main

import (
	"bytes"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sample = `t_ms,flow,rate,alpha
0,0,100,0.5
0,1,50,0.25
10,0,80,0.4
10,1,60,0.3
20,0,70,0.35
20,1,70,0.35
`

// svgDoc is the part of the output the tests look at.
type svgDoc struct {
	Polylines []struct {
		Stroke string `xml:"stroke,attr"`
		Points string `xml:"points,attr"`
	} `xml:"g>polyline"`
	Texts []string `xml:"text"`
}

func render(t *testing.T, args ...string) svgDoc {
	t.Helper()
	in := filepath.Join(t.TempDir(), "in.csv")
	if err := os.WriteFile(in, []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(append(args, in), &out); err != nil {
		t.Fatal(err)
	}
	var d svgDoc
	if err := xml.Unmarshal(out.Bytes(), &d); err != nil {
		t.Fatalf("output is not XML: %v\n%s", err, out.String())
	}
	return d
}

func TestLinesPerGroupAndColumn(t *testing.T) {
	d := render(t, "-by", "flow", "-panel", "rate=RC:Mbit/s", "-panel", "alpha:alpha", "-hline", "0:65:mark", "-title", "T <1>")
	if len(d.Polylines) != 4 {
		t.Fatalf("%d lines, want 2 flows x 2 panels", len(d.Polylines))
	}
	for _, p := range d.Polylines {
		if n := len(strings.Fields(p.Points)); n != 3 {
			t.Errorf("line with %d points, want 3: %q", n, p.Points)
		}
	}
	if d.Polylines[0].Stroke == d.Polylines[1].Stroke {
		t.Error("the two flows share a colour")
	}
	texts := strings.Join(d.Texts, "|")
	for _, want := range []string{"T <1>", "flow 0 RC", "flow 1 RC", "flow 1 alpha", "mark", "Mbit/s"} {
		if !strings.Contains(texts, want) {
			t.Errorf("no text %q in %q", want, texts)
		}
	}
}

// The y axis of a panel maps the data range onto the panel: the highest
// value is drawn at the top edge when YMAX is the maximum.
func TestScaling(t *testing.T) {
	d := render(t, "-panel", "rate:r:100")
	pts := strings.Fields(d.Polylines[0].Points)
	// First point (0, 100) sits at the left edge and the top of the panel.
	if pts[0] != "70.0,40.0" {
		t.Errorf("first point %s, want 70.0,40.0 (left edge, top)", pts[0])
	}
	// With YMIN 60 and YMAX 100, 80 is half way up the 240-pixel panel.
	d = render(t, "-by", "flow", "-panel", "rate:r:100:60")
	if pts := strings.Fields(d.Polylines[0].Points); pts[1] != "400.0,160.0" {
		t.Errorf("second point %s, want 400.0,160.0 (middle, half way up)", pts[1])
	}
	d = render(t, "-by", "flow", "-panel", "rate:r", "-xmin", "5", "-every", "2")
	if n := len(strings.Fields(d.Polylines[0].Points)); n != 1 {
		t.Errorf("-xmin 5 -every 2 kept %d of the points at 10 and 20, want 1", n)
	}
}

func TestBadInput(t *testing.T) {
	in := filepath.Join(t.TempDir(), "in.csv")
	os.WriteFile(in, []byte(sample), 0o644)
	bad := filepath.Join(t.TempDir(), "bad.csv")
	os.WriteFile(bad, []byte("t_ms,rate\n0,x\n"), 0o644)
	for name, args := range map[string][]string{
		"no panel":       {in},
		"no file":        {"-panel", "rate:r"},
		"unknown column": {"-panel", "nope:r", in},
		"bad panel":      {"-panel", "rate", in},
		"bad ymax":       {"-panel", "rate:r:-1", in},
		"bad ymin":       {"-panel", "rate:r:10:20", in},
		"bad hline":      {"-panel", "rate:r", "-hline", "3:1:x", in},
		"not a number":   {"-panel", "rate:r", bad},
		"missing file":   {"-panel", "rate:r", in + ".none"},
		"bad every":      {"-panel", "rate:r", "-every", "0", in},
	} {
		var out bytes.Buffer
		if err := run(args, &out); err == nil {
			t.Errorf("%s: no error", name)
		}
		if out.Len() != 0 {
			t.Errorf("%s: wrote output despite the error", name)
		}
	}
}

func TestTicks(t *testing.T) {
	for _, c := range []struct {
		lo, hi float64
		want   string
	}{
		{0, 1, "[0 0.2 0.4 0.6 0.8 1]"},
		{0, 230, "[0 50 100 150 200 250]"},
		{3, 3, "[3]"},
	} {
		got := ticks(c.lo, c.hi)
		var s []string
		for _, v := range got {
			s = append(s, num(v))
		}
		if g := "[" + strings.Join(s, " ") + "]"; g != c.want {
			t.Errorf("ticks(%v, %v) = %s, want %s", c.lo, c.hi, g, c.want)
		}
	}
}
