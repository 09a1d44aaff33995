package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Point is one (x, y) value.
type Point struct{ X, Y float64 }

// Series is one line.
type Series struct {
	Name   string
	Color  int // palette index
	Dashed bool
	Points []Point
}

// HLine is a horizontal reference line across a panel.
type HLine struct {
	Y     float64
	Label string
}

// Panel is one chart with its own y axis; panels are stacked and share
// the x axis.
type Panel struct {
	YLabel string
	YMin   float64 // the y axis starts here (0 unless the data go below)
	YMax   float64 // if > 0, the y axis is fixed to [YMin, YMax]
	Series []Series
	HLines []HLine
}

// Chart is a figure: a title, an x label and stacked panels.
type Chart struct {
	Title  string
	XLabel string
	Width  int // pixels, default 900
	Panels []Panel
}

// palette is colour-blind friendly (Okabe-Ito).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"}

// Geometry in pixels.
const (
	panelHeight = 240
	marginLeft  = 70
	marginRight = 170 // legend
	marginTop   = 40
	panelGap    = 30
	marginBot   = 45
)

// WriteSVG renders c. It needs at least one panel; series without points
// are left out, and a panel without any point gets an empty frame.
func (c *Chart) WriteSVG(w io.Writer) error {
	if len(c.Panels) == 0 {
		return fmt.Errorf("plot: no panels")
	}
	width := c.Width
	if width <= 0 {
		width = 900
	}
	plotW := float64(width - marginLeft - marginRight)
	height := marginTop + len(c.Panels)*panelHeight + (len(c.Panels)-1)*panelGap + marginBot

	xmin, xmax := math.Inf(1), math.Inf(-1)
	for _, p := range c.Panels {
		for _, s := range p.Series {
			for _, pt := range s.Points {
				xmin, xmax = math.Min(xmin, pt.X), math.Max(xmax, pt.X)
			}
		}
	}
	if xmin > xmax {
		xmin, xmax = 0, 1
	}
	xt := ticks(xmin, xmax)
	xmin, xmax = math.Min(xmin, xt[0]), math.Max(xmax, xt[len(xt)-1])
	if xmax == xmin {
		xmax = xmin + 1
	}
	sx := func(x float64) float64 { return marginLeft + (x-xmin)/(xmax-xmin)*plotW }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	if c.Title != "" {
		fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", marginLeft, esc(c.Title))
	}
	for i, p := range c.Panels {
		top := float64(marginTop + i*(panelHeight+panelGap))
		bottom := top + panelHeight
		ymin, ymax := p.YMin, p.YMax
		if ymax <= ymin {
			ymax = math.Inf(-1)
			for _, s := range p.Series {
				for _, pt := range s.Points {
					ymax = math.Max(ymax, pt.Y)
					ymin = math.Min(ymin, pt.Y)
				}
			}
			for _, h := range p.HLines {
				ymax = math.Max(ymax, h.Y)
			}
			if math.IsInf(ymax, -1) || ymax <= ymin {
				ymax = ymin + 1
			}
			yt := ticks(ymin, ymax)
			ymin, ymax = math.Min(ymin, yt[0]), math.Max(ymax, yt[len(yt)-1])
		}
		sy := func(y float64) float64 {
			y = math.Max(ymin, math.Min(ymax, y))
			return bottom - (y-ymin)/(ymax-ymin)*panelHeight
		}
		// Grid and axes.
		for _, y := range ticks(ymin, ymax) {
			if y < ymin || y > ymax {
				continue
			}
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e0e0e0"/>`+"\n", marginLeft, sy(y), marginLeft+plotW, sy(y))
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", marginLeft-6, sy(y), num(y))
		}
		for _, x := range xt {
			if x < xmin || x > xmax {
				continue
			}
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e0e0e0"/>`+"\n", sx(x), top, sx(x), bottom)
			if i == len(c.Panels)-1 {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", sx(x), bottom+16, num(x))
			}
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%.1f" width="%.1f" height="%d" fill="none" stroke="#444"/>`+"\n", marginLeft, top, plotW, panelHeight)
		fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", top+panelHeight/2, esc(p.YLabel))
		for _, h := range p.HLines {
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="2 3"/>`+"\n", marginLeft, sy(h.Y), marginLeft+plotW, sy(h.Y))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="11" fill="#555">%s</text>`+"\n", marginLeft+plotW+4, sy(h.Y)+4, esc(h.Label))
		}
		// Lines, clipped to the panel.
		fmt.Fprintf(&b, `<clipPath id="clip%d"><rect x="%d" y="%.1f" width="%.1f" height="%d"/></clipPath>`+"\n", i, marginLeft, top, plotW, panelHeight)
		fmt.Fprintf(&b, `<g clip-path="url(#clip%d)" fill="none" stroke-width="1.2">`+"\n", i)
		for _, s := range p.Series {
			if len(s.Points) == 0 {
				continue
			}
			fmt.Fprintf(&b, `<polyline stroke="%s"%s points="`, palette[s.Color%len(palette)], dash(s.Dashed))
			for k, pt := range s.Points {
				if k > 0 {
					b.WriteByte(' ')
				}
				fmt.Fprintf(&b, "%.1f,%.1f", sx(pt.X), sy(pt.Y))
			}
			b.WriteString(`"/>` + "\n")
		}
		b.WriteString("</g>\n")
		// Legend.
		ly := top + 12
		for _, s := range p.Series {
			if len(s.Points) == 0 {
				continue
			}
			lx := marginLeft + plotW + 10
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", lx, ly, lx+22, ly, palette[s.Color%len(palette)], dash(s.Dashed))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" dominant-baseline="middle">%s</text>`+"\n", lx+28, ly, esc(s.Name))
			ly += 16
		}
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", marginLeft+plotW/2, height-8, esc(c.XLabel))
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func dash(d bool) string {
	if d {
		return ` stroke-dasharray="5 3"`
	}
	return ""
}

// ticks returns about five round values covering [lo, hi].
func ticks(lo, hi float64) []float64 {
	if !(hi > lo) || math.IsInf(hi-lo, 0) {
		return []float64{lo}
	}
	raw := (hi - lo) / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	start := math.Floor(lo/step) * step
	var out []float64
	for k := 0; k <= 100; k++ {
		v := start + float64(k)*step
		out = append(out, v)
		if v >= hi-step*1e-9 {
			break
		}
	}
	return out
}

// num formats a tick label without trailing zeros.
func num(v float64) string {
	if math.Abs(v) < 1e-12 {
		return "0"
	}
	return strconv.FormatFloat(v, 'g', 6, 64)
}

// esc escapes text for SVG.
func esc(s string) string {
	r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
	return r.Replace(s)
}
