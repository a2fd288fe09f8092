package main

import (
	"fmt"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// writePlot draws two panels side by side: loss per epoch (train and test)
// and accuracy per epoch (train and test), as a PNG.
func writePlot(path string, hist []EpochResult) error {
	series := func(f func(EpochResult) float64) plotter.XYs {
		xy := make(plotter.XYs, len(hist))
		for i, h := range hist {
			xy[i] = plotter.XY{X: float64(h.Epoch), Y: f(h)}
		}
		return xy
	}
	loss := plot.New()
	run := fmt.Sprintf("%d rank(s), global batch %d, compression %s", hist[0].Ranks, hist[0].GlobalBatch, hist[0].Compression)
	loss.Title.Text = "Loss (cross-entropy): " + run
	loss.X.Label.Text, loss.Y.Label.Text = "epoch", "loss"
	if err := plotutil.AddLinePoints(loss,
		"train", series(func(h EpochResult) float64 { return h.Loss }),
		"test", series(func(h EpochResult) float64 { return h.TestLoss })); err != nil {
		return err
	}
	acc := plot.New()
	acc.Title.Text = "Accuracy: " + run
	acc.X.Label.Text, acc.Y.Label.Text = "epoch", "accuracy (%)"
	if err := plotutil.AddLinePoints(acc,
		"train", series(func(h EpochResult) float64 { return 100 * h.TrainAcc }),
		"test", series(func(h EpochResult) float64 { return 100 * h.TestAcc })); err != nil {
		return err
	}
	for _, p := range []*plot.Plot{loss, acc} {
		p.Legend.Top = true
		p.Add(plotter.NewGrid())
	}
	loss.Legend.Left = false
	acc.Legend.Left = false
	acc.Legend.Top = false // accuracy rises: legend at the bottom right

	img := vgimg.New(vg.Points(900), vg.Points(360))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Points(20), PadTop: vg.Points(10), PadBottom: vg.Points(10), PadLeft: vg.Points(10), PadRight: vg.Points(10)}
	canvases := plot.Align([][]*plot.Plot{{loss, acc}}, tiles, dc)
	loss.Draw(canvases[0][0])
	acc.Draw(canvases[0][1])

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}
