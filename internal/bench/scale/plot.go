package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// writePlot draws three panels against the mesh's size in nodes: resident
// memory a key, start time a key (with the bare pull's), and compose
// latency; flat lines in the first two are what growing with the mesh
// should look like.
func writePlot(file string, all []figures) error {
	line := func(y func(figures) float64) plotter.XYs {
		xys := make(plotter.XYs, len(all))
		for i, f := range all {
			xys[i] = plotter.XY{X: float64(f.nodes), Y: y(f)}
		}
		return xys
	}
	panel := func(title, unit string, series ...any) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "nodes (x 30 modules x 10 needs)"
		p.Y.Label.Text = unit
		p.Y.Min = 0
		p.X.Min = 0
		p.X.Max = float64(all[len(all)-1].nodes) * 1.08 // room for the last tick's label
		p.Legend.Top, p.Legend.Left = true, true
		p.Legend.XOffs = vg.Centimeter
		if err := plotutil.AddLinePoints(p, series...); err != nil {
			return nil, err
		}
		return p, nil
	}
	memory, err := panel("resident memory a key, above the empty process", "bytes a key",
		"RSS settled", line(func(f figures) float64 { return f.rssPerKey() }),
		"peak (VmHWM)", line(func(f figures) float64 { return float64(f.hwm-f.baselineRSS) / float64(f.keys) }))
	if err != nil {
		return err
	}
	start, err := panel("start to a correct answer, a key", "µs a key",
		"exec to a compose answer", line(func(f figures) float64 { return f.startPerKey() / 1e3 }),
		"exec to the copy whole", line(func(f figures) float64 { return f.wholePerKey() / 1e3 }),
		"bare JetStream pull", line(func(f figures) float64 { return float64(f.pull.Nanoseconds()) / float64(f.keys) / 1e3 }))
	if err != nil {
		return err
	}
	compose, err := panel("compose one node (30 x 10)", "ms",
		"p50", line(func(f figures) float64 { return float64(f.p50.Microseconds()) / 1e3 }),
		"p99", line(func(f figures) float64 { return float64(f.p99.Microseconds()) / 1e3 }))
	if err != nil {
		return err
	}
	width, height := 8*vg.Inch, 12*vg.Inch
	var c vg.CanvasWriterTo
	switch strings.ToLower(filepath.Ext(file)) {
	case ".svg":
		c = vgsvg.New(width, height)
	case ".png":
		c = vgimg.PngCanvas{Canvas: vgimg.New(width, height)}
	default:
		return fmt.Errorf("-plot %s: name an .svg or a .png", file)
	}
	plots := [][]*plot.Plot{{memory}, {start}, {compose}}
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter, PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter}
	cells := plot.Align(plots, tiles, draw.New(c))
	for i := range plots {
		plots[i][0].Draw(cells[i][0])
	}
	out, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(out); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}
