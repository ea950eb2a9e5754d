package report

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// palette is Tableau's 10 categorical colours: distinct for the nine
// strategies of the bench contract.
var palette = []color.Color{
	color.RGBA{31, 119, 180, 255}, color.RGBA{255, 127, 14, 255}, color.RGBA{44, 160, 44, 255},
	color.RGBA{214, 39, 40, 255}, color.RGBA{148, 103, 189, 255}, color.RGBA{140, 86, 75, 255},
	color.RGBA{227, 119, 194, 255}, color.RGBA{127, 127, 127, 255}, color.RGBA{188, 189, 34, 255},
	color.RGBA{23, 190, 207, 255},
}

// highlighted is drawn thicker: kvroute's default profile.
const highlighted = "kv_cache_aware"

// seriesStyle is how strategy i of a report is drawn, in both panels: its
// colour (line and bar), dash pattern and marker shape. Strategies often
// coincide (two that route alike draw the same curve), so a colour alone
// would hide one under the other; the dash and the marker, placed at
// different points for each strategy, keep every one visible.
type seriesStyle struct {
	color  color.Color
	dashes []vg.Length
	glyph  draw.GlyphDrawer
}

func styleOf(i int) seriesStyle {
	return seriesStyle{color: palette[i%len(palette)], dashes: plotutil.Dashes(i), glyph: plotutil.Shape(i)}
}

// markersPerCurve is how many markers each CDF curve carries.
const markersPerCurve = 6

// markerPoints places markersPerCurve markers evenly along a CDF curve as
// drawn (log time, fraction), staggered by i/n of the spacing for strategy
// i of n: curves that coincide, on a rise or on a plateau, carry their
// markers at different places, so each stays identifiable.
func markerPoints(pts plotter.XYs, i, n int) plotter.XYs {
	if len(pts) == 0 || n <= 0 {
		return nil
	}
	lx := func(p plotter.XY) float64 { return math.Log10(max(p.X, 1e-9)) }
	span := max(lx(pts[len(pts)-1])-lx(pts[0]), 1e-9)
	// Cumulative drawn length, with log time scaled to the fraction's 0..1.
	cum := make([]float64, len(pts))
	for k := 1; k < len(pts); k++ {
		dx, dy := (lx(pts[k])-lx(pts[k-1]))/span, pts[k].Y-pts[k-1].Y
		cum[k] = cum[k-1] + math.Hypot(dx, dy)
	}
	total := cum[len(cum)-1]
	var out plotter.XYs
	for m := 0; m < markersPerCurve; m++ {
		at := total * (float64(m) + (float64(i)+0.5)/float64(n)) / markersPerCurve
		k := sort.SearchFloat64s(cum, at)
		switch {
		case total == 0 || k == 0:
			out = append(out, pts[0])
		case k >= len(pts):
			out = append(out, pts[len(pts)-1])
		default:
			f := (at - cum[k-1]) / (cum[k] - cum[k-1])
			x := math.Pow(10, lx(pts[k-1])+f*(lx(pts[k])-lx(pts[k-1])))
			out = append(out, plotter.XY{X: x, Y: pts[k-1].Y + f*(pts[k].Y-pts[k-1].Y)})
		}
	}
	return out
}

// labelLift is the height of a bar's value label, as a fraction of the
// axis range: where the label would cross the ceiling line it goes above it.
const labelLift = 0.05

// barLabelY returns where the value label of a bar of height v goes: just
// above the bar, or just above the ceiling line when the label would
// otherwise touch it (bars at or near the ceiling are the interesting ones).
func barLabelY(v, ceiling, yMax float64) float64 {
	gap := 0.012 * yMax
	y := v + gap
	if ceiling > 0 && y < ceiling+gap && y+labelLift*yMax > ceiling-gap {
		y = ceiling + gap
	}
	return y
}

// WritePNG draws two panels side by side: the TTFT CDF of every strategy
// (log-scaled time axis, since cache hits move the body of the distribution
// by orders of magnitude) and the cache hit ratio per strategy with the
// fleet's ceiling as a dashed line. A strategy has the same colour in both.
func (r *Report) WritePNG(path string) error {
	cdf := plot.New()
	cdf.Title.Text = fmt.Sprintf("TTFT CDF (%d replicas)", r.Replicas)
	cdf.X.Label.Text = "time to first token (ms, log scale)"
	cdf.Y.Label.Text = "fraction of requests"
	cdf.X.Scale = plot.LogScale{}
	cdf.X.Tick.Marker = plot.LogTicks{Prec: -1}
	cdf.Y.Min, cdf.Y.Max = 0, 1
	cdf.Legend.Top = false
	cdf.Legend.Left = false
	cdf.Add(plotter.NewGrid())
	// The highlighted strategy is drawn first, so the thinner curves that
	// coincide with it stay visible on top.
	order := make([]int, 0, len(r.Results))
	for i, x := range r.Results {
		if x.Strategy == highlighted {
			order = append([]int{i}, order...)
		} else {
			order = append(order, i)
		}
	}
	legend := make([][]plot.Thumbnailer, len(r.Results))
	for _, i := range order {
		x := r.Results[i]
		ms := sortedMs(x.TTFTSamples)
		if len(ms) == 0 {
			continue
		}
		// At most ~500 points per curve keeps the PNG light.
		stride := max(1, len(ms)/500)
		var pts plotter.XYs
		for k := 0; k < len(ms); k += stride {
			pts = append(pts, plotter.XY{X: max(ms[k], 0.01), Y: float64(k+1) / float64(len(ms))})
		}
		pts = append(pts, plotter.XY{X: max(ms[len(ms)-1], 0.01), Y: 1})
		st := styleOf(i)
		line, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("plot %s: %w", x.Strategy, err)
		}
		line.Color = st.color
		line.Dashes = st.dashes
		line.Width = vg.Points(1.5)
		if x.Strategy == highlighted {
			line.Width = vg.Points(3)
		}
		marks, err := plotter.NewScatter(markerPoints(pts, i, len(r.Results)))
		if err != nil {
			return fmt.Errorf("plot %s: %w", x.Strategy, err)
		}
		marks.Shape = st.glyph
		marks.Color = st.color
		marks.Radius = vg.Points(3.5)
		cdf.Add(line, marks)
		legend[i] = []plot.Thumbnailer{line, marks}
	}
	for i, th := range legend { // in the report's order, whatever the drawing order
		if th != nil {
			cdf.Legend.Add(r.Results[i].Strategy, th...)
		}
	}

	bars := plot.New()
	bars.Title.Text = "cache hit ratio (cached / input tokens)"
	bars.Y.Label.Text = "hit ratio"
	names := make([]string, len(r.Results))
	top := r.CeilingHitRatio
	for i, x := range r.Results {
		names[i] = x.Strategy
		top = max(top, x.CacheHitRatio)
	}
	// Room above the tallest bar and the ceiling for labels and legend.
	bars.Y.Min, bars.Y.Max = 0, min(1.1, max(top*1.25+0.02, r.CeilingHitRatio+0.12))
	var xys plotter.XYs
	var labels []string
	for i, x := range r.Results {
		// One chart per bar: each takes its strategy's colour from the CDF.
		bc, err := plotter.NewBarChart(plotter.Values{x.CacheHitRatio}, vg.Points(18))
		if err != nil {
			return fmt.Errorf("plot hit ratios: %w", err)
		}
		bc.XMin = float64(i)
		bc.Color = styleOf(i).color
		bc.LineStyle.Width = 0
		bars.Add(bc)
		// Each bar carries its value, so the chart reads without a ruler.
		xys = append(xys, plotter.XY{X: float64(i), Y: barLabelY(x.CacheHitRatio, r.CeilingHitRatio, bars.Y.Max)})
		labels = append(labels, fmt.Sprintf("%.1f%%", 100*x.CacheHitRatio))
	}
	if len(xys) > 0 {
		if lb, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels}); err == nil {
			for i := range lb.TextStyle {
				lb.TextStyle[i].XAlign = draw.XCenter
				lb.TextStyle[i].YAlign = draw.YBottom // the text rises from barLabelY
			}
			bars.Add(lb)
		}
		bars.NominalX(names...)
		bars.X.Tick.Label.Rotation = 0.6
		bars.X.Tick.Label.XAlign = draw.XRight
		bars.X.Tick.Label.YAlign = draw.YCenter
	}
	if r.CeilingHitRatio > 0 {
		ceil, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: r.CeilingHitRatio}, {X: float64(len(r.Results)) - 0.5, Y: r.CeilingHitRatio}})
		if err == nil {
			ceil.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			ceil.Color = color.Black
			bars.Add(ceil)
			bars.Legend.Add(fmt.Sprintf("ceiling %.1f%%", 100*r.CeilingHitRatio), ceil)
			bars.Legend.Top = true
		}
	}

	img := vgimg.New(vg.Points(1100), vg.Points(460))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(16), PadY: vg.Points(8), PadTop: vg.Points(8), PadBottom: vg.Points(8), PadLeft: vg.Points(8), PadRight: vg.Points(8)}
	canvases := plot.Align([][]*plot.Plot{{cdf, bars}}, tiles, dc)
	cdf.Draw(canvases[0][0])
	bars.Draw(canvases[0][1])

	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write plot: %w", err)
	}
	return f.Close()
}
