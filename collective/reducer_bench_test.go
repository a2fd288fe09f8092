package collective

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkFusion: 200 gradients of 4 KiB at np=4 (ranks in this process,
// real transport), per optimizer step: fused into one buffer by a Reducer,
// versus one collective per gradient (synchronous Allreduce per tensor, and
// a Reducer with fusion off, whose 200 allreduces are queued async).
//
//	go test -run '^$' -bench Fusion -benchtime 20x ./collective/
func BenchmarkFusion(b *testing.B) {
	const n, tensors, floats = 4, 200, 1024
	ctx := context.Background()
	comms := newJob(b, n, WithLogger(func(string, ...any) {}))
	grads := make([][][]float32, n)
	for r := range grads {
		grads[r] = make([][]float32, tensors)
		for i := range grads[r] {
			grads[r][i] = make([]float32, floats)
		}
	}
	run := func(b *testing.B, f func(c *Comm) error) {
		b.SetBytes(tensors * floats * 4)
		b.ResetTimer()
		for range b.N {
			for _, err := range onEach(comms, f) {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	for _, fusion := range []int{0, -1} {
		name := "fused"
		if fusion < 0 {
			name = "unfused-async"
		}
		b.Run(name, func(b *testing.B) {
			reds := make([]*Reducer, n)
			for r := range reds {
				reds[r], _ = NewReducer(comms[r], ReducerOptions{FusionThreshold: fusion})
				for i, g := range grads[r] {
					reds[r].Register(fmt.Sprint("g", i), nil, g)
				}
			}
			for _, err := range onEach(comms, func(c *Comm) error { return reds[c.Rank()].Seal(ctx) }) {
				if err != nil {
					b.Fatal(err)
				}
			}
			run(b, func(c *Comm) error {
				red := reds[c.Rank()]
				if err := red.Backward(ctx); err != nil {
					return err
				}
				return red.Step(ctx)
			})
		})
	}
	b.Run("unfused-sync", func(b *testing.B) {
		run(b, func(c *Comm) error {
			for _, g := range grads[c.Rank()] {
				if err := c.Allreduce(ctx, g, Avg); err != nil {
					return err
				}
			}
			return nil
		})
	})
}

// BenchmarkOverlap: a synthetic backward of 8 layers taking 2 ms each
// (sleep: it stands for compute), 1 MiB of gradient per layer, np=2. With
// overlap each layer's gradient is handed over as backward produces it and
// its bucket's allreduce runs while the next layers compute; sequential
// hands everything over after backward, then reduces.
//
//	go test -run '^$' -bench Overlap -benchtime 20x ./collective/
func BenchmarkOverlap(b *testing.B) {
	const n, layers, floats = 2, 8, 256 << 10
	const layerTime = 2 * time.Millisecond
	ctx := context.Background()
	comms := newJob(b, n, WithLogger(func(string, ...any) {}))
	for _, overlap := range []bool{false, true} {
		name := "sequential"
		if overlap {
			name = "overlap"
		}
		b.Run(name, func(b *testing.B) {
			reds := make([]*Reducer, n)
			for r := range reds {
				reds[r], _ = NewReducer(comms[r], ReducerOptions{FusionThreshold: floats * 4})
				for l := range layers {
					reds[r].Register(fmt.Sprint("layer", layers-1-l), nil, make([]float32, floats))
				}
			}
			b.SetBytes(layers * floats * 4)
			b.ResetTimer()
			for range b.N {
				errs := onEach(comms, func(c *Comm) error {
					red := reds[c.Rank()]
					for l := layers - 1; l >= 0; l-- {
						time.Sleep(layerTime) // the layer's backward compute
						if overlap {
							if err := red.GradReady(ctx, fmt.Sprint("layer", l)); err != nil {
								return err
							}
						}
					}
					if !overlap {
						if err := red.Backward(ctx); err != nil {
							return err
						}
					}
					return red.Step(ctx)
				})
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1e3, "ms/step")
		})
	}
}
