package benchreport

import (
	"fmt"
	"image/color"
	"os"

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

// WritePNG draws two panels side by side: the TTFT CDF of every strategy
// (log-scaled time axis, since cache hits move the body of the distribution
// by orders of magnitude) and the cache hit ratio per strategy with the
// fleet's ceiling as a dashed line.
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
	for i, x := range r.Results {
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
		line, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("plot %s: %w", x.Strategy, err)
		}
		line.Color = palette[i%len(palette)]
		line.Dashes = plotutil.Dashes(i / len(palette))
		line.Width = vg.Points(1.5)
		if x.Strategy == highlighted {
			line.Width = vg.Points(3)
		}
		cdf.Add(line)
		cdf.Legend.Add(x.Strategy, line)
	}

	bars := plot.New()
	bars.Title.Text = "cache hit ratio (cached / input tokens)"
	bars.Y.Label.Text = "hit ratio"
	vals := make(plotter.Values, len(r.Results))
	names := make([]string, len(r.Results))
	top := r.CeilingHitRatio
	for i, x := range r.Results {
		vals[i] = x.CacheHitRatio
		names[i] = x.Strategy
		top = max(top, x.CacheHitRatio)
	}
	// Room above the tallest bar (or the ceiling) for labels and legend.
	bars.Y.Min, bars.Y.Max = 0, min(1, top*1.25+0.02)
	if len(vals) > 0 {
		bc, err := plotter.NewBarChart(vals, vg.Points(18))
		if err != nil {
			return fmt.Errorf("plot hit ratios: %w", err)
		}
		bc.Color = color.RGBA{R: 66, G: 133, B: 244, A: 255}
		bc.LineStyle.Width = 0
		bars.Add(bc)
		// Each bar carries its value, so the chart reads without a ruler.
		var xys plotter.XYs
		var labels []string
		for i, v := range vals {
			xys = append(xys, plotter.XY{X: float64(i), Y: v + 0.01*bars.Y.Max})
			labels = append(labels, fmt.Sprintf("%.1f%%", 100*v))
		}
		if lb, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels}); err == nil {
			for i := range lb.TextStyle {
				lb.TextStyle[i].XAlign = draw.XCenter
			}
			bars.Add(lb)
		}
		bars.NominalX(names...)
		bars.X.Tick.Label.Rotation = 0.6
		bars.X.Tick.Label.XAlign = draw.XRight
		bars.X.Tick.Label.YAlign = draw.YCenter
	}
	if r.CeilingHitRatio > 0 {
		ceil, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: r.CeilingHitRatio}, {X: float64(len(vals)) - 0.5, Y: r.CeilingHitRatio}})
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
