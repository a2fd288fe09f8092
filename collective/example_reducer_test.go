package collective_test

import (
	"context"
	"fmt"
	"log"

	"gorgonia.org/tensor"

	"github.com/gorun/gorun/collective"
)

// A training loop with a Reducer: register parameters and gradients once
// (in the order backward produces them), broadcast the initial parameters,
// then per step run k micro-batches, handing each gradient over as soon as
// backward has computed it, and apply the averaged gradients after Step.
// Run under `gorun -np 4` the same code averages across the 4 ranks; the
// global batch of 32 then gives k = 32/(4·4) = 2 micro-batches per step.
func ExampleReducer() {
	ctx := context.Background()
	comm, err := collective.Init(ctx) // one rank when run alone
	if err != nil {
		log.Fatal(err)
	}
	defer comm.Close()

	// A tiny linear model y = w·x + b fitted to y = 2x + 1.
	w := tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{0}))
	dw := tensor.New(tensor.WithShape(1), tensor.Of(tensor.Float32))
	b, db := []float32{0}, []float32{0}

	red, err := collective.NewReducer(comm, collective.ReducerOptions{GlobalBatch: 32, LocalBatch: 4})
	if err != nil {
		log.Fatal(err) // e.g. the global batch does not divide at this world size
	}
	// Backward computes db before dw here, so register b first.
	if err := red.Register("b", b, db); err != nil {
		log.Fatal(err)
	}
	if err := red.Register("w", w, dw); err != nil {
		log.Fatal(err)
	}
	if err := red.BroadcastParameters(ctx, 0); err != nil {
		log.Fatal(err)
	}
	k := red.BackwardPassesPerStep()
	sample := 0
	for step := range 200 {
		for range k {
			// Forward and backward on this rank's micro-batch.
			var gw, gb float32
			for range 4 { // local batch of 4 samples
				x := float32((sample*comm.Size()+comm.Rank())%7) / 7 // this rank's share of the data
				sample++
				e := w.Data().([]float32)[0]*x + b[0] - (2*x + 1)
				gw += e * x
				gb += e
			}
			db[0] = gb / 4
			if err := red.GradReady(ctx, "b"); err != nil { // starts its allreduce on the k-th pass
				log.Fatal(err)
			}
			dw.Data().([]float32)[0] = gw / 4
			if err := red.GradReady(ctx, "w"); err != nil {
				log.Fatal(err)
			}
		}
		if err := red.Step(ctx); err != nil { // gradients now averaged over ranks and micro-batches
			log.Fatal(err)
		}
		w.Data().([]float32)[0] -= 0.5 * dw.Data().([]float32)[0]
		b[0] -= 0.5 * db[0]
		if step%100 == 99 {
			if err := red.CheckConsistency(ctx); err != nil {
				log.Fatal(err) // replicas diverged: names the ranks and the tensor
			}
		}
	}
	fmt.Printf("k=%d w=%.2f b=%.2f\n", k, w.Data().([]float32)[0], b[0])
	// Output: k=8 w=2.00 b=1.00
}
