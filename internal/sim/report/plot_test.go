package report

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"

	"gonum.org/v1/plot/plotter"
)

// TestCoincidingCurvesStayDistinguishable: two strategies that route
// alike draw the same CDF; each of the bench contract's nine strategies has
// its own dash and marker pair, and the markers of identical curves fall on
// different points.
func TestCoincidingCurvesStayDistinguishable(t *testing.T) {
	const n = 9
	seen := map[string]int{}
	for i := 0; i < n; i++ {
		st := styleOf(i)
		key := fmt.Sprintf("%v/%T", st.dashes, st.glyph)
		if j, dup := seen[key]; dup {
			t.Errorf("strategies %d and %d share dashes and marker %s", j, i, key)
		}
		seen[key] = i
	}
	var curve plotter.XYs
	for k := 0; k < 500; k++ {
		curve = append(curve, plotter.XY{X: float64(k), Y: float64(k) / 500})
	}
	at := map[plotter.XY]int{}
	for i := 0; i < n; i++ {
		pts := markerPoints(curve, i, n)
		if len(pts) != markersPerCurve {
			t.Fatalf("strategy %d: %d markers", i, len(pts))
		}
		for _, p := range pts {
			if j, dup := at[p]; dup {
				t.Errorf("strategies %d and %d put a marker on the same point %v of identical curves", j, i, p)
			}
			at[p] = i
		}
	}
}

// TestBarLabelsClearTheCeiling: a value label never crosses the ceiling
// line, whether its bar is far below, just below or at the ceiling.
func TestBarLabelsClearTheCeiling(t *testing.T) {
	const ceiling, yMax = 0.6, 0.8
	gap := 0.012 * yMax
	for v := 0.0; v <= ceiling; v += 0.005 {
		y := barLabelY(v, ceiling, yMax)
		bottom, top := y, y+labelLift*yMax
		if bottom < ceiling+gap && top > ceiling-gap {
			t.Errorf("bar %.3f: label spans %.3f..%.3f, across the ceiling %.2f", v, bottom, top, ceiling)
		}
		if y < v {
			t.Errorf("bar %.3f: label at %.3f, inside its bar", v, y)
		}
	}
	if y := barLabelY(0.2, ceiling, yMax); y > 0.25 {
		t.Errorf("a bar far below the ceiling has its label moved to %.3f", y)
	}
}

// TestBarsTakeTheirLinesColours renders a report and reads the bars back
// from the PNG: left to right, each bar is its strategy's line colour.
func TestBarsTakeTheirLinesColours(t *testing.T) {
	r := &Report{Replicas: 3, CeilingHitRatio: 0.7}
	for i, hr := range []float64{0.5, 0.62, 0.55} {
		r.Results = append(r.Results, Result{Strategy: fmt.Sprintf("s%d", i), CacheHitRatio: hr,
			TTFTSamples: []time.Duration{time.Millisecond, time.Duration(i+2) * time.Millisecond}})
	}
	path := filepath.Join(t.TempDir(), "p.png")
	if err := r.WritePNG(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	b := img.Bounds()
	// A row through the lower part of every bar, in the right-hand panel.
	row := b.Min.Y + b.Dy()*3/4
	var runs []color.RGBA // each bar's colour, read at its middle (edges are anti-aliased)
	start := -1
	for x := b.Min.X + b.Dx()/2; x <= b.Max.X; x++ {
		colourful := false
		if x < b.Max.X {
			c := rgba(img, x, row)
			colourful = max(c.R, c.G, c.B)-min(c.R, c.G, c.B) > 60
		}
		switch {
		case colourful && start < 0:
			start = x
		case !colourful && start >= 0:
			runs = append(runs, rgba(img, (start+x)/2, row))
			start = -1
		}
	}
	if len(runs) != len(r.Results) {
		t.Fatalf("found %d coloured bars in row %d, want %d: %v", len(runs), row, len(r.Results), runs)
	}
	for i, got := range runs {
		want := color.RGBAModel.Convert(styleOf(i).color).(color.RGBA)
		if got != want {
			t.Errorf("bar %d is %v, its line is %v", i, got, want)
		}
	}
}

func rgba(img image.Image, x, y int) color.RGBA {
	return color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
}
