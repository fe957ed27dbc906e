package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// Plot geometry: two panels side by side, latency and bandwidth against
// message size, both axes logarithmic.
const (
	panelW, panelH = 460, 320
	marginL        = 70
	marginR        = 20
	marginT        = 40
	marginB        = 50
)

var seriesColors = map[string]string{
	ours:      "#d62728",
	"direct":  "#ff7f0e",
	"mpich":   "#1f77b4",
	"openmpi": "#2ca02c",
}

var extraColors = []string{"#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// writeSVG draws the lat and bw medians of r, with min-max whiskers.
func (r *report) writeSVG(w io.Writer) error {
	var b strings.Builder
	width := 2*panelW + 20
	height := panelH + 40
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="18" font-size="13">mdbench: %s; medians of %d repetitions, bars span min to max</text>`+"\n", escape(r.Route), r.Reps)
	r.panel(&b, 0, 24, "lat", "latency (µs, half round trip)")
	r.panel(&b, panelW+20, 24, "bw", "bandwidth (MB/s, one way, window of messages)")
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *report) panel(b *strings.Builder, x0, y0 int, test, title string) {
	var pts []stat
	for _, s := range r.Stats {
		if s.Test == test && s.Min > 0 {
			pts = append(pts, s)
		}
	}
	fmt.Fprintf(b, `<g transform="translate(%d,%d)">`+"\n", x0, y0)
	fmt.Fprintf(b, `<text x="%d" y="16" font-size="13">%s</text>`+"\n", marginL, escape(title))
	defer b.WriteString("</g>\n")
	if len(pts) == 0 {
		fmt.Fprintf(b, `<text x="%d" y="%d">no %s figures in this run</text>`+"\n", marginL, panelH/2, test)
		return
	}
	minX, maxX := math.Inf(1), math.Inf(-1)
	minY, maxY := math.Inf(1), math.Inf(-1)
	for _, p := range pts {
		minX, maxX = math.Min(minX, float64(p.Size)), math.Max(maxX, float64(p.Size))
		minY, maxY = math.Min(minY, p.Min), math.Max(maxY, p.Max)
	}
	lx0, lx1 := math.Floor(math.Log2(minX)), math.Ceil(math.Log2(maxX))
	if lx1 == lx0 {
		lx1++
	}
	ly0, ly1 := math.Floor(math.Log10(minY)), math.Ceil(math.Log10(maxY))
	if ly1 == ly0 {
		ly1++
	}
	pw, ph := float64(panelW-marginL-marginR), float64(panelH-marginT-marginB)
	px := func(v float64) float64 { return float64(marginL) + (math.Log2(v)-lx0)/(lx1-lx0)*pw }
	py := func(v float64) float64 { return float64(marginT) + ph - (math.Log10(v)-ly0)/(ly1-ly0)*ph }
	// Frame, grid and ticks.
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#444"/>`+"\n", marginL, marginT, pw, ph)
	step := math.Max(1, math.Ceil((lx1-lx0)/8))
	for e := lx0; e <= lx1; e += step {
		x := px(math.Exp2(e))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.0f" stroke="#ddd"/>`+"\n", x, marginT, x, float64(marginT)+ph)
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x, float64(marginT)+ph+16, escape(shortSize(int(math.Exp2(e)))))
	}
	for e := ly0; e <= ly1; e++ {
		y := py(math.Pow(10, e))
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", marginL, y, float64(marginL)+pw, y)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginL-6, y+4, num(math.Pow(10, e)))
	}
	fmt.Fprintf(b, `<text x="%.0f" y="%d" text-anchor="middle">message size (bytes)</text>`+"\n", float64(marginL)+pw/2, panelH-8)
	// One line per series.
	ly := marginT + 14
	for _, se := range r.Series {
		var line []string
		color := seriesColors[se]
		if color == "" {
			// Other series take the rest of the palette in report order.
			others := slices.DeleteFunc(slices.Clone(r.Series), func(s string) bool { return seriesColors[s] != "" })
			color = extraColors[slices.Index(others, se)%len(extraColors)]
		}
		for _, p := range pts {
			if p.Series != se {
				continue
			}
			x := px(float64(p.Size))
			line = append(line, fmt.Sprintf("%.1f,%.1f", x, py(p.Median)))
			fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", x, py(p.Min), x, py(p.Max), color)
			fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x, py(p.Median), color)
		}
		if len(line) == 0 {
			continue
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", color, strings.Join(line, " "))
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>`+"\n", marginL+10, ly-4, marginL+30, ly-4, color)
		fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", marginL+36, ly, escape(se))
		ly += 16
	}
}

// shortSize labels an axis tick: 8, 1K, 64K, 1M.
func shortSize(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dK", n>>10)
	}
	return fmt.Sprint(n)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
